! The Fortran module `zerotrain`: zerotrain's C API (include/zerotrain/zerotrain.h) through
! iso_c_binding, with Fortran's types. Reference: docs/c-fortran.md.
!
! Every procedure is a function returning an integer(c_int) status (ZT_STATUS_OK = 0); on failure
! zt_last_error() says what went wrong. Handles are derived types around the C pointers.
!
! Column-major: a Fortran array a(n1, n2, ...) is registered as the row-major shape [..., n2, n1]
! of the same memory, without a copy, so a(i, j) is element [j][i] of zerotrain's view: the shapes
! zerotrain reports (checkpoints, exports) are the Fortran shapes reversed, and a Fortran
! w(inputs, hidden) is the same memory as a C w[hidden][inputs]. Registered arrays must be
! contiguous (checked) and should have the TARGET (or POINTER) attribute, since the engine keeps
! their addresses.
module zerotrain
  use, intrinsic :: iso_c_binding
  use mpi_f08, only: MPI_Comm
  implicit none
  private

  ! ---- version, status codes, dtypes, devices (the values of zerotrain.h) ------------------
  !> The C API version this module was written for (ZT_API_VERSION of zerotrain.h; Fortran names are
  !> not case-sensitive, so the parameter cannot be called zt_api_version like the function).
  integer(c_int), parameter, public :: ZT_MODULE_API_VERSION_MAJOR = 1, ZT_MODULE_API_VERSION_MINOR = 1
  integer(c_int), parameter, public :: ZT_MODULE_API_VERSION = ZT_MODULE_API_VERSION_MAJOR * 1000 + &
                                                               ZT_MODULE_API_VERSION_MINOR
  integer(c_int), parameter, public :: ZT_STATUS_OK = 0, ZT_STATUS_INVALID_ARGUMENT = 1, &
                                       ZT_STATUS_CONFIG_ERROR = 2, ZT_STATUS_COMM_ERROR = 3, &
                                       ZT_STATUS_IO_ERROR = 4, ZT_STATUS_CUDA_ERROR = 5, ZT_STATUS_ERROR = 6, &
                                       ZT_STATUS_OUT_OF_MEMORY = 7, ZT_STATUS_INTERNAL_ERROR = 8
  integer(c_int), parameter, public :: ZT_DTYPE_FP32 = 0, ZT_DTYPE_FP64 = 1, ZT_DTYPE_BF16 = 2, &
                                       ZT_DTYPE_FP16 = 3, ZT_DTYPE_INT32 = 4, ZT_DTYPE_INT64 = 5
  integer(c_int), parameter, public :: ZT_DEVICE_HOST = 0, ZT_DEVICE_CUDA = 1
  integer, parameter, public :: ZT_MAX_DIMS = 8

  ! ---- handles ---------------------------------------------------------------------------
  type, public :: zt_runtime
    type(c_ptr) :: handle = c_null_ptr
  end type zt_runtime
  type, public :: zt_config
    type(c_ptr) :: handle = c_null_ptr
  end type zt_config
  type, public :: zt_model
    type(c_ptr) :: handle = c_null_ptr
  end type zt_model
  type, public :: zt_engine
    type(c_ptr) :: handle = c_null_ptr
  end type zt_engine
  type, public :: zt_metrics
    type(c_ptr) :: handle = c_null_ptr
  end type zt_metrics

  ! ---- structs of zerotrain.h ------------------------------------------------------------
  !> An array described for the engine (zt_tensor_of makes one; shape row-major, i.e. reversed).
  type, bind(C), public :: zt_tensor
    type(c_ptr) :: data = c_null_ptr
    integer(c_int) :: dtype = 0
    integer(c_int32_t) :: ndim = 0
    integer(c_int64_t) :: shape(ZT_MAX_DIMS) = 0
  end type zt_tensor

  type, bind(C), public :: zt_batch_sizes
    integer(c_int64_t) :: train_batch_size, micro_batch_size, gradient_accumulation_steps
    integer(c_int32_t) :: data_parallel_size, data_parallel_rank
  end type zt_batch_sizes

  type, bind(C), public :: zt_step_report
    integer(c_int64_t) :: step
    real(c_double) :: loss, grad_norm, lr, loss_scale
    integer(c_int32_t) :: skipped, reserved0
    integer(c_int64_t) :: comm_bytes  ! uint64_t in C
    real(c_double) :: comm_wait_seconds
    real(c_double) :: reserved(4)
  end type zt_step_report

  public :: zt_api_version, zt_version, zt_last_error, zt_status_name
  public :: zt_runtime_create, zt_runtime_create_from_comm, zt_runtime_destroy, zt_runtime_rank, zt_runtime_size
  public :: zt_config_from_file, zt_config_from_string, zt_config_destroy
  public :: zt_model_create_external, zt_model_add_parameter, zt_model_add_parameter_ptr, zt_model_report_loss, &
            zt_model_create_builtin, zt_model_parameter_count, zt_model_destroy
  public :: zt_engine_create, zt_engine_destroy, zt_engine_step, zt_engine_forward_backward, zt_engine_train_batch, &
            zt_engine_last_step, zt_engine_batch_sizes, zt_engine_global_steps, zt_engine_zero_stage, &
            zt_engine_placement, &
            zt_engine_save_checkpoint, zt_engine_load_checkpoint, zt_engine_loaded_client_state
  public :: zt_checkpoint_export, zt_checkpoint_verify, zt_checkpoint_client_state
  public :: zt_metrics_open, zt_metrics_record_step, zt_metrics_record, zt_metrics_close
  public :: zt_tensor_of

  !> Runtime over a communicator: type(MPI_Comm) (mpi_f08) or an integer handle (mpi, mpif.h).
  interface zt_runtime_create_from_comm
    module procedure runtime_from_comm_f08, runtime_from_comm_integer
  end interface zt_runtime_create_from_comm

  !> Register real(c_float) arrays of rank 1 to 4 (values and gradients of the same shape).
  interface zt_model_add_parameter
    module procedure add_parameter_1, add_parameter_2, add_parameter_3, add_parameter_4
  end interface zt_model_add_parameter

  !> Describe a contiguous real(c_float) or integer(c_int32_t) array of rank 1 or 2 (built-in
  !> models' batches: an MLP's x(inputs, batch) is [batch, inputs]; a GPT's tokens(seq, batch) [batch, seq]).
  interface zt_tensor_of
    module procedure tensor_of_real_1, tensor_of_real_2, tensor_of_int_1, tensor_of_int_2
  end interface zt_tensor_of

  !> The C calls that return text (zerotrain.h, zt_engine_placement): at most `capacity` bytes into
  !> `text`, NUL included, the whole length into `length`; `subject` is the engine's handle, or the
  !> C string of a checkpoint file's path.
  abstract interface
    integer(c_int) function c_text_call(subject, text, capacity, length) bind(C)
      import :: c_int, c_ptr, c_size_t
      type(c_ptr), value :: subject, text
      integer(c_size_t), value :: capacity
      integer(c_size_t) :: length
    end function
  end interface
  procedure(c_text_call), bind(C, name="zt_engine_placement") :: c_zt_engine_placement
  procedure(c_text_call), bind(C, name="zt_engine_loaded_client_state") :: c_zt_engine_loaded_client_state
  procedure(c_text_call), bind(C, name="zt_checkpoint_client_state") :: c_zt_checkpoint_client_state

  ! ---- the C functions -------------------------------------------------------------------
  interface
    integer(c_int) function c_zt_api_version() bind(C, name="zt_api_version")
      import :: c_int
    end function
    type(c_ptr) function c_zt_version() bind(C, name="zt_version")
      import :: c_ptr
    end function
    type(c_ptr) function c_zt_last_error() bind(C, name="zt_last_error")
      import :: c_ptr
    end function
    type(c_ptr) function c_zt_status_name(status) bind(C, name="zt_status_name")
      import :: c_ptr, c_int
      integer(c_int), value :: status
    end function
    integer(c_int) function c_zt_set_last_error(status, message) bind(C, name="zt_set_last_error")
      import :: c_int, c_char
      integer(c_int), value :: status
      character(kind=c_char) :: message(*)
    end function
    integer(c_size_t) function c_strlen(text) bind(C, name="strlen")
      import :: c_size_t, c_ptr
      type(c_ptr), value :: text
    end function

    integer(c_int) function c_zt_runtime_create(argc, argv, runtime) bind(C, name="zt_runtime_create")
      import :: c_int, c_ptr
      type(c_ptr), value :: argc, argv
      type(c_ptr) :: runtime
    end function
    integer(c_int) function c_zt_runtime_create_from_fortran_comm(comm, runtime) &
        bind(C, name="zt_runtime_create_from_fortran_comm")
      import :: c_int, c_ptr
      integer(c_int), value :: comm
      type(c_ptr) :: runtime
    end function
    integer(c_int) function c_zt_runtime_destroy(runtime) bind(C, name="zt_runtime_destroy")
      import :: c_int, c_ptr
      type(c_ptr), value :: runtime
    end function
    integer(c_int) function c_zt_runtime_rank(runtime, rank) bind(C, name="zt_runtime_rank")
      import :: c_int, c_ptr
      type(c_ptr), value :: runtime
      integer(c_int) :: rank
    end function
    integer(c_int) function c_zt_runtime_size(runtime, size) bind(C, name="zt_runtime_size")
      import :: c_int, c_ptr
      type(c_ptr), value :: runtime
      integer(c_int) :: size
    end function

    integer(c_int) function c_zt_config_from_file(path, config) bind(C, name="zt_config_from_file")
      import :: c_int, c_ptr, c_char
      character(kind=c_char) :: path(*)
      type(c_ptr) :: config
    end function
    integer(c_int) function c_zt_config_from_string(json, config) bind(C, name="zt_config_from_string")
      import :: c_int, c_ptr, c_char
      character(kind=c_char) :: json(*)
      type(c_ptr) :: config
    end function
    integer(c_int) function c_zt_config_destroy(config) bind(C, name="zt_config_destroy")
      import :: c_int, c_ptr
      type(c_ptr), value :: config
    end function

    integer(c_int) function c_zt_model_create_external(model) bind(C, name="zt_model_create_external")
      import :: c_int, c_ptr
      type(c_ptr) :: model
    end function
    integer(c_int) function c_zt_model_add_parameter(model, name, values, gradients, ndim, shape, dtype, device, &
                                                     device_index) bind(C, name="zt_model_add_parameter")
      import :: c_int, c_ptr, c_char, c_int32_t, c_int64_t
      type(c_ptr), value :: model
      character(kind=c_char) :: name(*)
      type(c_ptr), value :: values, gradients
      integer(c_int32_t), value :: ndim
      integer(c_int64_t) :: shape(*)
      integer(c_int), value :: dtype, device
      integer(c_int32_t), value :: device_index
    end function
    integer(c_int) function c_zt_model_report_loss(model, loss) bind(C, name="zt_model_report_loss")
      import :: c_int, c_ptr, c_double
      type(c_ptr), value :: model
      real(c_double), value :: loss
    end function
    integer(c_int) function c_zt_model_create_builtin(config, model) bind(C, name="zt_model_create_builtin")
      import :: c_int, c_ptr
      type(c_ptr), value :: config
      type(c_ptr) :: model
    end function
    integer(c_int) function c_zt_model_parameter_count(model, tensors, elements) &
        bind(C, name="zt_model_parameter_count")
      import :: c_int, c_ptr, c_int64_t
      type(c_ptr), value :: model
      integer(c_int64_t) :: tensors, elements
    end function
    integer(c_int) function c_zt_model_destroy(model) bind(C, name="zt_model_destroy")
      import :: c_int, c_ptr
      type(c_ptr), value :: model
    end function

    integer(c_int) function c_zt_engine_create(runtime, model, config, engine) bind(C, name="zt_engine_create")
      import :: c_int, c_ptr
      type(c_ptr), value :: runtime, model, config
      type(c_ptr) :: engine
    end function
    integer(c_int) function c_zt_engine_destroy(engine) bind(C, name="zt_engine_destroy")
      import :: c_int, c_ptr
      type(c_ptr), value :: engine
    end function
    integer(c_int) function c_zt_engine_step(engine, boundary) bind(C, name="zt_engine_step")
      import :: c_int, c_ptr
      type(c_ptr), value :: engine
      integer(c_int) :: boundary
    end function
    integer(c_int) function c_zt_engine_forward_backward(engine, inputs, targets, loss) &
        bind(C, name="zt_engine_forward_backward")
      import :: c_int, c_ptr, c_double, zt_tensor
      type(c_ptr), value :: engine
      type(zt_tensor) :: inputs, targets
      real(c_double) :: loss
    end function
    integer(c_int) function c_zt_engine_train_batch(engine, micro_batches, inputs, targets, report) &
        bind(C, name="zt_engine_train_batch")
      import :: c_int, c_ptr, c_int64_t, zt_tensor, zt_step_report
      type(c_ptr), value :: engine
      integer(c_int64_t), value :: micro_batches
      type(zt_tensor) :: inputs(*), targets(*)
      type(zt_step_report) :: report
    end function
    integer(c_int) function c_zt_engine_last_step(engine, report) bind(C, name="zt_engine_last_step")
      import :: c_int, c_ptr, zt_step_report
      type(c_ptr), value :: engine
      type(zt_step_report) :: report
    end function
    integer(c_int) function c_zt_engine_batch_sizes(engine, sizes) bind(C, name="zt_engine_batch_sizes")
      import :: c_int, c_ptr, zt_batch_sizes
      type(c_ptr), value :: engine
      type(zt_batch_sizes) :: sizes
    end function
    integer(c_int) function c_zt_engine_global_steps(engine, steps) bind(C, name="zt_engine_global_steps")
      import :: c_int, c_ptr, c_int64_t
      type(c_ptr), value :: engine
      integer(c_int64_t) :: steps
    end function
    integer(c_int) function c_zt_engine_zero_stage(engine, stage) bind(C, name="zt_engine_zero_stage")
      import :: c_int, c_ptr
      type(c_ptr), value :: engine
      integer(c_int) :: stage
    end function
    integer(c_int) function c_zt_engine_save_checkpoint(engine, dir, tag, client_state, keep_last) &
        bind(C, name="zt_engine_save_checkpoint")
      import :: c_int, c_ptr, c_char, c_int64_t
      type(c_ptr), value :: engine
      character(kind=c_char) :: dir(*)
      type(c_ptr), value :: tag, client_state
      integer(c_int64_t), value :: keep_last
    end function
    integer(c_int) function c_zt_engine_load_checkpoint(engine, dir, tag) bind(C, name="zt_engine_load_checkpoint")
      import :: c_int, c_ptr, c_char
      type(c_ptr), value :: engine
      character(kind=c_char) :: dir(*)
      type(c_ptr), value :: tag
    end function

    integer(c_int) function c_zt_checkpoint_export(path, out, dtype) bind(C, name="zt_checkpoint_export")
      import :: c_int, c_char
      character(kind=c_char) :: path(*), out(*)
      integer(c_int), value :: dtype
    end function
    integer(c_int) function c_zt_checkpoint_verify(path) bind(C, name="zt_checkpoint_verify")
      import :: c_int, c_char
      character(kind=c_char) :: path(*)
    end function

    integer(c_int) function c_zt_metrics_open(runtime, path, metrics) bind(C, name="zt_metrics_open")
      import :: c_int, c_ptr, c_char
      type(c_ptr), value :: runtime
      character(kind=c_char) :: path(*)
      type(c_ptr) :: metrics
    end function
    integer(c_int) function c_zt_metrics_record_step(metrics, engine, extra_json) &
        bind(C, name="zt_metrics_record_step")
      import :: c_int, c_ptr
      type(c_ptr), value :: metrics, engine, extra_json
    end function
    integer(c_int) function c_zt_metrics_record(metrics, event, json) bind(C, name="zt_metrics_record")
      import :: c_int, c_ptr, c_char
      type(c_ptr), value :: metrics
      character(kind=c_char) :: event(*)
      type(c_ptr), value :: json
    end function
    integer(c_int) function c_zt_metrics_close(metrics) bind(C, name="zt_metrics_close")
      import :: c_int, c_ptr
      type(c_ptr), value :: metrics
    end function
  end interface

contains

  ! ---- strings -----------------------------------------------------------------------------

  !> `text` as a NUL-terminated C string (trailing blanks kept: trim() yourself if needed).
  pure function c_string(text) result(converted)
    character(len=*), intent(in) :: text
    character(kind=c_char, len=len(text) + 1) :: converted
    converted = text // c_null_char
  end function c_string

  !> A copy of the NUL-terminated C string at `pointer` ("" for NULL).
  function f_string(pointer) result(text)
    type(c_ptr), intent(in) :: pointer
    character(len=:), allocatable :: text
    character(kind=c_char), pointer :: chars(:)
    integer(c_size_t) :: length, i
    if (.not. c_associated(pointer)) then
      text = ""
      return
    end if
    length = c_strlen(pointer)
    call c_f_pointer(pointer, chars, [length])
    allocate (character(len=length) :: text)
    do i = 1, length
      text(i:i) = chars(i)
    end do
  end function f_string

  !> `text` as a C string in `buffer` (the caller's, alive until its C call) and the address of
  !> that: what a C argument that may be NULL gets; c_null_ptr when `text` is absent.
  function c_string_or_null(text, buffer) result(pointer)
    character(len=*), intent(in), optional :: text
    character(kind=c_char, len=:), allocatable, target, intent(out) :: buffer
    type(c_ptr) :: pointer
    pointer = c_null_ptr
    if (.not. present(text)) return
    buffer = c_string(text)
    pointer = c_loc(buffer)
  end function c_string_or_null

  !> The text `c_call` returns for `subject`: its length first (capacity 0), then the text into a
  !> buffer of that size. "" when a call fails (its status is returned).
  integer(c_int) function text_of(c_call, subject, text)
    procedure(c_text_call) :: c_call
    type(c_ptr), intent(in) :: subject
    character(len=:), allocatable, intent(out) :: text
    character(kind=c_char, len=:), allocatable, target :: buffer
    integer(c_size_t) :: length
    length = 0
    text = ""
    text_of = c_call(subject, c_null_ptr, 0_c_size_t, length)
    if (text_of /= ZT_STATUS_OK) return
    allocate (character(kind=c_char, len=length + 1) :: buffer)
    text_of = c_call(subject, c_loc(buffer), length + 1, length)
    if (text_of == ZT_STATUS_OK) text = buffer(1:length)
  end function text_of

  ! ---- version and errors ------------------------------------------------------------------

  integer(c_int) function zt_api_version()
    zt_api_version = c_zt_api_version()
  end function zt_api_version

  function zt_version() result(version)
    character(len=:), allocatable :: version
    version = f_string(c_zt_version())
  end function zt_version

  !> The message of this thread's last call ("" after a success).
  function zt_last_error() result(message)
    character(len=:), allocatable :: message
    message = f_string(c_zt_last_error())
  end function zt_last_error

  function zt_status_name(status) result(name)
    integer(c_int), intent(in) :: status
    character(len=:), allocatable :: name
    name = f_string(c_zt_status_name(status))
  end function zt_status_name

  ! ---- runtime -----------------------------------------------------------------------------

  !> The job's runtime over MPI_COMM_WORLD (initializes MPI unless the program did).
  integer(c_int) function zt_runtime_create(runtime)
    type(zt_runtime), intent(out) :: runtime
    zt_runtime_create = c_zt_runtime_create(c_null_ptr, c_null_ptr, runtime%handle)
  end function zt_runtime_create

  integer(c_int) function runtime_from_comm_f08(comm, runtime)
    type(MPI_Comm), intent(in) :: comm
    type(zt_runtime), intent(out) :: runtime
    runtime_from_comm_f08 = c_zt_runtime_create_from_fortran_comm(int(comm%MPI_VAL, c_int), runtime%handle)
  end function runtime_from_comm_f08

  integer(c_int) function runtime_from_comm_integer(comm, runtime)
    integer, intent(in) :: comm
    type(zt_runtime), intent(out) :: runtime
    runtime_from_comm_integer = c_zt_runtime_create_from_fortran_comm(int(comm, c_int), runtime%handle)
  end function runtime_from_comm_integer

  integer(c_int) function zt_runtime_destroy(runtime)
    type(zt_runtime), intent(inout) :: runtime
    zt_runtime_destroy = c_zt_runtime_destroy(runtime%handle)
    runtime%handle = c_null_ptr
  end function zt_runtime_destroy

  integer(c_int) function zt_runtime_rank(runtime, rank)
    type(zt_runtime), intent(in) :: runtime
    integer, intent(out) :: rank
    integer(c_int) :: value
    value = 0
    zt_runtime_rank = c_zt_runtime_rank(runtime%handle, value)
    rank = int(value)
  end function zt_runtime_rank

  integer(c_int) function zt_runtime_size(runtime, size)
    type(zt_runtime), intent(in) :: runtime
    integer, intent(out) :: size
    integer(c_int) :: value
    value = 0
    zt_runtime_size = c_zt_runtime_size(runtime%handle, value)
    size = int(value)
  end function zt_runtime_size

  ! ---- config ------------------------------------------------------------------------------

  integer(c_int) function zt_config_from_file(path, config)
    character(len=*), intent(in) :: path
    type(zt_config), intent(out) :: config
    zt_config_from_file = c_zt_config_from_file(c_string(path), config%handle)
  end function zt_config_from_file

  integer(c_int) function zt_config_from_string(json, config)
    character(len=*), intent(in) :: json
    type(zt_config), intent(out) :: config
    zt_config_from_string = c_zt_config_from_string(c_string(json), config%handle)
  end function zt_config_from_string

  integer(c_int) function zt_config_destroy(config)
    type(zt_config), intent(inout) :: config
    zt_config_destroy = c_zt_config_destroy(config%handle)
    config%handle = c_null_ptr
  end function zt_config_destroy

  ! ---- models ------------------------------------------------------------------------------

  integer(c_int) function zt_model_create_external(model)
    type(zt_model), intent(out) :: model
    zt_model_create_external = c_zt_model_create_external(model%handle)
  end function zt_model_create_external

  !> Register buffers by address: `fortran_shape` is the array's Fortran shape (reversed here),
  !> `dtype` a ZT_DTYPE_* (e.g. ZT_DTYPE_BF16 for integer(c_int16_t) bit patterns).
  integer(c_int) function zt_model_add_parameter_ptr(model, name, values, gradients, fortran_shape, dtype, device, &
                                                     device_index)
    type(zt_model), intent(in) :: model
    character(len=*), intent(in) :: name
    type(c_ptr), intent(in) :: values, gradients
    integer, intent(in) :: fortran_shape(:)
    integer(c_int), intent(in) :: dtype
    integer(c_int), intent(in), optional :: device, device_index
    integer(c_int64_t) :: shape(ZT_MAX_DIMS)
    integer(c_int) :: where, index
    integer :: d, ndim
    ndim = size(fortran_shape)
    shape = 0
    do d = 1, min(ndim, ZT_MAX_DIMS)
      shape(d) = int(fortran_shape(ndim + 1 - d), c_int64_t)
    end do
    where = ZT_DEVICE_HOST
    if (present(device)) where = device
    index = 0
    if (present(device_index)) index = device_index
    zt_model_add_parameter_ptr = c_zt_model_add_parameter(model%handle, c_string(name), values, gradients, &
                                                          int(ndim, c_int32_t), shape, dtype, where, &
                                                          int(index, c_int32_t))
  end function zt_model_add_parameter_ptr

  !> The checks of zt_model_add_parameter the C side cannot make: the same shape, contiguous
  !> memory (a section such as a(1:n:2) would otherwise be registered by a temporary's address).
  integer(c_int) function check_pair(name, values_shape, gradients_shape, contiguous)
    character(len=*), intent(in) :: name
    integer, intent(in) :: values_shape(:), gradients_shape(:)
    logical, intent(in) :: contiguous
    check_pair = ZT_STATUS_OK
    if (any(values_shape /= gradients_shape)) then
      check_pair = c_zt_set_last_error(ZT_STATUS_INVALID_ARGUMENT, c_string("zerotrain error: " // &
                   "zt_model_add_parameter('" // name // "'): values and gradients differ in shape"))
    else if (.not. contiguous) then
      check_pair = c_zt_set_last_error(ZT_STATUS_INVALID_ARGUMENT, c_string("zerotrain error: " // &
                   "zt_model_add_parameter('" // name // "'): values or gradients are not contiguous; " // &
                   "register whole arrays (the engine keeps their addresses)"))
    end if
  end function check_pair

  integer(c_int) function add_parameter_1(model, name, values, gradients)
    type(zt_model), intent(in) :: model
    character(len=*), intent(in) :: name
    real(c_float), intent(inout), target :: values(:), gradients(:)
    add_parameter_1 = check_pair(name, shape(values), shape(gradients), &
                                 is_contiguous(values) .and. is_contiguous(gradients))
    if (add_parameter_1 /= ZT_STATUS_OK) return
    add_parameter_1 = zt_model_add_parameter_ptr(model, name, c_loc(values), c_loc(gradients), shape(values), &
                                                 ZT_DTYPE_FP32)
  end function add_parameter_1

  integer(c_int) function add_parameter_2(model, name, values, gradients)
    type(zt_model), intent(in) :: model
    character(len=*), intent(in) :: name
    real(c_float), intent(inout), target :: values(:, :), gradients(:, :)
    add_parameter_2 = check_pair(name, shape(values), shape(gradients), &
                                 is_contiguous(values) .and. is_contiguous(gradients))
    if (add_parameter_2 /= ZT_STATUS_OK) return
    add_parameter_2 = zt_model_add_parameter_ptr(model, name, c_loc(values), c_loc(gradients), shape(values), &
                                                 ZT_DTYPE_FP32)
  end function add_parameter_2

  integer(c_int) function add_parameter_3(model, name, values, gradients)
    type(zt_model), intent(in) :: model
    character(len=*), intent(in) :: name
    real(c_float), intent(inout), target :: values(:, :, :), gradients(:, :, :)
    add_parameter_3 = check_pair(name, shape(values), shape(gradients), &
                                 is_contiguous(values) .and. is_contiguous(gradients))
    if (add_parameter_3 /= ZT_STATUS_OK) return
    add_parameter_3 = zt_model_add_parameter_ptr(model, name, c_loc(values), c_loc(gradients), shape(values), &
                                                 ZT_DTYPE_FP32)
  end function add_parameter_3

  integer(c_int) function add_parameter_4(model, name, values, gradients)
    type(zt_model), intent(in) :: model
    character(len=*), intent(in) :: name
    real(c_float), intent(inout), target :: values(:, :, :, :), gradients(:, :, :, :)
    add_parameter_4 = check_pair(name, shape(values), shape(gradients), &
                                 is_contiguous(values) .and. is_contiguous(gradients))
    if (add_parameter_4 /= ZT_STATUS_OK) return
    add_parameter_4 = zt_model_add_parameter_ptr(model, name, c_loc(values), c_loc(gradients), shape(values), &
                                                 ZT_DTYPE_FP32)
  end function add_parameter_4

  integer(c_int) function zt_model_report_loss(model, loss)
    type(zt_model), intent(in) :: model
    real(c_double), intent(in) :: loss
    zt_model_report_loss = c_zt_model_report_loss(model%handle, loss)
  end function zt_model_report_loss

  integer(c_int) function zt_model_create_builtin(config, model)
    type(zt_config), intent(in) :: config
    type(zt_model), intent(out) :: model
    zt_model_create_builtin = c_zt_model_create_builtin(config%handle, model%handle)
  end function zt_model_create_builtin

  integer(c_int) function zt_model_parameter_count(model, tensors, elements)
    type(zt_model), intent(in) :: model
    integer(c_int64_t), intent(out) :: tensors, elements
    tensors = 0
    elements = 0
    zt_model_parameter_count = c_zt_model_parameter_count(model%handle, tensors, elements)
  end function zt_model_parameter_count

  integer(c_int) function zt_model_destroy(model)
    type(zt_model), intent(inout) :: model
    zt_model_destroy = c_zt_model_destroy(model%handle)
    model%handle = c_null_ptr
  end function zt_model_destroy

  ! ---- tensors of built-in models' batches ---------------------------------------------------

  function tensor_of(data, fortran_shape, dtype) result(tensor)
    type(c_ptr), intent(in) :: data
    integer, intent(in) :: fortran_shape(:)
    integer(c_int), intent(in) :: dtype
    type(zt_tensor) :: tensor
    integer :: d, ndim
    ndim = size(fortran_shape)
    tensor%data = data
    tensor%dtype = dtype
    tensor%ndim = int(ndim, c_int32_t)
    do d = 1, ndim
      tensor%shape(d) = int(fortran_shape(ndim + 1 - d), c_int64_t)
    end do
  end function tensor_of

  !> A non-contiguous array gives a tensor without data (the engine call then fails naming it).
  function tensor_of_real_1(array) result(tensor)
    real(c_float), intent(in), target :: array(:)
    type(zt_tensor) :: tensor
    tensor = tensor_of(c_null_ptr, shape(array), ZT_DTYPE_FP32)
    if (is_contiguous(array)) tensor%data = c_loc(array)
  end function tensor_of_real_1

  function tensor_of_real_2(array) result(tensor)
    real(c_float), intent(in), target :: array(:, :)
    type(zt_tensor) :: tensor
    tensor = tensor_of(c_null_ptr, shape(array), ZT_DTYPE_FP32)
    if (is_contiguous(array)) tensor%data = c_loc(array)
  end function tensor_of_real_2

  function tensor_of_int_1(array) result(tensor)
    integer(c_int32_t), intent(in), target :: array(:)
    type(zt_tensor) :: tensor
    tensor = tensor_of(c_null_ptr, shape(array), ZT_DTYPE_INT32)
    if (is_contiguous(array)) tensor%data = c_loc(array)
  end function tensor_of_int_1

  function tensor_of_int_2(array) result(tensor)
    integer(c_int32_t), intent(in), target :: array(:, :)
    type(zt_tensor) :: tensor
    tensor = tensor_of(c_null_ptr, shape(array), ZT_DTYPE_INT32)
    if (is_contiguous(array)) tensor%data = c_loc(array)
  end function tensor_of_int_2

  ! ---- engine ------------------------------------------------------------------------------

  integer(c_int) function zt_engine_create(runtime, model, config, engine)
    type(zt_runtime), intent(in) :: runtime
    type(zt_model), intent(in) :: model
    type(zt_config), intent(in) :: config
    type(zt_engine), intent(out) :: engine
    zt_engine_create = c_zt_engine_create(runtime%handle, model%handle, config%handle, engine%handle)
  end function zt_engine_create

  integer(c_int) function zt_engine_destroy(engine)
    type(zt_engine), intent(inout) :: engine
    zt_engine_destroy = c_zt_engine_destroy(engine%handle)
    engine%handle = c_null_ptr
  end function zt_engine_destroy

  integer(c_int) function zt_engine_step(engine, boundary)
    type(zt_engine), intent(in) :: engine
    logical, intent(out), optional :: boundary
    integer(c_int) :: at_boundary
    at_boundary = 0
    zt_engine_step = c_zt_engine_step(engine%handle, at_boundary)
    if (present(boundary)) boundary = at_boundary /= 0
  end function zt_engine_step

  integer(c_int) function zt_engine_forward_backward(engine, inputs, targets, loss)
    type(zt_engine), intent(in) :: engine
    type(zt_tensor), intent(in) :: inputs, targets
    real(c_double), intent(out), optional :: loss
    type(zt_tensor) :: inputs_copy, targets_copy
    real(c_double) :: value
    inputs_copy = inputs
    targets_copy = targets
    value = 0
    zt_engine_forward_backward = c_zt_engine_forward_backward(engine%handle, inputs_copy, targets_copy, value)
    if (present(loss)) loss = value
  end function zt_engine_forward_backward

  integer(c_int) function zt_engine_train_batch(engine, inputs, targets, report)
    type(zt_engine), intent(in) :: engine
    type(zt_tensor), intent(in) :: inputs(:), targets(:)
    type(zt_step_report), intent(out), optional :: report
    type(zt_tensor) :: inputs_copy(size(inputs)), targets_copy(size(targets))
    type(zt_step_report) :: done
    if (size(inputs) /= size(targets)) then
      zt_engine_train_batch = c_zt_set_last_error(ZT_STATUS_INVALID_ARGUMENT, c_string("zerotrain error: " // &
                              "zt_engine_train_batch: arguments 'inputs' and 'targets' differ in length"))
      return
    end if
    inputs_copy = inputs
    targets_copy = targets
    zt_engine_train_batch = c_zt_engine_train_batch(engine%handle, int(size(inputs), c_int64_t), inputs_copy, &
                                                    targets_copy, done)
    if (present(report)) report = done
  end function zt_engine_train_batch

  integer(c_int) function zt_engine_last_step(engine, report)
    type(zt_engine), intent(in) :: engine
    type(zt_step_report), intent(out) :: report
    zt_engine_last_step = c_zt_engine_last_step(engine%handle, report)
  end function zt_engine_last_step

  integer(c_int) function zt_engine_batch_sizes(engine, sizes)
    type(zt_engine), intent(in) :: engine
    type(zt_batch_sizes), intent(out) :: sizes
    zt_engine_batch_sizes = c_zt_engine_batch_sizes(engine%handle, sizes)
  end function zt_engine_batch_sizes

  integer(c_int) function zt_engine_global_steps(engine, steps)
    type(zt_engine), intent(in) :: engine
    integer(c_int64_t), intent(out) :: steps
    steps = 0
    zt_engine_global_steps = c_zt_engine_global_steps(engine%handle, steps)
  end function zt_engine_global_steps

  integer(c_int) function zt_engine_zero_stage(engine, stage)
    type(zt_engine), intent(in) :: engine
    integer, intent(out) :: stage
    integer(c_int) :: value
    value = 0
    zt_engine_zero_stage = c_zt_engine_zero_stage(engine%handle, value)
    stage = int(value)
  end function zt_engine_zero_stage

  !> Where this rank's optimizer states and parameter pieces live, as text.
  integer(c_int) function zt_engine_placement(engine, text)
    type(zt_engine), intent(in) :: engine
    character(len=:), allocatable, intent(out) :: text
    zt_engine_placement = text_of(c_zt_engine_placement, engine%handle, text)
  end function zt_engine_placement

  integer(c_int) function zt_engine_save_checkpoint(engine, dir, tag, client_state, keep_last)
    type(zt_engine), intent(in) :: engine
    character(len=*), intent(in) :: dir
    character(len=*), intent(in), optional :: tag, client_state
    integer, intent(in), optional :: keep_last
    character(kind=c_char, len=:), allocatable, target :: tag_c, state_c
    integer(c_int64_t) :: keep
    keep = 0
    if (present(keep_last)) keep = int(keep_last, c_int64_t)
    zt_engine_save_checkpoint = c_zt_engine_save_checkpoint(engine%handle, c_string(dir), &
                                                            c_string_or_null(tag, tag_c), &
                                                            c_string_or_null(client_state, state_c), keep)
  end function zt_engine_save_checkpoint

  integer(c_int) function zt_engine_load_checkpoint(engine, dir, tag)
    type(zt_engine), intent(in) :: engine
    character(len=*), intent(in) :: dir
    character(len=*), intent(in), optional :: tag
    character(kind=c_char, len=:), allocatable, target :: tag_c
    zt_engine_load_checkpoint = c_zt_engine_load_checkpoint(engine%handle, c_string(dir), &
                                                            c_string_or_null(tag, tag_c))
  end function zt_engine_load_checkpoint

  !> The client state of the checkpoint the engine last loaded (the JSON text given to the save).
  integer(c_int) function zt_engine_loaded_client_state(engine, text)
    type(zt_engine), intent(in) :: engine
    character(len=:), allocatable, intent(out) :: text
    zt_engine_loaded_client_state = text_of(c_zt_engine_loaded_client_state, engine%handle, text)
  end function zt_engine_loaded_client_state

  ! ---- checkpoint files ----------------------------------------------------------------------

  integer(c_int) function zt_checkpoint_export(path, out, dtype)
    character(len=*), intent(in) :: path, out
    integer(c_int), intent(in), optional :: dtype
    integer(c_int) :: element
    element = ZT_DTYPE_FP32
    if (present(dtype)) element = dtype
    zt_checkpoint_export = c_zt_checkpoint_export(c_string(path), c_string(out), element)
  end function zt_checkpoint_export

  !> The client state stored in checkpoint file `path` (DIR/TAG.h5); one process.
  integer(c_int) function zt_checkpoint_client_state(path, text)
    character(len=*), intent(in) :: path
    character(len=:), allocatable, intent(out) :: text
    character(kind=c_char, len=:), allocatable, target :: path_c
    ! Not c_loc(path_c) in the argument list: gfortran 12 passes it with path_c's hidden length,
    ! which shifts text's (a segfault).
    zt_checkpoint_client_state = text_of(c_zt_checkpoint_client_state, c_string_or_null(path, path_c), text)
  end function zt_checkpoint_client_state

  integer(c_int) function zt_checkpoint_verify(path)
    character(len=*), intent(in) :: path
    zt_checkpoint_verify = c_zt_checkpoint_verify(c_string(path))
  end function zt_checkpoint_verify

  ! ---- metrics -------------------------------------------------------------------------------

  integer(c_int) function zt_metrics_open(runtime, path, metrics)
    type(zt_runtime), intent(in) :: runtime
    character(len=*), intent(in) :: path
    type(zt_metrics), intent(out) :: metrics
    zt_metrics_open = c_zt_metrics_open(runtime%handle, c_string(path), metrics%handle)
  end function zt_metrics_open

  integer(c_int) function zt_metrics_record_step(metrics, engine, extra_json)
    type(zt_metrics), intent(in) :: metrics
    type(zt_engine), intent(in) :: engine
    character(len=*), intent(in), optional :: extra_json
    character(kind=c_char, len=:), allocatable, target :: extra_c
    zt_metrics_record_step = c_zt_metrics_record_step(metrics%handle, engine%handle, &
                                                      c_string_or_null(extra_json, extra_c))
  end function zt_metrics_record_step

  integer(c_int) function zt_metrics_record(metrics, event, json)
    type(zt_metrics), intent(in) :: metrics
    character(len=*), intent(in) :: event
    character(len=*), intent(in), optional :: json
    character(kind=c_char, len=:), allocatable, target :: json_c
    zt_metrics_record = c_zt_metrics_record(metrics%handle, c_string(event), c_string_or_null(json, json_c))
  end function zt_metrics_record

  integer(c_int) function zt_metrics_close(metrics)
    type(zt_metrics), intent(inout) :: metrics
    zt_metrics_close = c_zt_metrics_close(metrics%handle)
    metrics%handle = c_null_ptr
  end function zt_metrics_close

end module zerotrain
