"""The demo of the README on a real `isthmus server` with examples/isthmus.yaml (a simulated
federation: no cluster needed): the workload of examples/jobs/demo/, submitted by the demo's
own driver, reaches its expected ends in under two minutes of wall time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness.paths import EXAMPLE_CONFIG
from tests.harness.server import ROOT, Server

pytestmark = pytest.mark.slow  # over two seconds each: out of the fast tier (README)

DRIVER = ROOT / "scripts" / "demo_workload.py"
INFO_BOUND = 120
"""INFO lines the demo's server may write for its eight jobs (README): about 55 job changes,
a dispatch line per attempt, the cycles that admitted, start-up and 16 migrations (90 seen);
before, one line per progress report and per admission cycle made it over 1,700."""


def _events(server: Server, job_id: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{server.url}/v1/jobs/{job_id}/events", timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def test_the_demo_workload_reaches_its_ends(tmp_path: Path) -> None:
    """Every job reaches the end the README promises. How long that takes is a figure, not
    a pass mark (the driver prints settled_after_s; the driver's own --timeout gives up)."""
    server = Server(EXAMPLE_CONFIG, f"sqlite:///{tmp_path / 'demo.db'}", tmp_path / "server.log")
    server.start()
    try:
        run = subprocess.run(
            [sys.executable, str(DRIVER), "--server", server.url, "--plain", "--json",
             "--timeout", "300"],  # generous: the figure is ~70 s on a busy 2-core machine
            capture_output=True, text=True, timeout=420, cwd=ROOT,
        )
        out = run.stdout[run.stdout.index("{\n"):]
        outcome = json.loads(out)
        jobs = {j["name"]: j for j in outcome["jobs"]}
        assert outcome["ok"], (outcome, server.log.read_text()[-3000:])

        ends = {name: server.job(j["id"]) for name, j in jobs.items()}
        for name in ("bert-finetune", "llm-pretrain", "resnet-sweep", "cfd-surrogate",
                     "urgent-eval"):
            assert ends[name]["state"] == "SUCCEEDED", ends[name]
            assert ends[name]["first_useful_work_at"] is not None  # progress was reported

        flaky = _events(server, jobs["flaky-node"]["id"])
        path = [(e["to_state"], e["reason"]) for e in flaky]
        assert ("FAILED", "InfraTransient") in path
        assert path.index(("FAILED", "InfraTransient")) < [s for s, _ in path].index("RETRYING")
        assert path[-1] == ("SUCCEEDED", "Succeeded") and ends["flaky-node"]["attempt"] == 2

        victim = _events(server, jobs["speech-low"]["id"])
        preempted = [e for e in victim if (e["to_state"], e["reason"]) == ("RETRYING", "Preempted")]
        assert preempted and jobs["urgent-eval"]["id"] in preempted[0]["message"]
        assert victim[-1]["to_state"] == "SUCCEEDED" and ends["speech-low"]["attempt"] == 2

        assert ends["too-big"]["state"] == "REJECTED"
        assert ends["too-big"]["reason"] == "ExceedsCapacity"

        # the INFO log is the story of the eight jobs (broker.orchestration.story_rule), not
        # of the cycles: every job's end is told, and the whole log stays under INFO_BOUND
        info = [line for line in server.log.read_text().splitlines() if " INFO " in line]
        for name, job in ends.items():
            assert any(f"job {job['id']} ({name}," in line and f"-> {job['state']} " in line
                       for line in info), name
        assert len(info) <= INFO_BOUND, "\n".join(info[-40:])
    finally:
        server.stop()
