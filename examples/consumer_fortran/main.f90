! The smallest Fortran program that trains with an installed zerotrain through the module
! `zerotrain`: the fit of examples/consumer_c (y = 2x - 1, each rank its slice of the data, its own
! forward and backward, zerotrain reducing and updating at ZeRO stage 1). Built by CMakeLists.txt
! with find_package(zerotrain COMPONENTS Fortran) in a Fortran-only project. Exit code 0 when the
! fit converged and the ranks agree.
program consumer_fortran
  use, intrinsic :: iso_c_binding
  use, intrinsic :: iso_fortran_env, only: error_unit
  use mpi_f08
  use zerotrain
  implicit none

  integer, parameter :: SAMPLES_PER_RANK = 16, STEPS = 300
  real(c_float), target :: line(2), dline(2)  ! slope, intercept and their gradients
  real(c_float) :: reference(2), x, error
  type(zt_runtime) :: runtime
  type(zt_config) :: config
  type(zt_model) :: model
  type(zt_engine) :: engine
  type(zt_step_report) :: report
  integer :: provided, rank, size, step, i
  logical :: converged, differs, any_differs
  real(c_double) :: loss, first_loss, last_loss

  call MPI_Init_thread(MPI_THREAD_MULTIPLE, provided)  ! zerotrain needs FUNNELED at least
  call MPI_Comm_rank(MPI_COMM_WORLD, rank)
  call MPI_Comm_size(MPI_COMM_WORLD, size)
  line = 0
  dline = 0
  call check(zt_runtime_create_from_comm(MPI_COMM_WORLD, runtime), "zt_runtime_create_from_comm")
  call check(zt_config_from_string('{"train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 1, ' // &
                                   '"optimizer": {"type": "AdamW", "params": {"lr": 0.05}}, ' // &
                                   '"zero_optimization": {"stage": 1}}', config), "zt_config_from_string")
  call check(zt_model_create_external(model), "zt_model_create_external")
  call check(zt_model_add_parameter(model, "line", line, dline), "zt_model_add_parameter")
  call check(zt_engine_create(runtime, model, config, engine), "zt_engine_create")

  first_loss = 0
  last_loss = 0
  do step = 1, STEPS
    loss = 0
    do i = 0, SAMPLES_PER_RANK - 1
      x = -1.0_c_float + 2.0_c_float * real(rank * SAMPLES_PER_RANK + i, c_float) / &
                           real(size * SAMPLES_PER_RANK, c_float)
      error = line(1) * x + line(2) - (2.0_c_float * x - 1.0_c_float)
      loss = loss + real(error, c_double)**2 / SAMPLES_PER_RANK
      dline(1) = dline(1) + 2.0_c_float * error * x / SAMPLES_PER_RANK
      dline(2) = dline(2) + 2.0_c_float * error / SAMPLES_PER_RANK
    end do
    call check(zt_model_report_loss(model, loss), "zt_model_report_loss")
    call check(zt_engine_step(engine), "zt_engine_step")
    call check(zt_engine_last_step(engine, report), "zt_engine_last_step")
    if (step == 1) first_loss = report%loss
    last_loss = report%loss
  end do

  ! Every rank holds the same updated values: compare with rank 0's.
  reference = line
  call MPI_Bcast(reference, 2, MPI_REAL, 0, MPI_COMM_WORLD)
  differs = any(reference /= line)
  call MPI_Allreduce(differs, any_differs, 1, MPI_LOGICAL, MPI_LOR, MPI_COMM_WORLD)
  converged = abs(line(1) - 2.0_c_float) < 0.05_c_float .and. abs(line(2) + 1.0_c_float) < 0.05_c_float
  if (rank == 0) then
    write (*, '(3a,i0,a,i0,a,f6.4,a,f8.6,a,f5.3,a,sp,f6.3)') "consumer_fortran: zerotrain ", zt_version(), &
      " (C API ", zt_api_version(), "), ", size, " ranks, loss ", first_loss, " -> ", last_loss, &
      ", y = ", line(1), " x ", line(2)
    if (.not. converged) write (*, '(a)') "consumer_fortran: NOT CONVERGED"
    if (any_differs) write (*, '(a)') "consumer_fortran: THE RANKS DIFFER"
  end if

  call check(zt_engine_destroy(engine), "zt_engine_destroy")
  call check(zt_model_destroy(model), "zt_model_destroy")
  call check(zt_config_destroy(config), "zt_config_destroy")
  call check(zt_runtime_destroy(runtime), "zt_runtime_destroy")
  call MPI_Finalize()
  if (.not. converged .or. any_differs) error stop 1

contains

  !> Any failure: print the library's message and end the whole job.
  subroutine check(status, what)
    integer(c_int), intent(in) :: status
    character(len=*), intent(in) :: what
    if (status == ZT_STATUS_OK) return
    write (error_unit, '(5a)') "consumer_fortran: ", what, " failed: ", zt_status_name(status), ": ", zt_last_error()
    call MPI_Abort(MPI_COMM_WORLD, 1)
  end subroutine check

end program consumer_fortran
