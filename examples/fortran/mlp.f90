! Train the MLP of examples/c/mlp_problem.h from Fortran through the module `zerotrain`: this
! program's own forward and backward over its own arrays, registered without copies; zerotrain
! reduces the gradients across the MPI ranks, partitions (ZeRO), updates and writes the values back.
! The same float operations in the same order as the C and C++ examples, so the same losses bit for
! bit (ctest examples.c_fortran.*).
!
! Column-major: w1(INPUTS, HIDDEN) here is the same memory as C's w1[HIDDEN][INPUTS]; the module
! registers it with the reversed shape [HIDDEN, INPUTS], so checkpoints match the C and C++ runs.
!
!   mpirun -n 2 build/bin/zt_example_fortran_mlp [steps] [zero stage] [more zero_optimization members]
program mlp
  use, intrinsic :: iso_c_binding
  use, intrinsic :: iso_fortran_env, only: int64, error_unit
  use mpi_f08
  use zerotrain
  implicit none

  integer, parameter :: INPUTS = 16, HIDDEN = 32, OUTPUTS = 4, MICRO_BATCH = 8
  real(c_float), target :: w1(INPUTS, HIDDEN), b1(HIDDEN), w2(HIDDEN, OUTPUTS), b2(OUTPUTS)
  real(c_float), target :: dw1(INPUTS, HIDDEN), db1(HIDDEN), dw2(HIDDEN, OUTPUTS), db2(OUTPUTS)
  real(c_float) :: x(INPUTS, MICRO_BATCH), y(OUTPUTS, MICRO_BATCH), scale
  type(zt_runtime) :: runtime
  type(zt_config) :: config
  type(zt_model) :: model
  type(zt_engine) :: engine
  type(zt_batch_sizes) :: batch
  type(zt_step_report) :: report
  integer :: provided, steps, stage, step, rank, r, argument_length
  integer(int64) :: micro, first
  character(len=16) :: number
  character(len=:), allocatable :: zero_extra, config_text, placement
  real(c_double) :: loss

  ! zerotrain needs MPI_THREAD_FUNNELED at least; MULTIPLE lets its watchdog catch hung collectives.
  call MPI_Init_thread(MPI_THREAD_MULTIPLE, provided)
  steps = 30
  stage = 1
  zero_extra = ""
  if (command_argument_count() >= 1) then
    call get_command_argument(1, number)
    read (number, *) steps
  end if
  if (command_argument_count() >= 2) then
    call get_command_argument(2, number)
    read (number, *) stage
  end if
  if (command_argument_count() >= 3) then
    call get_command_argument(3, length=argument_length)
    if (argument_length > 0) then
      deallocate (zero_extra)
      allocate (character(len=argument_length) :: zero_extra)
      call get_command_argument(3, zero_extra)
      zero_extra = ", " // zero_extra
    end if
  end if
  write (number, '(i0)') stage
  config_text = '{"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2, ' // &
                '"gradient_clipping": 0.0, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, ' // &
                '"zero_optimization": {"stage": ' // trim(number) // zero_extra // '}}'

  call init(w1, b1, w2, b2)
  dw1 = 0
  db1 = 0
  dw2 = 0
  db2 = 0
  call check(zt_runtime_create_from_comm(MPI_COMM_WORLD, runtime), "zt_runtime_create_from_comm")
  call check(zt_config_from_string(config_text, config), "zt_config_from_string")
  call check(zt_model_create_external(model), "zt_model_create_external")
  call check(zt_model_add_parameter(model, "w1", w1, dw1), "add w1")
  call check(zt_model_add_parameter(model, "b1", b1, db1), "add b1")
  call check(zt_model_add_parameter(model, "w2", w2, dw2), "add w2")
  call check(zt_model_add_parameter(model, "b2", b2, db2), "add b2")
  call check(zt_engine_create(runtime, model, config, engine), "zt_engine_create")
  call check(zt_engine_batch_sizes(engine, batch), "zt_engine_batch_sizes")
  call check(zt_runtime_rank(runtime, rank), "zt_runtime_rank")
  call check(zt_engine_placement(engine, placement), "zt_engine_placement")
  if (rank == 0) then
    write (*, '(a,i0,a,i0,a,i0,a,i0,a,i0,a,i0)') "mlp (Fortran): ", batch%data_parallel_size, &
      " ranks, ZeRO stage ", stage, ", batch ", batch%train_batch_size, " = ", batch%micro_batch_size, &
      " x ", batch%gradient_accumulation_steps, " x ", batch%data_parallel_size
    write (*, '(2a)') "rank 0: ", placement
  end if

  ! Rank r of N takes its slice of every global batch, as in the C example.
  scale = 1.0_c_float / real(batch%gradient_accumulation_steps, c_float)
  do step = 0, steps - 1
    do micro = 0, batch%gradient_accumulation_steps - 1
      first = step * batch%train_batch_size + &
              (micro * batch%data_parallel_size + batch%data_parallel_rank) * MICRO_BATCH
      do r = 1, MICRO_BATCH
        call sample(first + r - 1, x(:, r), y(:, r))
      end do
      loss = forward_backward(x, y, MICRO_BATCH, scale)
      call check(zt_model_report_loss(model, loss), "zt_model_report_loss")
      call check(zt_engine_step(engine), "zt_engine_step")  ! at the boundary: reduce, update, write back
    end do
    call check(zt_engine_last_step(engine, report), "zt_engine_last_step")
    if (rank == 0) write (*, '(a,i3,a,f8.6,a,z16.16)') "step ", report%step, " loss ", report%loss, " bits ", &
      transfer(report%loss, 0_int64)
  end do

  call check(zt_engine_destroy(engine), "zt_engine_destroy")
  call check(zt_model_destroy(model), "zt_model_destroy")
  call check(zt_config_destroy(config), "zt_config_destroy")
  call check(zt_runtime_destroy(runtime), "zt_runtime_destroy")
  call MPI_Finalize()

