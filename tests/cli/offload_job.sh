# Sourced by the offload CLI scripts (offload_train.sh, swap_clean.sh): their arguments
# (ZEROTRAIN CONFIG MPIEXEC [MPIEXEC_FLAGS...]), a work directory under ZT_TEST_SWAP_DIR (or /tmp)
# with an empty swap/ inside, removed at exit, and fail(), which prints the logs and exits 1.
# usage: source offload_job.sh NAME "$@"
set -euo pipefail
job_name=$1
zt=$2 config=$3
shift 3
mpiexec=("$@")
work=$(mktemp -d "${ZT_TEST_SWAP_DIR:-/tmp}/zt-$job_name-XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir "$work/swap"
fail() {
  echo "FAIL: $*"
  for log in "$work"/*.txt; do echo "--- $log"; cat "$log"; done
  exit 1
}
