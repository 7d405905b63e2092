# `zerotrain` as a command-line tool (included by tests/cli/CMakeLists.txt; docs/cli.md): every
# command's usage (--help, help COMMAND), the version, and usage errors: exit 2 with one line, on
# one process and under mpiexec, without MPI_Abort's banner. The MPI job tests expect a failure, so
# they run without the tests' watchdog timeout (a hang cannot pass for exit 2 either).

# Every command's own page, not the global one: "usage: zerotrain COMMAND ...", its summary.
set(zt_usage_commands report train estimate plan "data convert" "checkpoint inspect" "checkpoint verify"
    "checkpoint export" "checkpoint import" "swap list" "swap clean" plot help version)
foreach(command IN LISTS zt_usage_commands)
  string(REPLACE " " "_" id "${command}")
  separate_arguments(words UNIX_COMMAND "${command}")
  set(page "^usage: zerotrain ${command}( [^\n]*)?\n[A-Z][^\n]*\\.\n")
  zt_add_checked_test(cli.help.${id} TIMEOUT 60 COMMAND ${zt_cli} ${words} --help EXPECT "${page}"
                      ABSENT "\ncommands:\n")
  zt_add_checked_test(cli.help_command.${id} TIMEOUT 60 COMMAND ${zt_cli} help ${words} EXPECT "${page}"
                      ABSENT "\ncommands:\n")
  set_tests_properties(cli.help.${id} cli.help_command.${id} PROPERTIES LABELS "cli;usage")
endforeach()
zt_add_checked_test(cli.help.train_options TIMEOUT 60 COMMAND ${zt_cli} train --config x.json -h
  EXPECT "^usage: zerotrain train --config FILE \\[options\\]\n" "\n  --peak-flops F  " "\n  --save-dir DIR  "
         "\nExit status: 0 done; 2 bad arguments or config \\(every rank, no abort\\); 74 "
  ABSENT "\ncommands:\n")
zt_add_checked_test(cli.help.checkpoint_export_options TIMEOUT 60 COMMAND ${zt_cli} checkpoint export --help
  EXPECT "\n  --out FILE\\.h5  " "\n  --dtype fp32\\|bf16  " "3 not found\\.\n$")
# Groups: their subcommands; the global page: every command.
foreach(group checkpoint swap data)
  zt_add_checked_test(cli.help.${group} TIMEOUT 60 COMMAND ${zt_cli} ${group} --help
    EXPECT "^usage: zerotrain ${group} <[a-z|]+> \\.\\.\\.\n\n  zerotrain ${group} [a-z]+ ")
  zt_add_checked_test(cli.help_command.${group} TIMEOUT 60 COMMAND ${zt_cli} help ${group}
    EXPECT "^usage: zerotrain ${group} <[a-z|]+> \\.\\.\\.\n\n  zerotrain ${group} [a-z]+ ")
  set_tests_properties(cli.help.${group} cli.help_command.${group} PROPERTIES LABELS "cli;usage")
endforeach()
set(zt_global_page "^usage: zerotrain <command> \\[options\\]\n\ncommands:\n  report  +[^\n]+\n  train  +[^\n]+\n(  [a-z ]+[^\n]+\n)*  version  +[^\n]+\n")
foreach(case "flag;--help" "short;-h" "command;help")
  list(GET case 0 id)
  list(GET case 1 word)
  zt_add_checked_test(cli.help.global_${id} TIMEOUT 60 COMMAND ${zt_cli} ${word} EXPECT "${zt_global_page}")
  set_tests_properties(cli.help.global_${id} PROPERTIES LABELS "cli;usage")
endforeach()
# Under mpiexec: printed once (rank 0), before MPI starts, so mpirun has nothing to add.
zt_add_checked_test(cli.help.train.np2 TIMEOUT 60
  COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${ZT_MPIEXEC_EXTRA_FLAGS} ${zt_cli} train --help
  EXPECT "^usage: zerotrain train --config FILE \\[options\\]\n"
  ABSENT "usage: zerotrain train .*usage: zerotrain train " "mpirun|MPI_ABORT|Primary job")
string(REPLACE "." "\\." zt_version_regex "${PROJECT_VERSION}")
zt_add_checked_test(cli.version TIMEOUT 60 COMMAND ${zt_cli} --version EXPECT "^zerotrain ${zt_version_regex}\n$")
zt_add_checked_test(cli.version_command TIMEOUT 60 COMMAND ${zt_cli} version EXPECT "^zerotrain ${zt_version_regex}\n$")
zt_add_checked_test(cli.no_arguments TIMEOUT 60 EXIT_CODE 2 COMMAND ${zt_cli} EXPECT "${zt_global_page}")
zt_add_checked_test(cli.no_arguments.np2 TIMEOUT 60 EXIT_CODE 2
  COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${ZT_MPIEXEC_EXTRA_FLAGS} ${zt_cli}
  EXPECT "${zt_global_page}" ABSENT "commands:.*commands:" "MPI_ABORT")
