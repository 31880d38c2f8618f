#!/usr/bin/env bash
# A real Slurm on this machine, for the `slurm` tests and for trying `cluster=slurm_cpu` by hand.
#
#   scripts/slurm_local.sh up [--nodes N]  # install slurm-wlm + munge if missing, start, wait idle
#   scripts/slurm_local.sh status          # the nodes, and the SLURM_CONF line to export
#   scripts/slurm_local.sh down            # stop every daemon this script started
#
# Everything lives in one folder ($RLEXP_SLURM_DIR, default /tmp/rlexp-slurm): its own munge key
# and socket, its own slurm.conf (`export SLURM_CONF=$RLEXP_SLURM_DIR/slurm.conf` points Slurm's
# commands at it), state, spool and logs, and ports from $RLEXP_SLURM_PORT (default 6917:
# slurmctld; node i listens on PORT+i), so it neither reads nor changes a site's Slurm or munge.
# There is no systemd here: the daemons are started by hand, as root (SlurmUser=root), without
# cgroups (proctrack/linuxproc, task/none) and without accounting.
#
# N > 1 nodes are emulated on this one host with Slurm's multiple-slurmd support (one slurmd per
# node, each with its own Port, all with NodeAddr 127.0.0.1). Each emulated node declares this
# host's real core count and ~90% of its memory, so N nodes oversubscribe the machine N times
# (OverSubscribe=NO still holds per node): fine for tests, which ask for whole nodes, one job per
# node; meaningless as a capacity. `up` with another N than the running one restarts.
set -euo pipefail

DIR=${RLEXP_SLURM_DIR:-/tmp/rlexp-slurm}
PORT=${RLEXP_SLURM_PORT:-6917}
CONF=$DIR/slurm.conf
export SLURM_CONF=$CONF
HOST=$(hostname -s)

die() { echo "slurm_local: $*" >&2; exit 1; }

install_packages() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
    && return
  [ "$(id -u)" = 0 ] || die "slurm-wlm/munge are not installed and this is not root: install them \
(apt-get install slurm-wlm munge) or run as root"
  command -v apt-get >/dev/null \
    || die "slurm-wlm/munge are not installed and there is no apt-get to install them"
  echo "slurm_local: installing slurm-wlm and munge (apt-get)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
}

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

running_nodes() { # the N of the running setup, or 0
  [ -f "$DIR/nodes" ] && pid_alive "$DIR/run/slurmctld.pid" && cat "$DIR/nodes" || echo 0
}

write_conf() { # $1: nodes
  local n=$1 cpus mem i
  cpus=$(nproc)
  mem=$(awk '/MemTotal/ {printf "%d", $2 / 1024 * 0.9}' /proc/meminfo)
  mkdir -p "$DIR"/{munge,state,spool,run,log}
  chmod 700 "$DIR/munge"
  if [ ! -s "$DIR/munge/munge.key" ]; then
    head -c 1024 /dev/urandom >"$DIR/munge/munge.key"
    chmod 400 "$DIR/munge/munge.key"
  fi
  cat >"$CONF" <<EOF
# Written by scripts/slurm_local.sh: a local test cluster ($n node(s) on $HOST), not a site's.
ClusterName=rlexp
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
# A cancelled job's processes get SIGTERM, then SIGKILL KillWait seconds later.
KillWait=5
# A job submitted within batch_sched_delay (default 3 s) of the scheduler's last pass waits for the
# next one: every test run that follows another's end would sit out up to 3 s before it starts.
SchedulerParameters=batch_sched_delay=0
MinJobAge=120
SlurmdTimeout=60
InactiveLimit=0
EOF
  for i in $(seq 1 "$n"); do
    echo "NodeName=n$i NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$((PORT + i))" \
      "CPUs=$cpus RealMemory=$mem State=UNKNOWN" >>"$CONF"
  done
  echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP" \
    "OverSubscribe=NO" >>"$CONF"
  echo "$n" >"$DIR/nodes"
}

wait_idle() { # $1: nodes
  local n=$1 idle
  for _ in $(seq 1 300); do
    idle=$(sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l || true)
    [ "$idle" -ge "$n" ] && return 0
    sleep 0.2
  done
  sinfo -N 2>&1 >&2 || true
  tail -n 20 "$DIR"/log/*.log >&2 || true
  die "the $n node(s) did not become idle in 60 s (logs above, all in $DIR/log)"
}

up() {
  local n=1
  while [ $# -gt 0 ]; do
    case $1 in
      --nodes) n=${2:?--nodes needs a number}; shift 2 ;;
      --nodes=*) n=${1#--nodes=}; shift ;;
      *) die "unknown option $1 (up [--nodes N])" ;;
    esac
  done
  [[ $n =~ ^[1-9][0-9]?$ ]] || die "--nodes must be a number from 1 to 99, got '$n'"
  local up=0
  # sinfo only where our slurmctld runs: without one it retries for ~10 s (MessageTimeout) first.
  if [ "$(running_nodes)" = "$n" ]; then
    up=$(sinfo -h -N -t idle,alloc,mix -o %N 2>/dev/null | sort -u | wc -l || true)
  fi
  if [ "$(running_nodes)" = "$n" ] && [ "$up" -ge "$n" ]; then
    status
    return
  fi
  [ "$(running_nodes)" = 0 ] || down
  install_packages
  write_conf "$n"
  munged --force --socket="$DIR/munge/munge.socket" --key-file="$DIR/munge/munge.key" \
    --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" \
    --seed-file="$DIR/munge/munged.seed"
  # -i: ignore saved state (a fresh cluster, job ids from 1); the daemons fork into the background.
  slurmctld -i
  for i in $(seq 1 "$n"); do slurmd -N "n$i"; done
  wait_idle "$n"
  status
}

stop_pidfiles() { # $@: pid files; SIGTERM to all at once (each takes 1-2 s to exit), then
  # SIGKILL to any still alive after 10 s
  local f pids=() pid
  for f in "$@"; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    kill -0 "$pid" 2>/dev/null && kill "$pid" 2>/dev/null && pids+=("$pid")
  done
  for _ in $(seq 1 100); do any_alive "${pids[@]}" || break; sleep 0.1; done
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  rm -f "$@"
}

any_alive() { local pid; for pid; do kill -0 "$pid" 2>/dev/null && return 0; done; return 1; }

down() {
  [ -d "$DIR/run" ] || { echo "slurm_local: not running ($DIR)"; return; }
  # Jobs first, so their processes end with SIGTERM as on a real cluster, then the daemons.
  if pid_alive "$DIR/run/slurmctld.pid"; then
    scancel --full --quiet --user="$(id -un)" 2>/dev/null || true
    for _ in $(seq 1 75); do
      [ -z "$(squeue -h -t R,CG,PD -o %i 2>/dev/null)" ] && break
      sleep 0.2
    done
  fi
  # All together: the jobs are gone, so no daemon has a message left to authenticate with munged.
  stop_pidfiles "$DIR"/run/slurmd.*.pid "$DIR/run/slurmctld.pid" "$DIR/run/munged.pid"
  rm -f "$DIR/nodes"
  echo "slurm_local: stopped (config and logs kept in $DIR)"
}

status() {
  if [ "$(running_nodes)" = 0 ]; then
    echo "slurm_local: not running ($DIR)"
    return 1
  fi
  sinfo -N
  echo "export SLURM_CONF=$CONF"
}

case ${1:-} in
  up) shift; up "$@" ;;
  down) down ;;
  status) status ;;
  *) die "usage: $0 up [--nodes N] | down | status" ;;
esac
