#!/usr/bin/env bash
# `zerotrain report` says what Open MPI really has and uses (ctest cli.report_ucx): the UCX line
# agrees with ompi_info's component list, and "pml in use" follows the pml that mpirun selects
# (the default, ob1 forced, ucx forced).
# usage: report_ucx.sh ZEROTRAIN CONFIG MPIEXEC [MPIEXEC_FLAGS...]
source "$(dirname "$0")/offload_job.sh" report-ucx "$@"
report() {  # report NAME [MCA FLAGS...]
  local name=$1
  shift
  "${mpiexec[@]}" -n 2 "$@" "$zt" report >"$work/$name.txt" 2>&1 || fail "the $name report failed"
}
line() { grep -E "^  $2: " "$work/$1.txt" || fail "$1: no '$2' line"; }

command -v ompi_info >/dev/null || { echo "skipped: no ompi_info (not Open MPI)"; exit 77; }
report default
if ompi_info | grep -q "MCA pml: ucx"; then
  line default UCX | grep -q "available (Open MPI component pml ucx" || fail "default: UCX not reported available"
  default_pml=$(line default "pml in use" | awk '{print $NF}')
  ompi_info | grep -q "MCA pml: $default_pml " || fail "default: pml '$default_pml' is not an Open MPI pml"
  if [ "$default_pml" != ucx ]; then
    line default UCX | grep -q "not in use" || fail "default: UCX said in use while the pml is $default_pml"
  fi
  report ob1 --mca pml ob1
  line ob1 "pml in use" | grep -Eq " ob1$" || fail "--mca pml ob1: pml not reported as ob1"
  line ob1 UCX | grep -q 'not in use (the pml setting in force is "ob1")' || fail "--mca pml ob1: UCX line"
  report ucx --mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any
  line ucx "pml in use" | grep -Eq " ucx$" || fail "--mca pml ucx: pml not reported as ucx"
  line ucx UCX | grep -Eq "UCX [0-9]+\.[0-9]+.*, in use$" || fail "--mca pml ucx: UCX not in use with its version"
else
  line default UCX | grep -q "not available" || fail "UCX reported available while ompi_info lists no pml ucx"
fi
echo "PASS: report_ucx"