set_tests_properties(cli.help.train_options cli.help.checkpoint_export_options cli.help.train.np2 cli.version
                     cli.version_command cli.no_arguments cli.no_arguments.np2 PROPERTIES LABELS "cli;usage")
set_tests_properties(cli.help.train.np2 cli.no_arguments.np2 PROPERTIES ENVIRONMENT "OMP_WAIT_POLICY=passive")

# zt_add_usage_error(<name> LINE <regex> [MPI] ARGS <arguments>...): `zerotrain ARGS` exits 2 and
# prints the line LINE matches, and nothing else (cli.usage.<name>). With MPI, also under mpiexec
# -n 2 and 4 (.np2, .np4): exit 2, the line once and first, no MPI_Abort or fatal-error report;
# and, with Open MPI's mpirun --quiet (.np2_quiet, .np4_quiet), the line and nothing else: what
# remains without --quiet is mpirun's own notice of a non-zero exit, which no process can avoid.
function(zt_add_usage_error name)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "MPI" "LINE" "ARGS")
  zt_add_checked_test(cli.usage.${name} TIMEOUT 60 EXIT_CODE 2 COMMAND ${zt_cli} ${ARG_ARGS}
                      EXPECT "^${ARG_LINE}\n$")
  set_tests_properties(cli.usage.${name} PROPERTIES LABELS "cli;usage")
  if(NOT ARG_MPI)
    return()
  endif()
  foreach(ranks 2 4)
    set(mpiexec ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${ranks} ${ZT_MPIEXEC_EXTRA_FLAGS})
    zt_add_checked_test(cli.usage.${name}.np${ranks} TIMEOUT 60 EXIT_CODE 2 COMMAND ${mpiexec} ${zt_cli} ${ARG_ARGS}
      EXPECT "^${ARG_LINE}\n" ABSENT "${ARG_LINE}.*${ARG_LINE}" "MPI_ABORT" "fatal error" "aborting")
    set(tests cli.usage.${name}.np${ranks})
    if(ZT_MPIEXEC_IS_OPEN_MPI)
      zt_add_checked_test(cli.usage.${name}.np${ranks}_quiet TIMEOUT 60 EXIT_CODE 2
        COMMAND ${mpiexec} --quiet ${zt_cli} ${ARG_ARGS} EXPECT "^${ARG_LINE}\n$")
      list(APPEND tests cli.usage.${name}.np${ranks}_quiet)
    endif()
    set_tests_properties(${tests} PROPERTIES LABELS "cli;usage;mpi;np${ranks}" PROCESSORS 2
                         ENVIRONMENT "OMP_WAIT_POLICY=passive")
  endforeach()
endfunction()

set(zt_tiny ${zt_configs}/gpt-tiny.json)
file(READ ${zt_tiny} zt_usage_config)
string(JSON zt_usage_config SET "${zt_usage_config}" train_batch_size "\"x\"")
file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/bad-value.json "${zt_usage_config}\n")
zt_add_usage_error(unknown_option MPI ARGS train --config ${zt_tiny} --stpes 5
  LINE "zerotrain train: unknown option '--stpes' \\(see 'zerotrain train --help'\\)")
zt_add_usage_error(missing_config MPI ARGS train --steps 5
  LINE "zerotrain train: needs --config FILE \\(see 'zerotrain train --help'\\)")
zt_add_usage_error(bad_number MPI ARGS train --config ${zt_tiny} --steps 5x
  LINE "zerotrain train: --steps expects an integer >= 0, got '5x' \\(see 'zerotrain train --help'\\)")
# Read by every rank before MPI starts; rank 0 prints it.
zt_add_usage_error(bad_config_value MPI ARGS train --config ${CMAKE_CURRENT_BINARY_DIR}/bad-value.json
  LINE "zerotrain train: config file '[^'\n]*/bad-value\\.json': train_batch_size: expected a positive integer, got \"x\"")
zt_add_usage_error(missing_value ARGS train --config ${zt_tiny} --steps
  LINE "zerotrain train: option '--steps' needs a value \\(see 'zerotrain train --help'\\)")
zt_add_usage_error(option_twice ARGS train --config ${zt_tiny} --steps 1 --steps=2
  LINE "zerotrain train: option '--steps' given twice \\(see 'zerotrain train --help'\\)")
zt_add_usage_error(out_of_range ARGS train --config ${zt_tiny} --print-every -1
  LINE "zerotrain train: --print-every -1 is out of range: expected an integer >= 0 \\(see 'zerotrain train --help'\\)")
