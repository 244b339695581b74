# Shared helpers for deploy/testenv/k8s/{up,down}. Sourced, not executed.
# shellcheck shell=bash disable=SC2034  # variables used by up and down

K8S_CACHE=${ISTHMUS_CACHE:-$HOME/.cache/isthmus}/k8s
K8S_STATE=${ISTHMUS_K8S_STATE:-/tmp/isthmus-k8s}
# Processes in start order; down stops them in reverse.
# kueue runs only with up --with-kueue (a binary of its own, named in run/kueue.bin).
K8S_COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok kueue)

log() { printf '[k8s %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# pid_alive PIDFILE BIN: the pid in PIDFILE runs, and is one of ours (its command line
# contains BIN, the directory of the multi-call binary and its symlinks), so a recycled
# pid is never taken for ours.
pid_alive() {
  local pidfile=$1 bin=$2
  [[ -s $pidfile ]] || return 1
  ! pid_exited "$pidfile" || return 1  # a zombie is not alive
  tr '\0' ' ' <"/proc/$(<"$pidfile")/cmdline" 2>/dev/null | grep -qF -- "$bin"
}

# pid_exited PIDFILE: the process in PIDFILE (one this script has just started) is gone or a
# zombie. Unlike pid_alive it does not look at the command line: between fork and exec a child
# still shows the shell's, and a busy machine can be seen in that window.
pid_exited() {
  local pid
  pid=$(<"$1") || return 0
  [[ $pid =~ ^[0-9]+$ ]] || return 0
  [[ -r /proc/$pid/status ]] || return 0
  [[ $(awk '/^State:/{print $2}' "/proc/$pid/status" 2>/dev/null) == Z ]]
}

# component_bin RUNDIR NAME: the directory a component's binary lives in (what pid_alive
# looks for in its command line): run/NAME.bin when the component has one, else run/bin.
component_bin() {
  if [[ -s $1/$2.bin ]]; then cat "$1/$2.bin"; else cat "$1/bin" 2>/dev/null || true; fi
}

# stop_all: stop every component recorded under $K8S_STATE/run, newest first, by pid.
stop_all() {
  local run=$K8S_STATE/run i c pidfile pid bin waited
  [[ -d $run ]] || return 0
  bin=$(cat "$run/bin" 2>/dev/null || true)
  [[ -n $bin ]] || return 0
  for ((i = ${#K8S_COMPONENTS[@]} - 1; i >= 0; i--)); do
    c=${K8S_COMPONENTS[i]}
    pidfile=$run/$c.pid
    bin=$(component_bin "$run" "$c")
    [[ -n $bin ]] || continue
    if pid_alive "$pidfile" "$bin"; then
      pid=$(<"$pidfile")
      log "stopping $c (pid $pid)"
      kill -TERM "$pid" 2>/dev/null || true
      waited=0
      while pid_alive "$pidfile" "$bin" && ((waited < 100)); do
        sleep 0.1
        waited=$((waited + 1))
      done
      if pid_alive "$pidfile" "$bin"; then
        log "$c (pid $pid) ignored SIGTERM for 10s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        sleep 0.2
      fi
    fi
    rm -f "$pidfile"
  done
  rm -f "$run/config.hash"
}
