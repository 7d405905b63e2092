#!/usr/bin/env bash
# A private one-node Slurm on this machine (munged, slurmctld and slurmd as root, every file under
# one directory), for the tests of jobscripts/slurm.sbatch (tests/slurm, docs/slurm.md).
#   scripts/slurm-cluster.sh start DIR   install slurm and munge if missing (apt), write DIR/slurm.conf
#                                        from `slurmd -C`, start the three daemons, wait until the
#                                        node is idle; prints "slurm-cluster: up ..." (and creates
#                                        DIR/up, which the tests look for) and exits 0.
#                                        Exits 77 after "SKIPPED: <reason>" where they cannot run here
#                                        (not root, no apt, a daemon that does not come up).
#   scripts/slurm-cluster.sh stop DIR    stop the daemons started in DIR (by their pid files).
#   scripts/slurm-cluster.sh env DIR     print the environment the client commands need
#                                        (eval "$(scripts/slurm-cluster.sh env DIR)"; sbatch ...).
# Ports come from the free ones at start; the munge socket and the state live in DIR, so the
# machine's own /etc/slurm, /etc/munge and any running daemons are left alone.
set -euo pipefail

action=${1:-}
dir=${2:-}
if [ -z "$action" ] || [ -z "$dir" ]; then
  echo "usage: $0 start|stop|env DIR" >&2
  exit 2
fi
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

skip() {
  echo "SKIPPED: $*"
  exit 77
}

print_env() {
  echo "export SLURM_CONF=$dir/slurm.conf"
}

stop_daemons() {
  local name pid
  rm -f "$dir/up"
  # Jobs first (a test stopped half-way leaves its jobs running): the cluster is ours alone.
  if [ -f "$dir/slurmctld.pid" ] && [ -f "$dir/slurm.conf" ]; then
    export SLURM_CONF=$dir/slurm.conf
    # shellcheck disable=SC2046  # job ids
    scancel --quiet $(squeue -h -o %i 2>/dev/null) 2>/dev/null || true
    wait_for 20 no_jobs || echo "slurm-cluster: jobs still listed after 20 s: $(squeue -h 2>&1 | head -3)"
  fi
  for name in slurmd slurmctld munged; do
    [ -f "$dir/$name.pid" ] || continue
    pid=$(cat "$dir/$name.pid")
    rm -f "$dir/$name.pid"
    kill -TERM "$pid" 2>/dev/null || continue
    for _ in $(seq 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
  done
}

no_jobs() { [ -z "$(squeue -h -o %i 2>/dev/null)" ]; }

# Seconds-bounded wait for a condition (a command); 1 when it never held.
wait_for() {
  local seconds=$1
  shift
  local deadline=$((SECONDS + seconds))
  until "$@"; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.2
  done
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

case "$action" in
  env)
    print_env
    exit 0
    ;;
  stop)
    stop_daemons
    echo "slurm-cluster: stopped the daemons of $dir"
    exit 0
    ;;
  start) ;;
  *)
    echo "usage: $0 start|stop|env DIR" >&2
    exit 2
    ;;
esac

[ "$(id -u)" -eq 0 ] || skip "the test cluster runs its daemons as root; run the tests as root"
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null ||
  ! command -v munged >/dev/null; then
  command -v apt-get >/dev/null || skip "slurmctld, slurmd, sbatch or munged missing and no apt-get to install them"
  echo "slurm-cluster: installing slurmctld slurmd slurm-client munge"
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=300 \
    --no-install-recommends slurmctld slurmd slurm-client munge; } >"$dir/apt.log" 2>&1; then
    tail -5 "$dir/apt.log"
    skip "could not install slurm and munge (log: $dir/apt.log)"
  fi
fi

stop_daemons # a previous start in this directory that was never stopped
mkdir -p "$dir/state" "$dir/spool" "$dir/log"
chmod 700 "$dir"

# munge: a key of our own and a socket in DIR (slurm finds it through AuthInfo=socket=).
[ -f "$dir/munge.key" ] || head -c 1024 /dev/urandom >"$dir/munge.key"
chmod 600 "$dir/munge.key"
munged --force --key-file="$dir/munge.key" --socket="$dir/munge.socket" --pid-file="$dir/munged.pid" \
  --log-file="$dir/log/munged.log" --seed-file="$dir/munged.seed" >"$dir/log/munged.out" 2>&1 ||
  skip "munged does not start here: $(tail -1 "$dir/log/munged.out")"
wait_for 10 test -S "$dir/munge.socket" || skip "munged started but no socket appeared in $dir"

# One node: this machine as slurmd -C describes it.
node=$(slurmd -C | head -1)
node_name=$(sed -n 's/^NodeName=\([^ ]*\).*/\1/p' <<<"$node")
[ -n "$node_name" ] || skip "slurmd -C printed no NodeName line: $node"
node=${node%% UpTime=*}
ctld_port=$(free_port)
slurmd_port=$(free_port)
cat >"$dir/slurm.conf" <<EOF
# Written by scripts/slurm-cluster.sh: a private one-node cluster for the tests.
ClusterName=zerotrain-test
SlurmctldHost=$node_name(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
# Its own munge daemon; cred_expire (minimum 5 s) is also how long a requeued job waits.
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge.socket,cred_expire=5
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
# debug2 logs slurmctld's periodic time-limit checks, which the time-limit test reads.
SlurmctldDebug=debug2
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=2
ReturnToService=2
JobRequeue=1
KillWait=10
MinJobAge=600
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=test Nodes=$node_name Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
export SLURM_CONF=$dir/slurm.conf

# slurmctld -i: ignore state a previous cluster in DIR left; both daemons fork into the background.
slurmctld -i -f "$dir/slurm.conf" >"$dir/log/slurmctld.out" 2>&1 ||
  skip "slurmctld does not start here: $(tail -3 "$dir/log/slurmctld.out" "$dir/log/slurmctld.log" 2>/dev/null)"
slurmd -f "$dir/slurm.conf" >"$dir/log/slurmd.out" 2>&1 ||
  skip "slurmd does not start here: $(tail -3 "$dir/log/slurmd.out" "$dir/log/slurmd.log" 2>/dev/null)"
node_idle() {
  [ "$(sinfo -h -n "$node_name" -o %t 2>/dev/null)" = idle ]
}
if ! wait_for 30 node_idle; then
  state=$(sinfo -h -n "$node_name" -o '%t %E' 2>&1 || true)
  stop_daemons
  skip "the node $node_name did not become idle within 30 s (state: $state; logs in $dir/log)"
fi
touch "$dir/up"
echo "slurm-cluster: up in $dir: node $node_name (${node#NodeName="$node_name" }), slurmctld port $ctld_port"
