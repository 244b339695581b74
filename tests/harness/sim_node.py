"""A stand-in for a compute node of the simulated federation, for tests that run real workflow
tools against it.

The simulated backend runs no commands: it only moves jobs through their states on its clock.
`SimNode` watches the broker and runs the batch script of each job the simulation has started,
once, as a local process (several at a time; the ones still running are ended on exit), the
way a rank on Kubernetes runs it (backends/k8s/batch_script.py's
wrapper: srun runs its command in place, SLURM_JOB_ID is the job's number, the working
directory is the submit directory, stdout goes to the job's --output). The job's state stays
the simulation's: the script's exit code changes nothing in the broker.
"""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path
from typing import Any

from backends.k8s.batch_script import command
from broker.client import Client
from broker.dropins import jobview

STARTED = ("RUNNING", "SUCCEEDED")


class SimNode:
    def __init__(self, url: str, token: str, env: dict[str, str], interval: float = 0.2) -> None:
        self.url, self.token, self.env, self.interval = url, token, env, interval
        self.ran: dict[str, int] = {}  # job number -> the script's exit code, once it ended
        self.started: dict[str, subprocess.Popen[bytes]] = {}
        self._before: set[str] = set()
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> SimNode:
        with Client(self.url, self.token) as api:  # jobs from before are not this node's
            self._before = {str(item["number"]) for item in api.hpc_jobs()["items"]}
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        for number, proc in self.started.items():
            if proc.poll() is None:
                proc.terminate()
            self.ran[number] = proc.wait(30)
        if self.error is not None:
            raise AssertionError(f"the simulated node stopped: {self.error!r}") from self.error

    def _loop(self) -> None:
        try:
            self._watch()
        except BaseException as exc:  # surfaced by __exit__: a dead node fails the test
            self.error = exc

    def _watch(self) -> None:
        with Client(self.url, self.token) as api:
            while not self._stop.wait(self.interval):
                for item in api.hpc_jobs(states=list(STARTED))["items"]:
                    number = str(item["number"])
                    if number not in self.started and number not in self._before:
                        self.started[number] = self._start(item)
                for number, proc in self.started.items():
                    if proc.poll() is not None:
                        self.ran[number] = proc.returncode

    def _start(self, item: dict[str, Any]) -> subprocess.Popen[bytes]:
        spec, job = item["spec"], jobview.view(item)
        env = {**self.env, **spec.get("env", {}), "RANK": "0", "SLURM_JOB_ID": job.raw_id,
               "SLURM_JOB_NAME": job.name, "SLURM_JOB_NODELIST": "localhost",
               "SLURM_NNODES": "1", "SLURM_NTASKS": "1"}
        cwd = Path(env.get("SLURM_SUBMIT_DIR") or os.getcwd())
        out_path = jobview.expand_path(job.stdout, job)
        out = Path(out_path) if out_path != "(null)" else cwd / f"slurm-{job.raw_id}.out"
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "ab") as log:
            return subprocess.Popen(command(spec["entrypoint"]["script"]), env=env, cwd=cwd,
                                    stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
