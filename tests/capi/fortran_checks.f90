! The Fortran module as a Fortran program uses it (ctest capi.fortran_checks.np1/np2/np4): the runtime
! from an mpi_f08 type(MPI_Comm) and from an integer handle (of a sub-communicator), status codes
! and zt_last_error() of the error paths (a bad config key, a non-contiguous array, mismatched
! shapes, a missing checkpoint, a client state that is not JSON), the column-major shapes as
! zerotrain records them (the export of a checkpoint read back with h5ls), stage 3 with the full
! values in every rank's arrays, a checkpoint that restores them and hands back its client state
! (from the engine and from the file), the placement text, metrics lines, a built-in MLP trained
! from Fortran arrays.
!   mpiexec -n N fortran_checks WORK_DIR     prints "fortran: N checks passed" and exits 0
program fortran_checks
  use, intrinsic :: iso_c_binding
  use, intrinsic :: iso_fortran_env, only: error_unit
  use mpi_f08
  use zerotrain
  implicit none

  integer :: rank, world_size, checks = 0, failures = 0, all_failures, provided, length
  character(len=:), allocatable :: work
  type(zt_runtime) :: runtime, half_runtime
  type(MPI_Comm) :: half

  call MPI_Init_thread(MPI_THREAD_MULTIPLE, provided)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank)
  call MPI_Comm_size(MPI_COMM_WORLD, world_size)
  call get_command_argument(1, length=length)
  allocate (character(len=length) :: work)
  call get_command_argument(1, work)

  call expect_ok(zt_runtime_create_from_comm(MPI_COMM_WORLD, runtime), "runtime from type(MPI_Comm)")
  ! An integer handle (mpif.h / use mpi style) of a sub-communicator: the even and odd ranks.
  call MPI_Comm_split(MPI_COMM_WORLD, mod(rank, 2), rank, half)
  call expect_ok(zt_runtime_create_from_comm(half%MPI_VAL, half_runtime), "runtime from an integer handle")
  call check_sizes()
  call expect_ok(zt_runtime_destroy(half_runtime), "destroy the sub-communicator's runtime")
  call MPI_Comm_free(half)
  call expect(zt_api_version() == ZT_MODULE_API_VERSION, "the library's API version is the module's")
  call expect(len(zt_version()) > 0, "zt_version")

  call check_errors()
  call check_stage3_and_checkpoint()
  call check_builtin_mlp()

  call expect_ok(zt_runtime_destroy(runtime), "zt_runtime_destroy")
  call MPI_Allreduce(failures, all_failures, 1, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD)
  if (rank == 0) then
    if (all_failures == 0) then
      write (*, '(a,i0,a,i0,a)') "fortran: ", checks, " checks passed on ", world_size, " ranks"
    else
      write (*, '(a,i0,a)') "fortran: ", all_failures, " check(s) failed"
    end if
  end if
  call MPI_Finalize()
  if (all_failures /= 0) error stop 1

