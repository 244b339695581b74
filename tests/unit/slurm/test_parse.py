"""Parsers and version detection on outputs captured from the local 22.05 cluster."""

from __future__ import annotations

import pytest

from backends.slurm import parse
from backends.slurm.inventory import topology_paths
from backends.slurm.settings import SlurmSettings
from backends.slurm.versions import UnsupportedSlurmVersion, dialect_for, parse_release

TOPOLOGY = """\
SwitchName=rack1 Level=0 LinkSpeed=1 Nodes=a100-1,a100-2,h100-1,h100-2
SwitchName=rack2 Level=0 LinkSpeed=1 Nodes=a100-3,h100-3
SwitchName=spine Level=1 LinkSpeed=1 Nodes=a100-[1-3],h100-[1-3] Switches=rack1,rack2
"""
SACCT = """\
22|isthmus-a-1|CANCELLED by 0|0:0|None|a100-[1-2]|2026-11-29T10:57:58|2026-11-29T10:57:58|\
2026-11-29T10:58:01|a100|billing=2,cpu=2,gres/gpu=16,mem=32000M,node=2|2|root|00:10:00
24|isthmus-b-1|FAILED|3:0|None|h100-3|2026-11-29T10:58:19|2026-11-29T10:58:19|\
2026-11-29T10:58:19|h100|billing=1,cpu=1,mem=16000M,node=1|1|root|Partition_Limit
25|isthmus-c-1|FAILED|0:9|None|h100-3|2026-11-29T10:58:19|2026-11-29T10:58:19|\
2026-11-29T10:58:19|h100|billing=1,cpu=1,mem=16000M,node=1|1|root|1-00:00:00
"""


def test_wait_status() -> None:
    assert parse.wait_status(768) == (3, None)
    assert parse.wait_status(9) == (None, 9)
    assert parse.wait_status(0) == (0, None)


def test_numbers_and_states_of_both_dialects() -> None:
    assert parse.number({"set": True, "infinite": False, "number": 3}) == 3
    assert parse.number({"set": False, "infinite": False, "number": 0}) is None
    assert parse.base_state("RUNNING") == ("RUNNING", frozenset())
    assert parse.base_state(["RUNNING", "COMPLETING"])[0] == "COMPLETING"


def test_squeue_job_v0038() -> None:
    rec = parse.squeue_job({"job_id": 24, "name": "isthmus-b-1", "job_state": "FAILED",
                            "state_reason": "NonZeroExitCode", "exit_code": 768,
                            "nodes": "h100-3", "tres_req_str": "cpu=1,node=1,gres/gpu=16",
                            "node_count": 1, "time_limit": 10})
    assert (rec.state, rec.exit_code, rec.gpus, rec.nodes) == ("FAILED", 3, 16, ("h100-3",))
    assert rec.time_limit_s == 600


def test_sacct_text() -> None:
    a, b, c = parse.sacct_text(SACCT)
    assert (a.state, a.cancelled_by, a.gpus, a.nodes) == ("CANCELLED", "root", 16,
                                                           ("a100-1", "a100-2"))
    assert (b.state, b.exit_code, b.signal) == ("FAILED", 3, None)
    assert (c.exit_code, c.signal, c.time_limit_s) == (0, 9, 86400)


def test_topology_racks_under_spine() -> None:
    paths = topology_paths(parse.topology(TOPOLOGY))
    assert paths["a100-2"].rack == "rack1" and paths["h100-3"].rack == "rack2"
    assert {p.block for p in paths.values()} == {"spine"}


def test_node_gres_and_drain() -> None:
    node = parse.sinfo_node({"name": "a100-1", "partitions": ["a100"], "state": "idle",
                             "state_flags": ["DRAIN"], "gres": "gpu:a100:8",
                             "gres_used": "gpu:a100:2(IDX:0-1)", "cpus": 8,
                             "features": "a100,rack1"})
    assert (node.gpu_type, node.gpus, node.gpus_used) == ("a100", 8, 2)
    assert "DRAIN" in node.flags and node.features == ("a100", "rack1")


def test_versions() -> None:
    assert dialect_for(parse_release("slurm-wlm 22.05.8")).openapi == "v0.0.38"
    with pytest.raises(UnsupportedSlurmVersion, match="not tested"):
        dialect_for(parse_release("slurm 24.11.1"))
    assert dialect_for((24, 11, 1), allow_untested=True).job_state_is_list
    with pytest.raises(UnsupportedSlurmVersion, match="not supported"):
        dialect_for((20, 11, 0))


