"""`squeue --json` with slurmctld down exits 0 with an `errors` entry and no jobs: that must
be an outage (BackendUnavailable), never an empty queue that makes every job look lost."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime
from typing import Any

import pytest

from backends.base import BackendUnavailable
from backends.slurm.transport_cli import CliTransport

DOWN = {
    "meta": {"plugin": {"type": "openapi/v0.0.38"}},
    "errors": [{"description": "Failed while looking for jobs", "error_number": -1,
                "error": "Unspecified error", "source": "slurm_load_jobs"}],
    "jobs": [],
}


def test_json_errors_mean_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 0, json.dumps(DOWN), "")

    monkeypatch.setattr(subprocess, "run", fake_run)
    with pytest.raises(BackendUnavailable, match="slurm_load_jobs"):
        CliTransport(slurm_conf=None, timeout=5).jobs()


def test_node_events_refused_are_no_evidence_but_no_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def fake_run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 1, "", "sacctmgr: error: Access denied")

    monkeypatch.setattr(subprocess, "run", fake_run)
    since = datetime(2026, 11, 29, tzinfo=UTC)
    assert CliTransport(slurm_conf=None, timeout=5).node_events(["a100-1"], since=since) == []


def test_node_events_with_slurmdbd_down_are_an_outage(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 1, "", "sacctmgr: error: Problem talking "
                                           "to the database: Connection refused")

    monkeypatch.setattr(subprocess, "run", fake_run)
    since = datetime(2026, 11, 29, tzinfo=UTC)
    with pytest.raises(BackendUnavailable):
        CliTransport(slurm_conf=None, timeout=5).node_events(["a100-1"], since=since)