contains

  !> Any failure: print the library's message and end the whole job.
  subroutine check(status, what)
    integer(c_int), intent(in) :: status
    character(len=*), intent(in) :: what
    if (status == ZT_STATUS_OK) return
    write (error_unit, '(5a)') what, " failed: ", zt_status_name(status), ": ", zt_last_error()
    call MPI_Abort(MPI_COMM_WORLD, 1)
  end subroutine check

  !> Sample `id`'s features and targets (the formulas of mlp_problem.h; indices there are 0-based).
  subroutine sample(id, features, targets)
    integer(int64), intent(in) :: id
    real(c_float), intent(out) :: features(INPUTS), targets(OUTPUTS)
    integer(int64) :: j, o, h
    real(c_float) :: total
    do j = 0, INPUTS - 1
      h = mod(id * 2654435761_int64 + j * 40503_int64 + 7_int64, 1000003_int64)
      features(j + 1) = real(h, c_float) / 1000003.0_c_float * 2.0_c_float - 1.0_c_float
    end do
    do o = 0, OUTPUTS - 1
      total = 0.0_c_float
      do j = 0, INPUTS - 1
        total = total + real(mod(o * 31 + j * 17, 13_int64) - 6, c_float) * 0.08_c_float * features(j + 1)
      end do
      targets(o + 1) = tanh(total)
    end do
  end subroutine sample

  subroutine init(w1, b1, w2, b2)
    real(c_float), intent(out) :: w1(INPUTS, HIDDEN), b1(HIDDEN), w2(HIDDEN, OUTPUTS), b2(OUTPUTS)
    integer :: h, i, o
    do h = 0, HIDDEN - 1
      do i = 0, INPUTS - 1
        w1(i + 1, h + 1) = real(mod(h * 7 + i * 13 + 1, 23) - 11, c_float) * 0.03_c_float
      end do
      b1(h + 1) = 0.0_c_float
    end do
    do o = 0, OUTPUTS - 1
      do h = 0, HIDDEN - 1
        w2(h + 1, o + 1) = real(mod(o * 11 + h * 5 + 3, 19) - 9, c_float) * 0.05_c_float
      end do
      b2(o + 1) = 0.0_c_float
    end do
  end subroutine init

  !> Mean squared error of `rows` samples; gradients of (loss * scale) accumulate into dw1 .. db2.
  real(c_double) function forward_backward(x, y, rows, scale) result(loss)
    integer, intent(in) :: rows
    real(c_float), intent(in) :: x(INPUTS, rows), y(OUTPUTS, rows), scale
    real(c_float) :: activation(HIDDEN), dactivation(HIDDEN), dout(OUTPUTS), total, error, count, dpre
    integer :: r, h, i, o
    count = real(rows * OUTPUTS, c_float)
    loss = 0.0_c_double
    do r = 1, rows
      do h = 1, HIDDEN
        total = b1(h)
        do i = 1, INPUTS
          total = total + w1(i, h) * x(i, r)
        end do
        activation(h) = tanh(total)
      end do
      do o = 1, OUTPUTS
        total = b2(o)
        do h = 1, HIDDEN
          total = total + w2(h, o) * activation(h)
        end do
        error = total - y(o, r)
        loss = loss + real(error, c_double) * real(error, c_double) / real(count, c_double)
        dout(o) = 2.0_c_float * error / count * scale
      end do
      dactivation = 0.0_c_float
      do o = 1, OUTPUTS
        db2(o) = db2(o) + dout(o)
        do h = 1, HIDDEN
          dw2(h, o) = dw2(h, o) + dout(o) * activation(h)
          dactivation(h) = dactivation(h) + dout(o) * w2(h, o)
        end do
      end do
      do h = 1, HIDDEN
        dpre = dactivation(h) * (1.0_c_float - activation(h) * activation(h))
        db1(h) = db1(h) + dpre
        do i = 1, INPUTS
          dw1(i, h) = dw1(i, h) + dpre * x(i, r)
        end do
      end do
    end do
  end function forward_backward

end program mlp