def test_settings_refuse_unknown_keys() -> None:
    with pytest.raises(ValueError, match="transprt"):
        SlurmSettings.from_dict({"transprt": "cli"})
    with pytest.raises(ValueError, match="rest_url"):
        SlurmSettings.from_dict({"transport": "rest"})


# `sacctmgr -P -n show event Event=Node ... Format=<EVENT_FIELDS>` on the local 22.05 cluster:
# a node set DOWN that was back within a second (ReturnToService=2), a killed slurmd, a drain,
# and one still going on.
EVENTS = """\
a100-1|2026-11-29T14:00:37|2026-11-29T14:00:37|DOWN|isthmus-test
a100-1|2026-11-29T14:02:09|2026-11-29T14:02:11|DOWN*|Not responding
h100-3|2026-11-29T14:02:39|2026-11-29T14:02:41|DRAIN|isthmus-probe drain
h100-2|2026-11-29T14:05:00|Unknown|MIXED+DRAIN|Kill task failed
"""


def test_sacctmgr_events() -> None:
    events = parse.sacctmgr_events(EVENTS)
    assert [(e.node, e.state, set(e.flags), e.reason) for e in events] == [
        ("a100-1", "down", set(), "isthmus-test"),
        ("a100-1", "down", {"NOT_RESPONDING"}, "Not responding"),
        ("h100-3", "drain", set(), "isthmus-probe drain"),
        ("h100-2", "mixed", {"DRAIN"}, "Kill task failed"),
    ]
    first = events[0]
    assert first.start is not None and first.start == first.end
    assert events[-1].end is None  # still going on


@pytest.mark.parametrize(("text", "state", "flags"), [
    ("DOWN", "down", set()),
    ("DOWN*", "down", {"NOT_RESPONDING"}),
    ("IDLE+DRAIN", "idle", {"DRAIN"}),
    ("ALLOCATED*+DRAIN", "allocated", {"DRAIN", "NOT_RESPONDING"}),
    ("", "", set()),
])
def test_node_state_text(text: str, state: str, flags: set[str]) -> None:
    assert parse.node_state_text(text) == (state, frozenset(flags))


def test_sacct_steps_only_for_jobs_accounting_saw_end() -> None:
    text = "\n".join([
        "101|FAILED", "101.batch|FAILED", "101.extern|COMPLETED",  # no rank step
        "102|FAILED", "102.batch|FAILED", "102.extern|COMPLETED", "102.0|FAILED",
        "103|RUNNING", "103.batch|RUNNING",  # its end is not recorded yet: unknown
        "104|CANCELLED by 0",
        "garbage",
    ])
    assert parse.sacct_steps(text) == {"101": ("batch", "extern"), "102": ("batch", "extern", "0"),
                                 "104": ()}


def test_db_steps_from_slurmdbd_json() -> None:
    ended = {"state": {"current": "FAILED", "reason": "None"},
             "steps": [{"step": {"job_id": 1417, "id": "batch", "name": "batch"}},
                       {"step": {"job_id": 1417, "id": 0, "name": "true"}}]}
    assert parse.db_steps(ended) == ("batch", "0")
    assert parse.db_steps({"state": {"current": "FAILED"}, "steps": []}) == ()
    assert parse.db_steps({"state": {"current": "RUNNING"}, "steps": []}) is None
    assert parse.db_steps({"state": "FAILED", "steps": [{"step": {"id": "7.extern"}}]}) == (
        "extern",)


@pytest.mark.parametrize(
    "value",
    [float("inf"), float("nan"), {"set": True, "infinite": False, "number": float("inf")},
     10**400, "1e400"],
    ids=["inf", "nan", "object-inf", "10^400", "text-1e400"],
)
def test_absurd_numbers_and_times_are_no_evidence_not_errors(value: object) -> None:
    assert parse.epoch(value) is None
    rec = parse.squeue_job({"job_id": 1, "job_state": "RUNNING", "start_time": value,
                            "time_limit": value, "node_count": value})
    assert rec.started_at is None and rec.node_count == 0
    assert rec.time_limit_s is None or rec.time_limit_s > 0