contains

  subroutine expect(condition, what)
    logical, intent(in) :: condition
    character(len=*), intent(in) :: what
    checks = checks + 1
    if (.not. condition) then
      failures = failures + 1
      write (error_unit, '(a,i0,4a)') "rank ", rank, ": FAILED: ", what, "; last error: ", zt_last_error()
    end if
  end subroutine expect

  !> `status` is `expected` and zt_last_error() contains `text`.
  subroutine expect_status(status, expected, text, what)
    integer(c_int), intent(in) :: status, expected
    character(len=*), intent(in) :: text, what
    call expect(status == expected .and. index(zt_last_error(), text) > 0, &
                what // " (got " // zt_status_name(status) // ", expected " // zt_status_name(expected) // &
                " with '" // text // "')")
  end subroutine expect_status

  subroutine expect_ok(status, what)
    integer(c_int), intent(in) :: status
    character(len=*), intent(in) :: what
    call expect_status(status, ZT_STATUS_OK, "", what)
  end subroutine expect_ok

  subroutine check_sizes()
    integer :: zt_rank, zt_size, half_rank, half_size
    call expect_ok(zt_runtime_rank(runtime, zt_rank), "zt_runtime_rank")
    call expect_ok(zt_runtime_size(runtime, zt_size), "zt_runtime_size")
    call expect(zt_rank == rank .and. zt_size == world_size, "the world runtime's rank and size")
    call expect_ok(zt_runtime_rank(half_runtime, half_rank), "zt_runtime_rank of the half")
    call expect_ok(zt_runtime_size(half_runtime, half_size), "zt_runtime_size of the half")
    call expect(half_rank == rank / 2 .and. half_size == (world_size + 1 - mod(rank, 2)) / 2, &
                "the sub-communicator's rank and size")
  end subroutine check_sizes

  subroutine check_errors()
    type(zt_config) :: config
    type(zt_model) :: model
    type(zt_engine) :: engine
    real(c_float), target :: values(4, 3), gradients(4, 3), other(3, 4)
    call expect_status(zt_config_from_string('{"zero_optimization": {"stage": 7}}', config), &
                       ZT_STATUS_CONFIG_ERROR, "zero_optimization.stage", "a bad config key")
    call expect_status(zt_config_from_file(work // "/missing.json", config), ZT_STATUS_CONFIG_ERROR, &
                       "missing.json", "a missing config file")
    call expect_status(zt_engine_step(engine), ZT_STATUS_INVALID_ARGUMENT, "argument 'engine' is NULL", &
                       "a null engine")
    call expect_ok(zt_model_create_external(model), "zt_model_create_external")
    call expect_status(zt_model_add_parameter(model, "strided", values(1:4:2, :), gradients(1:4:2, :)), &
                       ZT_STATUS_INVALID_ARGUMENT, "not contiguous", "a strided section")
    call expect_status(zt_model_add_parameter(model, "w", values, other), ZT_STATUS_INVALID_ARGUMENT, &
                       "differ in shape", "mismatched shapes")
    call expect_ok(zt_model_add_parameter(model, "w", values, gradients), "a whole array")
    call expect_status(zt_model_add_parameter(model, "w", values, gradients), ZT_STATUS_ERROR, "twice", &
                       "a name registered twice")
    call expect_ok(zt_model_destroy(model), "zt_model_destroy")
  end subroutine check_errors

  subroutine check_stage3_and_checkpoint()
    integer, parameter :: INPUTS = 5, OUTPUTS = 3
    real(c_float), target :: w(INPUTS, OUTPUTS), dw(INPUTS, OUTPUTS), b(OUTPUTS), db(OUTPUTS)
    real(c_float) :: w_saved(INPUTS, OUTPUTS), low(INPUTS, OUTPUTS), high(INPUTS, OUTPUTS)
    type(zt_config) :: config
    type(zt_model) :: model
    type(zt_engine) :: engine
    integer(c_int64_t) :: tensors, elements, steps
    integer :: i, o, unit, status
    character(len=256) :: line
    character(len=:), allocatable :: text
    character(len=*), parameter :: CLIENT_STATE = '{"from": "fortran",  "steps": [3]}'
    logical :: found
    do o = 1, OUTPUTS
      do i = 1, INPUTS
        w(i, o) = real(mod(i + 2 * o, 4), c_float) * 0.1_c_float - 0.15_c_float
      end do
    end do
    b = 0
    dw = 0
    db = 0
    call expect_ok(zt_config_from_string('{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, ' // &
                   '"gradient_clipping": 0.0, "optimizer": {"type": "AdamW", "params": {"lr": 0.05}}, ' // &
                   '"zero_optimization": {"stage": 3}}', config), "the stage 3 config")
    call expect_ok(zt_model_create_external(model), "zt_model_create_external")
    call expect_ok(zt_model_add_parameter(model, "w", w, dw), "add w")
    call expect_ok(zt_model_add_parameter(model, "b", b, db), "add b")
    call expect_ok(zt_model_parameter_count(model, tensors, elements), "zt_model_parameter_count")
    call expect(tensors == 2 .and. elements == INPUTS * OUTPUTS + OUTPUTS, "2 tensors, 18 elements")
    call expect_ok(zt_engine_create(runtime, model, config, engine), "zt_engine_create")
    call train(engine, model, w, dw, b, db, 3)
    ! Stage 3: every rank's arrays hold the same full values.
    call MPI_Allreduce(w, low, size(w), MPI_REAL, MPI_MIN, MPI_COMM_WORLD)
    call MPI_Allreduce(w, high, size(w), MPI_REAL, MPI_MAX, MPI_COMM_WORLD)
    call expect(all(low == high), "the same w on every rank")
    call expect(all(dw == 0), "gradients zeroed at the boundary")
    call check_metrics(engine)
    call expect_ok(zt_engine_placement(engine, text), "zt_engine_placement")
    call expect(index(text, "optimizer states: host memory; parameters: ") == 1, &
                "the placement text: " // text)
    call expect_status(zt_engine_loaded_client_state(engine, text), ZT_STATUS_ERROR, "no checkpoint loaded", &
                       "a client state before any load")
    call expect(text == "", "no client state before any load")
    call expect_status(zt_engine_save_checkpoint(engine, work // "/ckpt", tag="bad", &
                                                 client_state="from fortran"), &
                       ZT_STATUS_INVALID_ARGUMENT, "is not JSON text", "a client state that is not JSON")
    call expect_ok(zt_engine_save_checkpoint(engine, work // "/ckpt", tag="saved", &
                                             client_state=CLIENT_STATE), "zt_engine_save_checkpoint")
    w_saved = w
    call train(engine, model, w, dw, b, db, 2)
    call expect(any(w /= w_saved), "training changed w")
    call expect_ok(zt_engine_load_checkpoint(engine, work // "/ckpt"), "zt_engine_load_checkpoint")
    call expect(all(w == w_saved), "the load restored w in the Fortran array")
    call expect_ok(zt_engine_global_steps(engine, steps), "zt_engine_global_steps")
    call expect(steps == 3, "global steps 3 after the load")
    call expect_ok(zt_engine_loaded_client_state(engine, text), "zt_engine_loaded_client_state")
    call expect(text == CLIENT_STATE, "the loaded client state is the saved text: " // text)
    call expect_ok(zt_checkpoint_client_state(work // "/ckpt/saved.h5", text), "zt_checkpoint_client_state")
    call expect(text == CLIENT_STATE, "the file's client state is the saved text: " // text)
    call expect_status(zt_checkpoint_client_state(work // "/ckpt/bad.h5", text), ZT_STATUS_IO_ERROR, &
                       "bad.h5", "the client state of a checkpoint the refused save did not write")
    call expect_status(zt_engine_load_checkpoint(engine, work // "/ckpt", tag="nonexistent"), ZT_STATUS_IO_ERROR, &
                       "nonexistent", "a missing tag")
    call expect_status(zt_engine_loaded_client_state(engine, text), ZT_STATUS_ERROR, "no checkpoint loaded", &
                       "a client state after a failed load")
    ! The shape zerotrain records is the Fortran shape reversed: w(5, 3) is [3, 5].
    if (rank == 0) then
      call expect_ok(zt_checkpoint_export(work // "/ckpt/saved.h5", work // "/weights.h5"), "zt_checkpoint_export")
      call execute_command_line("h5ls " // work // "/weights.h5 > " // work // "/h5ls.txt", exitstat=status)
      call expect(status == 0, "h5ls runs")
      found = .false.
      open (newunit=unit, file=work // "/h5ls.txt", action="read", iostat=status)
      do while (status == 0)
        read (unit, '(a)', iostat=status) line
        if (status == 0 .and. index(line, "w") == 1 .and. index(line, "{3, 5}") > 0) found = .true.
      end do
      close (unit)
      call expect(found, "the export holds w as {3, 5}")
    end if
    call expect_ok(zt_engine_destroy(engine), "zt_engine_destroy")
    call expect_ok(zt_model_destroy(model), "zt_model_destroy")
    call expect_ok(zt_config_destroy(config), "zt_config_destroy")
  end subroutine check_stage3_and_checkpoint

  !> Metrics lines from Fortran, with and without the optional JSON members; rank 0 writes them.
  subroutine check_metrics(engine)
    type(zt_engine), intent(in) :: engine
    type(zt_metrics) :: metrics
    character(len=512) :: lines(4)
    integer :: unit, status, count
    call expect_ok(zt_metrics_open(runtime, work // "/metrics.jsonl", metrics), "zt_metrics_open")
    call expect_ok(zt_metrics_record_step(metrics, engine, extra_json='{"phase": "fortran"}'), &
                   "zt_metrics_record_step with extra members")
    call expect_ok(zt_metrics_record_step(metrics, engine), "zt_metrics_record_step")
    call expect_ok(zt_metrics_record(metrics, "custom", json='{"value": 7}'), "zt_metrics_record with members")
    call expect_ok(zt_metrics_record(metrics, "bare"), "zt_metrics_record")
    call expect_status(zt_metrics_record(metrics, "custom", json="[1]"), ZT_STATUS_INVALID_ARGUMENT, &
                       "not a JSON object", "metrics members that are not a JSON object")
    call expect_ok(zt_metrics_close(metrics), "zt_metrics_close")
    if (rank /= 0) return
    count = 0
    open (newunit=unit, file=work // "/metrics.jsonl", action="read", iostat=status)
    do while (status == 0 .and. count < size(lines))
      read (unit, '(a)', iostat=status) lines(count + 1)
      if (status == 0) count = count + 1
    end do
    close (unit)
    call expect(count == 4, "4 metrics lines")
    if (count /= 4) return
    call expect(index(lines(1), '"event":"step"') > 0 .and. index(lines(1), '"phase":"fortran"') > 0, &
                "the step line with its extra member: " // trim(lines(1)))
    call expect(index(lines(2), '"event":"step"') > 0 .and. index(lines(2), '"phase"') == 0, &
                "the step line without: " // trim(lines(2)))
    call expect(index(lines(3), '"event":"custom"') > 0 .and. index(lines(3), '"value":7') > 0, &
                "the custom line: " // trim(lines(3)))
    call expect(trim(lines(4)) == '{"event":"bare"}', "the bare line: " // trim(lines(4)))
  end subroutine check_metrics

  !> `steps` optimizer steps of y = W^T x + b on samples that depend on the step and rank.
  subroutine train(engine, model, w, dw, b, db, steps)
    type(zt_engine), intent(in) :: engine
    type(zt_model), intent(in) :: model
    ! TARGET and INTENT(INOUT): the engine writes w and b inside zt_engine_step (docs/c-fortran.md).
    real(c_float), intent(inout), target :: w(5, 3), b(3), dw(5, 3), db(3)
    integer, intent(in) :: steps
    integer :: step, r, i, o
    real(c_float) :: x(5), error, total
    real(c_double) :: loss
    logical :: boundary
    do step = 1, steps
      loss = 0
      do r = 1, 2
        do i = 1, 5
          x(i) = real(mod(step * 3 + r * 7 + i * 5 + rank, 9), c_float) / 9.0_c_float - 0.5_c_float
        end do
        do o = 1, 3
          total = b(o)
          do i = 1, 5
            total = total + w(i, o) * x(i)
          end do
          error = total - (x(o) - 0.5_c_float * x(o + 1))
          loss = loss + real(error, c_double)**2 / 6.0_c_double
          db(o) = db(o) + 2.0_c_float * error / 6.0_c_float
          dw(:, o) = dw(:, o) + 2.0_c_float * error / 6.0_c_float * x
        end do
      end do
      call expect_ok(zt_model_report_loss(model, loss), "zt_model_report_loss")
      call expect_ok(zt_engine_step(engine, boundary), "zt_engine_step")
      call expect(boundary, "every step is a boundary (no accumulation)")
    end do
  end subroutine train

  subroutine check_builtin_mlp()
    type(zt_config) :: config
    type(zt_model) :: model
    type(zt_engine) :: engine
    type(zt_step_report) :: report
    real(c_float), target :: x(3, 4), y(2, 4)  ! [4, 3] and [4, 2] in zerotrain's row-major terms
    real(c_double) :: first, loss
    integer :: step, r, i
    call expect_ok(zt_config_from_string('{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, ' // &
                   '"gradient_clipping": 0.0, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, ' // &
                   '"model": {"type": "mlp", "sizes": [3, 8, 2], "activation": "relu"}, "seed": 5}', config), &
                   "the MLP config")
    call expect_ok(zt_model_create_builtin(config, model), "zt_model_create_builtin")
    call expect_ok(zt_engine_create(runtime, model, config, engine), "zt_engine_create (built-in)")
    first = -1
    do step = 1, 30
      do r = 1, 4
        do i = 1, 3
          x(i, r) = real(mod(step * 4 + r + i * 3 + rank, 5), c_float) * 0.25_c_float - 0.5_c_float
        end do
        y(1, r) = x(1, r) + x(2, r)
        y(2, r) = x(2, r) - x(3, r)
      end do
      if (mod(step, 2) == 0) then
        call expect_ok(zt_engine_train_batch(engine, [zt_tensor_of(x)], [zt_tensor_of(y)], report), &
                       "zt_engine_train_batch")
      else
        call expect_ok(zt_engine_forward_backward(engine, zt_tensor_of(x), zt_tensor_of(y), loss), &
                       "zt_engine_forward_backward")
        call expect_ok(zt_engine_step(engine), "zt_engine_step (built-in)")
        call expect_ok(zt_engine_last_step(engine, report), "zt_engine_last_step")
      end if
      call expect(report%step == step, "the step count")
      if (first < 0) first = report%loss
    end do
    call expect(report%loss < 0.5_c_double * first, "the built-in MLP's loss falls")
    call expect_status(zt_engine_forward_backward(engine, zt_tensor_of(x(1:3:2, :)), zt_tensor_of(y), loss), &
                       ZT_STATUS_INVALID_ARGUMENT, "inputs.data is NULL", "a strided batch")
    call expect_ok(zt_engine_destroy(engine), "zt_engine_destroy (built-in)")
    call expect_ok(zt_model_destroy(model), "zt_model_destroy (built-in)")
    call expect_ok(zt_config_destroy(config), "zt_config_destroy (built-in)")
  end subroutine check_builtin_mlp

end program fortran_checks
