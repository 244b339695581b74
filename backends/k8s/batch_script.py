"""An sbatch script on Kubernetes (entrypoint.launcher 'batch'): every rank runs it with the
environment a Slurm script expects and stand-ins for the Slurm commands it calls.

Each pod of the Indexed Job runs a fixed wrapper (``WRAPPER``; the user's script is its
argument, never shell text of ours) that puts two shims first on PATH and then runs the script:

- ``srun [options] CMD ...`` runs CMD in this rank (every rank already runs the script, so the
  script's ``srun torchrun ...`` becomes one torchrun per rank, as on Slurm), or, for a gang
  of several tasks a replica (``--ntasks-per-node``), that many copies, each with its
  SLURM_PROCID/SLURM_LOCALID and its share of the pod's GPUs;
- ``scontrol show hostname(s) [LIST]`` prints the gang's host names, one a line.

Environment: SLURM_JOB_ID (the job's number), SLURM_JOB_NAME, SLURM_NNODES /
SLURM_JOB_NUM_NODES, SLURM_NTASKS,
SLURM_JOB_NODELIST (the pods' stable names ``<name>-<i>.<name>``, comma separated),
SLURM_GPUS_ON_NODE, SLURM_CPUS_PER_TASK, SLURM_SUBMIT_DIR and SLURM_ARRAY_* (from the job's env),
and per rank SLURM_NODEID, SLURM_PROCID (the completion index), SLURM_LOCALID=0, SLURMD_NODENAME.
"""

from __future__ import annotations

from typing import Any

from backends.base import SubmitRequest

WRAPPER = r'''set -eu
shims=$(mktemp -d)
cat > "$shims/srun" <<'ISTHMUS_SHIM'
#!/bin/bash
# Isthmus on Kubernetes: every rank runs the batch script, so srun runs its command here.
while [ $# -gt 0 ]; do
  case "$1" in
    --) shift; break ;;
    -n|-N|-c|-G|-o|-e|-J|-t|-w|-p|-A|-m|-x|-D|--ntasks|--nodes|--cpus-per-task|--gpus|\
--output|--error|--job-name|--time|--nodelist|--partition|--account|--gpus-per-node|\
--gpus-per-task|--ntasks-per-node|--mpi|--cpu-bind|--distribution|--export|--gres|--mem|\
--chdir|--exclude|--label-format) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { echo "srun: error: no command given" >&2; exit 1; }
t="${SLURM_NTASKS_PER_NODE:-1}"
case "$t" in ''|*[!0-9]*|0|1) exec "$@" ;; esac
# several tasks a node (sbatch --ntasks-per-node): t copies, each with its rank and, when the
# pod's GPUs divide evenly, its own share of them, as srun with --gpus-per-task gives
gpus="${CUDA_VISIBLE_DEVICES:-}"
n=0; [ -n "$gpus" ] && n=$(printf '%s' "$gpus" | tr ',' '\n' | grep -c .)
pids=""
i=0
while [ "$i" -lt "$t" ]; do
  share="$gpus"
  if [ "$n" -gt 0 ] && [ $((n % t)) -eq 0 ]; then
    k=$((n / t))
    share=$(printf '%s' "$gpus" | tr ',' '\n' | sed -n "$((i * k + 1)),$(((i + 1) * k))p" \
      | paste -sd, -)
  fi
  SLURM_LOCALID=$i SLURM_PROCID=$((SLURM_NODEID * t + i)) CUDA_VISIBLE_DEVICES="$share" \
    "$@" &
  pids="$pids $!"
  i=$((i + 1))
done
rc=0
for p in $pids; do wait "$p" || rc=$?; done
exit "$rc"
ISTHMUS_SHIM
cat > "$shims/scontrol" <<'ISTHMUS_SHIM'
#!/bin/bash
# Isthmus on Kubernetes: only 'scontrol show hostname(s) [LIST]' is answered.
if [ "${1:-}" = show ] && { [ "${2:-}" = hostnames ] || [ "${2:-}" = hostname ]; }; then
  printf '%s\n' ${3:-$SLURM_JOB_NODELIST} | tr ',' '\n' | grep -v '^$'
  exit 0
fi
echo "scontrol: error: only 'scontrol show hostnames' is available in this job" >&2
exit 1
ISTHMUS_SHIM
chmod 755 "$shims/srun" "$shims/scontrol"
export PATH="$shims:$PATH"
export SLURM_NODEID="$RANK" SLURM_PROCID="$RANK" SLURM_LOCALID=0
export SLURMD_NODENAME="$(hostname)"
printf '%s' "$1" > "$shims/batch-script"
chmod 700 "$shims/batch-script"
run="$shims/batch-script"
[ "$(head -c 2 "$run")" = '#!' ] || run="/bin/bash $run"
sig="${ISTHMUS_SIGNAL:-}"
case "$sig" in ''|*[!A-Z0-9]*) exec $run ;; esac
# The stop signal (sbatch --signal): ISTHMUS_SIGNAL_AFTER seconds after the start, and in the
# place of the kubelet's TERM (cancel, preemption, the deadline), sent to the script alone
# (B:) or to its process group, which holds the script's srun steps.
set -m
$run &
child=$!
target="$child"
[ "${ISTHMUS_SIGNAL_BATCH_ONLY:-1}" = 1 ] || target="-$child"
trap 'kill -s "$sig" -- "$target" 2>/dev/null' TERM
after="${ISTHMUS_SIGNAL_AFTER:-}"
case "$after" in
  ''|*[!0-9]*) ;;
  *) ( exec </dev/null >/dev/null 2>&1; sleep "$after"; kill -s "$sig" -- "$target" ) &
     timer=$! ;;
esac
rc=0
wait "$child" || rc=$?
while kill -0 "$child" 2>/dev/null; do rc=0; wait "$child" || rc=$?; done
[ -z "${timer:-}" ] || kill -- "-$timer" 2>/dev/null || true
exit "$rc"
'''