zt_add_usage_error(bad_peak_flops ARGS train --config ${zt_tiny} --peak-flops fast
  LINE "zerotrain train: --peak-flops expects a number > 0 \\(such as 989e12\\), got 'fast' \\(see 'zerotrain train --help'\\)")
zt_add_usage_error(bad_device ARGS train --config ${zt_tiny} --device gpu
  LINE "zerotrain train: --device gpu: expected host, cuda, auto \\(this rank's GPU when one is usable, else the host\\) or emulated \\(a stand-in device whose memory only the device API may touch, for testing\\) \\(see 'zerotrain train --help'\\)")
zt_add_usage_error(missing_config_file ARGS train --config ${CMAKE_CURRENT_BINARY_DIR}/no-such.json
  LINE "zerotrain train: config file '[^'\n]*/no-such\\.json': cannot open: no such file")
zt_add_usage_error(unknown_command ARGS trian --config ${zt_tiny}
  LINE "zerotrain: unknown command 'trian' \\(see 'zerotrain help'\\)")
zt_add_usage_error(missing_subcommand ARGS swap
  LINE "zerotrain swap: missing subcommand: one of list, clean \\(see 'zerotrain swap --help'\\)")
zt_add_usage_error(help_unknown ARGS help trian
  LINE "zerotrain help: no command 'trian' \\(see 'zerotrain help'\\)")
zt_add_usage_error(estimate_extra_argument ARGS estimate --config ${zt_tiny} --world-size 2 extra
  LINE "zerotrain estimate: unexpected argument 'extra' \\(see 'zerotrain estimate --help'\\)")
zt_add_usage_error(data_convert_missing_output ARGS data convert in.txt
  LINE "zerotrain data convert: missing OUTPUT\\.bin \\(expected INPUT OUTPUT\\.bin\\) \\(see 'zerotrain data convert --help'\\)")
zt_add_usage_error(version_argument ARGS version 2
  LINE "zerotrain version: unexpected argument '2' \\(see 'zerotrain version --help'\\)")

# Warnings of `zerotrain train`, each on a 1- or 2-step run of gpt-tiny that succeeds: a Slurm
# allocation of 4 tasks run as one process (a forgotten srun), none when the srun step has one
# task, the srun tasks that are singletons (MPI not wired to srun's PMI); --steps past the
# schedule's total_num_steps, with the lr its steps then get, as the progress lines show.
set(zt_one_step ${zt_cli} train --config ${zt_tiny} --steps 1 --peak-flops 1e11)
zt_add_checked_test(cli.warn.forgotten_srun TIMEOUT 120 COMMAND ${zt_one_step}
  EXPECT "zerotrain train: warning: the Slurm allocation has 4 tasks \\(SLURM_NTASKS=4\\) but zerotrain runs as one process: start it with `srun zerotrain train \\.\\.\\.` \\(or mpirun\\)"
         "zerotrain train: 1 steps, loss ")
set_tests_properties(cli.warn.forgotten_srun PROPERTIES ENVIRONMENT "OMP_WAIT_POLICY=passive;SLURM_NTASKS=4")
zt_add_checked_test(cli.warn.forgotten_srun_nprocs TIMEOUT 120 COMMAND ${zt_one_step}
  EXPECT "zerotrain train: warning: the Slurm allocation has 3 tasks \\(SLURM_NPROCS=3\\)" "zerotrain train: 1 steps")
set_tests_properties(cli.warn.forgotten_srun_nprocs PROPERTIES ENVIRONMENT "OMP_WAIT_POLICY=passive;SLURM_NPROCS=3")
zt_add_checked_test(cli.warn.srun_one_task TIMEOUT 120 COMMAND ${zt_one_step}
  EXPECT "zerotrain train: 1 steps, loss " ABSENT "warning")
set_tests_properties(cli.warn.srun_one_task PROPERTIES ENVIRONMENT
  "OMP_WAIT_POLICY=passive;SLURM_NTASKS=4;SLURM_STEP_NUM_TASKS=1;SLURM_STEP_ID=0;SLURM_PROCID=0")
zt_add_checked_test(cli.warn.srun_singletons TIMEOUT 120 COMMAND ${zt_one_step}
  EXPECT "zerotrain train: warning: srun started 3 tasks \\(SLURM_STEP_NUM_TASKS=3\\) but MPI sees one process in each[^\n]*srun --mpi=pmix"
         "zerotrain train: 1 steps")
set_tests_properties(cli.warn.srun_singletons PROPERTIES ENVIRONMENT
  "OMP_WAIT_POLICY=passive;SLURM_NTASKS=3;SLURM_STEP_NUM_TASKS=3;SLURM_STEP_ID=0;SLURM_PROCID=0")
