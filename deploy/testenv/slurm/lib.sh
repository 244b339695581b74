# Shared helpers for deploy/testenv/slurm/{up,down}. Sourced, not executed.
# shellcheck shell=bash

STATE="${ISTHMUS_SLURM_STATE:-/tmp/isthmus-slurm}"
ETC="$STATE/etc"
RUN="$STATE/run"
LOG="$STATE/log"
SPOOL="$STATE/spool"
MARKER="$STATE/.isthmus-slurm-state"

# Serialise up/down (two pytest sessions may call up at once). The lock file sits beside the
# state dir because up may wipe the state dir. down, when called by up, inherits the lock.
take_lock() {
  [[ ${ISTHMUS_SLURM_LOCKED:-} == "$STATE" ]] && return 0
  mkdir -p "$(dirname "$STATE")"
  exec 9>"$STATE.lock"
  if ! flock -w 900 9; then
    echo "[slurm-testenv] ERROR: could not lock $STATE.lock within 900s" >&2
    exit 1
  fi
  export ISTHMUS_SLURM_LOCKED="$STATE"
}

log() { printf '[slurm-testenv] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# pid_of NAME -> prints the pid recorded in $RUN/NAME.pid if that process is alive
# and its command name is EXPECTED_COMM (guards against recycled pids).
pid_of() {
  local name=$1 comm=$2 f pid
  f="$RUN/$name.pid"
  [[ -s $f ]] || return 1
  pid=$(tr -dc '0-9' <"$f")
  [[ -n $pid && -r /proc/$pid/comm ]] || return 1
  proc_alive "$pid" || return 1
  [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$comm" ]] || return 1
  printf '%s\n' "$pid"
}

# proc_alive PID: exists and is not a zombie (PID 1 here may reap late)
proc_alive() {
  local st
  st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n $st && $st != Z ]]
}

# stop_pid NAME COMM [GRACE_SECONDS]: TERM, wait, KILL; removes the pid file.
stop_pid() {
  local name=$1 comm=$2 grace=${3:-15} pid i
  if pid=$(pid_of "$name" "$comm"); then
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < grace * 10; i++)); do
      proc_alive "$pid" || break
      sleep 0.1
    done
    if proc_alive "$pid"; then
      log "$name (pid $pid) ignored TERM for ${grace}s, sending KILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$RUN/$name.pid"
}

# Node names from the rendered node list file (one per line).
node_names() { [[ -s $ETC/nodes ]] && cat "$ETC/nodes"; }