def stop_signal_env(request: SubmitRequest) -> dict[str, str]:
    """What the wrapper needs to send the job's stop signal (checkpoint.signal) its grace
    before the end (max_runtime) and in the place of the kubelet's TERM."""
    ckpt = request.snapshot.spec.checkpoint
    return {"ISTHMUS_SIGNAL": ckpt.signal,
            "ISTHMUS_SIGNAL_AFTER": str(max(0, request.snapshot.spec.max_runtime - ckpt.grace)),
            "ISTHMUS_SIGNAL_BATCH_ONLY": "1" if ckpt.signal_batch_only else "0"}


def command(script: str) -> list[str]:
    """The container command: the wrapper, with the user's script as its argument."""
    return ["/bin/bash", "-c", WRAPPER, "isthmus-batch", script]


def host_names(request: SubmitRequest) -> list[str]:
    """The gang's stable pod names (Indexed Job pods under the headless Service)."""
    return [f"{request.name}-{i}.{request.name}"
            for i in range(request.snapshot.spec.gang.replicas)]


def env(request: SubmitRequest) -> list[dict[str, Any]]:
    """The Slurm variables every rank shares (the per-rank ones come from the wrapper)."""
    spec = request.snapshot.spec
    values = {
        "SLURM_JOB_ID": request.slurm_job_id,
        "SLURM_JOB_NAME": spec.name,
        "SLURM_NNODES": str(spec.gang.replicas),
        "SLURM_JOB_NUM_NODES": str(spec.gang.replicas),
        "SLURM_NTASKS": str(spec.gang.tasks),
        "SLURM_NTASKS_PER_NODE": str(spec.gang.tasks_per_replica),
        "SLURM_JOB_NODELIST": ",".join(host_names(request)),
        "SLURM_GPUS_ON_NODE": str(spec.gang.gpus_per_replica),
    }
    if spec.gang.cpus_per_replica:
        values["SLURM_CPUS_PER_TASK"] = str(
            max(1, spec.gang.cpus_per_replica // spec.gang.tasks_per_replica))
    values["SLURM_SUBMIT_DIR"] = spec.env.get("SLURM_SUBMIT_DIR", "/")
    values.update(stop_signal_env(request))
    return [{"name": k, "value": v} for k, v in values.items()]