zt_add_checked_test(cli.warn.mpirun_in_allocation TIMEOUT 120
  COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${ZT_MPIEXEC_EXTRA_FLAGS} ${zt_one_step}
  EXPECT "zerotrain train: 1 steps, loss " ABSENT "warning")
set_tests_properties(cli.warn.mpirun_in_allocation PROPERTIES PROCESSORS 2 ENVIRONMENT
                     "${ZT_MPI_TEST_ENVIRONMENT};SLURM_NTASKS=4")

file(READ ${zt_tiny} zt_decay_config)
string(JSON zt_decay_config SET "${zt_decay_config}" scheduler
       "{\"type\": \"WarmupDecayLR\", \"params\": {\"total_num_steps\": 3, \"warmup_num_steps\": 2, \"warmup_max_lr\": 0.001}}")
file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/decay-3-steps.json "${zt_decay_config}\n")
file(READ ${zt_tiny} zt_cosine_config)
string(JSON zt_cosine_config SET "${zt_cosine_config}" scheduler
       "{\"type\": \"WarmupCosineLR\", \"params\": {\"total_num_steps\": 3, \"warmup_num_steps\": 2}}")
file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/cosine-3-steps.json "${zt_cosine_config}\n")
zt_add_checked_test(cli.warn.steps_past_schedule TIMEOUT 120
  COMMAND ${zt_cli} train --config ${CMAKE_CURRENT_BINARY_DIR}/decay-3-steps.json --steps 5 --print-every 1
          --peak-flops 1e11
  EXPECT "zerotrain train: warning: --steps 5 goes past the end of the WarmupDecayLR schedule \\(scheduler\\.params\\.total_num_steps = 3\\): steps 4\\.\\.5 train with lr 1\\.000e-03 \\(step 4\\) to 0\\.000e\\+00 \\(step 5\\)\n"
         "\nstep +4/5 \\| loss [0-9.]+ \\| lr 1\\.000e-03 \\|" "\nstep +5/5 \\| loss [0-9.]+ \\| lr 0\\.000e\\+00 \\|")
zt_add_checked_test(cli.warn.steps_past_cosine_schedule TIMEOUT 120
  COMMAND ${zt_cli} train --config ${CMAKE_CURRENT_BINARY_DIR}/cosine-3-steps.json --steps 5 --print-every 1
          --peak-flops 1e11
  EXPECT "zerotrain train: warning: --steps 5 goes past the end of the WarmupCosineLR schedule \\(scheduler\\.params\\.total_num_steps = 3\\): steps 4\\.\\.5 all train with lr 2\\.000e-07, the value it ends at\n"
         "\nstep +4/5 \\| loss [0-9.]+ \\| lr 2\\.000e-07 \\|" "\nstep +5/5 \\| loss [0-9.]+ \\| lr 2\\.000e-07 \\|")
zt_add_checked_test(cli.warn.steps_within_schedule TIMEOUT 120
  COMMAND ${zt_cli} train --config ${CMAKE_CURRENT_BINARY_DIR}/decay-3-steps.json --steps 3 --peak-flops 1e11
  EXPECT "zerotrain train: 3 steps, loss " ABSENT "warning: --steps")
set_tests_properties(cli.warn.forgotten_srun cli.warn.forgotten_srun_nprocs cli.warn.srun_one_task
                     cli.warn.srun_singletons cli.warn.mpirun_in_allocation cli.warn.steps_past_schedule
                     cli.warn.steps_past_cosine_schedule cli.warn.steps_within_schedule PROPERTIES LABELS "cli;usage")
set_tests_properties(cli.warn.steps_past_schedule cli.warn.steps_past_cosine_schedule cli.warn.steps_within_schedule
                     PROPERTIES ENVIRONMENT "OMP_WAIT_POLICY=passive")

# The progress line and the MFU against the metrics: --peak-flops on one rank (GPT and MLP), the
# matmul probe on two (tests/cli/check_progress.py).
if(ZT_PYTHON3)
  zt_add_checked_test(cli.progress TIMEOUT 300
    COMMAND ${ZT_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/check_progress.py ${zt_cli} ${zt_configs}
            ${CMAKE_CURRENT_BINARY_DIR}/progress ${MPIEXEC_EXECUTABLE} ${ZT_MPIEXEC_EXTRA_FLAGS}
    EXPECT "PASS: progress")
  set_tests_properties(cli.progress PROPERTIES LABELS "cli;mpi;metrics" PROCESSORS 2
                       ENVIRONMENT "${ZT_MPI_TEST_ENVIRONMENT}")
endif()
