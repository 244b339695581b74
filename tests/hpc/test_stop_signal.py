"""sbatch --signal=[{R|B}:]SIG[@TIME] on each backend: Slurm gets the directive as written and
the batch shell forwards that signal; on Kubernetes the rank's wrapper sends it TIME before
max_runtime and in the place of the kubelet's TERM, to the script (B:) or its process group."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from backends.k8s.manifests import COMPLETION_INDEX, render
from backends.k8s.settings import K8sPoolBinding, K8sSettings
from backends.slurm.script import render as render_slurm
from tests.harness.k8s_requests import request
from tests.harness.requests import slurm_request

POOL = K8sPoolBinding(name="h100", flavor="h100-80g", node_selector={"isthmus.io/pool": "h100"})


def test_slurm_gets_the_signal_as_written_and_the_batch_shell_forwards_it() -> None:
    entry: dict[str, object] = {"script": "#!/bin/bash\nsrun true", "launcher": "batch"}
    steps = render_slurm(slurm_request(entry, checkpoint={"grace": 90, "signal": "USR2",
                                                          "signal_batch_only": False}),
                         partition="a100")
    assert "#SBATCH --signal=USR2@90" in steps.splitlines()
    assert "trap 'kill -USR2 \"$ISTHMUS_STEP\" 2>/dev/null' USR2 USR1" in steps.splitlines()
    batch = render_slurm(slurm_request(entry, checkpoint={"grace": 30, "signal": "35"}),
                         partition="a100")
    assert "#SBATCH --signal=B:35@30" in batch.splitlines()
    default = render_slurm(slurm_request(entry), partition="a100")  # grace 45, USR1, B:
    assert "#SBATCH --signal=B:USR1@45" in default.splitlines()


def test_a_cancel_on_slurm_reaches_the_script_as_its_own_stop_signal(tmp_path: Path) -> None:
    """A cancel or a preemption on Slurm sends USR1 to the batch shell (the adapter's cancel);
    a job that chose USR2 (sbatch --signal=USR2@90) must get USR2, not die of USR1 without its
    grace. The rendered trap line runs here in a real bash, around a stand-in step."""
    entry: dict[str, object] = {"script": "#!/bin/bash\nsrun true", "launcher": "batch"}
    rendered = render_slurm(slurm_request(entry, checkpoint={"grace": 90, "signal": "USR2"}),
                            partition="a100")
    (trap,) = [line for line in rendered.splitlines() if line.startswith("trap ")]
    got = tmp_path / "got"
    shell = "\n".join([
        f"(trap 'echo USR2 > {got}; exit 0' USR2; trap 'echo USR1 > {got}; exit 0' USR1;"
        " echo step-ready; while :; do sleep 0.05; done) &",
        "ISTHMUS_STEP=$!", trap, "echo ready",
        'wait "$ISTHMUS_STEP"; rc=$?',
        'while kill -0 "$ISTHMUS_STEP" 2>/dev/null; do wait "$ISTHMUS_STEP"; rc=$?; done',
        'exit "$rc"'])
    proc = subprocess.Popen(["bash", "-c", shell], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        # both traps in place: the shell's (it says ready) and the step's (step-ready)
        assert {proc.stdout.readline().strip() for _ in range(2)} == {"ready", "step-ready"}
        proc.send_signal(signal.SIGUSR1)  # what the adapter's cancel sends
        assert proc.wait(timeout=30) == 0  # the shell lived on until its step ended
        assert got.read_text().strip() == "USR2"
    finally:  # the stand-in step too, whatever happened to the shell
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def _container(script: str, checkpoint: dict[str, object]) -> dict[str, Any]:
    req = request(replicas=1, entrypoint={"image": "trainer:1", "script": script,
                                          "launcher": "batch"},
                  checkpoint=checkpoint, max_runtime=3600)
    job = render(req, POOL, K8sSettings(namespace="train"))[0]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return dict(container)


def _env(container: dict[str, Any], out: Path, **override: str) -> dict[str, str]:
    env = {"PATH": os.environ["PATH"], "HOME": str(out), "OUT": str(out)}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
        elif COMPLETION_INDEX in str(item["valueFrom"]):
            env[item["name"]] = "0"
        else:
            env[item["name"]] = "token"
    return {**env, **override}


def _poll(path: Path, proc: subprocess.Popen[str]) -> str:
    for _ in range(600):
        if path.exists() and path.read_text():
            return path.read_text().strip()
        if proc.poll() is not None and not path.exists():
            break
        time.sleep(0.05)  # polling for the file, not waiting for a duration
    raise AssertionError(f"{path} never written; wrapper: {proc.communicate(timeout=5)}")


TRAPPING = """#!/bin/bash
trap 'echo "script USR2" >> "$OUT/got"; exit 0' USR2
touch "$OUT/ready"
while :; do sleep 0.05; done
"""


def test_kubernetes_sends_the_signal_its_time_before_max_runtime(tmp_path: Path) -> None:
    container = _container(TRAPPING, {"grace": 90, "signal": "USR2"})
    env = _env(container, tmp_path)
    assert (env["ISTHMUS_SIGNAL"], env["ISTHMUS_SIGNAL_AFTER"]) == ("USR2", str(3600 - 90))
    # the time before the end, here soon: long enough for the script to set its trap first
    # (a real job's signal comes its grace before max_runtime, long after its start)
    env["ISTHMUS_SIGNAL_AFTER"] = "3"
    proc = subprocess.Popen(container["command"], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert _poll(tmp_path / "got", proc) == "script USR2"
    assert proc.wait(timeout=30) == 0


def test_kubernetes_turns_the_kubelets_term_into_the_signal_for_every_step(
        tmp_path: Path) -> None:
    script = """#!/bin/bash
trap 'echo "script USR2" >> "$OUT/got"; exit 0' USR2
srun bash -c 'trap "echo step USR2 >> \\"$OUT/step\\"; exit 0" USR2; touch "$OUT/ready"
  while :; do sleep 0.05; done' &
wait
"""
    container = _container(script, {"grace": 90, "signal": "USR2",
                                     "signal_batch_only": False})
    proc = subprocess.Popen(container["command"], env=_env(container, tmp_path), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for _ in range(600):
        if (tmp_path / "ready").exists():
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)  # what the kubelet sends at a cancel or the deadline
    assert _poll(tmp_path / "step", proc) == "step USR2"
    assert _poll(tmp_path / "got", proc) == "script USR2"
    proc.wait(timeout=30)
