"""Team queues (isthmus.yaml `teams[].queues`): a team's jobs name a queue; admission takes the
team's next job from the queue with the fewest GPUs held per unit of weight, counting what the
queues already hold and charging each admission of the cycle; a job naming a queue its team
does not have is refused at submit naming the field; `GET /v1/queues`, `explain` and
`isthmus quotas` show each queue's weight and standing."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from fastapi.testclient import TestClient

from broker.api.app import create_app
from broker.config import ConfigError, IsthmusConfig, parse_config
from broker.store import Database
from broker.web import build_app
from tests.builders import spec
from tests.harness.sim import CONFIG, Sim, cycle, make_sim, state, submit


def _config(queues: list[dict[str, Any]] | None) -> dict[str, Any]:
    data = copy.deepcopy(CONFIG)
    if queues is not None:
        data["teams"][0]["queues"] = queues  # vision
    return data


WEIGHTED = [{"name": "research", "weight": 1}, {"name": "prod", "weight": 3}]


@pytest.fixture
def sim_config() -> IsthmusConfig:
    return parse_config(_config(WEIGHTED))


def _job(sim: Sim, name: str, queue: str, replicas: int = 1) -> str:
    job = submit(sim, spec().name(name).team("vision").set("queue", queue)
                 .flavors("h100-80g").replicas(replicas).gpus(8).topology(None), 3600)
    sim.advance(1)  # a distinct submission time: the order within a queue is the oldest first
    return job


def _admitted(sim: Sim, jobs: list[str]) -> list[str]:
    return [j for j in jobs if state(sim, j)[0] != "QUEUED"]


def test_a_cycle_splits_the_room_by_the_queues_weights(sim: Sim) -> None:
    # slurm-h100 has 4 nodes of 8 GPUs; research's jobs were all submitted first
    research = [_job(sim, f"r{i}", "research") for i in range(4)]
    prod = [_job(sim, f"p{i}", "prod") for i in range(4)]
    cycle(sim, 1)
    # weights 1:3 -> research 8 GPUs, prod 24 (equal at 8 per unit of weight), not 4 x research
    assert len(_admitted(sim, research)) == 1 and len(_admitted(sim, prod)) == 3, \
        [state(sim, j) for j in research + prod]


def test_what_a_queue_already_holds_counts(sim: Sim) -> None:
    held = [_job(sim, "r-big", "research", replicas=2), _job(sim, "r-one", "research")]
    cycle(sim, 1)
    assert len(_admitted(sim, held)) == 2  # research holds 24 GPUs, one node is free
    older = _job(sim, "r-next", "research")
    newer = _job(sim, "p-next", "prod")
    cycle(sim, 1)
    assert state(sim, newer)[0] != "QUEUED", "prod holds nothing: its job goes first"
    assert state(sim, older)[0] == "QUEUED"


def test_without_queues_the_oldest_goes_first(db: Database) -> None:
    sim = make_sim(db, parse_config(_config(None)))
    jobs = [_job(sim, f"r{i}", "default") for i in range(6)]
    cycle(sim, 1)
    assert _admitted(sim, jobs) == jobs[:4]


def test_a_queue_the_team_lacks_is_refused_naming_the_field(sim: Sim) -> None:
    client = TestClient(create_app(sim.plane.config, sim.plane.db))
    body = spec().name("lost").team("vision").set("queue", "nope").dict()
    r = client.post("/v1/jobs", json=body)
    assert r.status_code == 422, r.text
    assert "queue" in r.text and "research, prod" in r.text, r.text
    # a team without queues has one, 'default': its jobs' queue is a free label there
    body = spec().name("label").team("language").set("queue", "research").dict()
    r = client.post("/v1/jobs", json=body)
    assert r.status_code in (200, 201, 202), r.text
    lines = [v for v in client.get("/v1/queues").json() if v["team"] == "language"]
    assert [(v["queue"], v["waiting_jobs"]) for v in lines] == [("default", 1)], lines


def test_a_queue_no_longer_configured_keeps_a_line_of_its_own(db: Database) -> None:
    sim = make_sim(db, parse_config(_config(WEIGHTED)))
    gone = _job(sim, "old", "research")
    sim.plane.config = parse_config(_config([{"name": "prod", "weight": 3},
                                             {"name": "batch"}]))
    client = TestClient(create_app(sim.plane.config, sim.plane.db))
    lines = {v["queue"]: v for v in client.get("/v1/queues").json() if v["team"] == "vision"}
    assert lines["research"]["configured"] is False and lines["research"]["weight"] == 1
    assert lines["research"]["waiting_jobs"] == 1 and lines["prod"]["configured"] is True
    text = client.get(f"/v1/jobs/{gone}/explain").json()["text"]
    assert "queue research of team vision (no longer configured: weight 1)" in text, text


def test_queue_lines_and_explain_show_each_queues_standing(sim: Sim) -> None:
    client = TestClient(create_app(sim.plane.config, sim.plane.db))
    held = _job(sim, "r-big", "research", replicas=4)
    cycle(sim, 1)
    waiting = _job(sim, "r-wait", "research")
    _job(sim, "p-wait", "prod")
    cycle(sim, 1)
    lines = {(v["team"], v["queue"]): v for v in client.get("/v1/queues").json()}
    r, p = lines[("vision", "research")], lines[("vision", "prod")]
    assert (r["gpus_held"], r["held_per_weight"], r["waiting_jobs"]) == (32, 32, 1), r
    assert (p["gpus_held"], p["weight"], p["weight_fraction"], p["waiting_jobs"]) == \
        (0, 3, 0.75, 1), p
    assert lines[("language", "default")]["gpus_held"] == 0
    text = client.get(f"/v1/jobs/{waiting}/explain").json()["text"]
    assert "queue research of team vision: weight 1 (25% of the team's), holds 32 GPUs" \
        in text, text
    assert "prod 0 GPUs / weight 3" in text and "in line" not in text, text
    assert state(sim, held)[0] != "QUEUED"
    # a running job's explain has no queue line: its queue's standing no longer decides
    assert "queue research" not in client.get(f"/v1/jobs/{held}/explain").json()["text"]
    page = TestClient(build_app(sim.plane.config, sim.plane.db)).get("/ui").text  # dashboard
    assert '<table id="queues">' in page
    assert "<td>vision</td><td class=\"num\">1</td><td>prod</td><td class=\"num\">3 (75%)" \
        in page, page


def test_the_configuration_checks_queues_and_weights() -> None:
    with pytest.raises(ConfigError, match=r"teams\[0\].queues: duplicate name 'a'"):
        parse_config(_config([{"name": "a"}, {"name": "a", "weight": 2}]))
    with pytest.raises(ConfigError, match="weight"):
        parse_config(_config([{"name": "a", "weight": 0}]))
    # an sbatch sub-account maps to a team's queue (isbatch -A vision-prod)
    data = _config(WEIGHTED)
    data["slurm_compat"] = {"accounts": {"vision-prod": "vision/prod", "v-x": "vision/x"}}
    with pytest.raises(ConfigError, match=r"slurm_compat.accounts.v-x: team 'vision' has no "
                       r"queue 'x' \(teams\[\].queues: research, prod\)"):
        parse_config(data)
    data["slurm_compat"]["accounts"].pop("v-x")
    parse_config(data)
    # a template's queue must be one of the queues of each team that configures queues
    preset = {k: v for k, v in spec().dict().items() if k not in ("name", "team")}
    data["templates"] = [{"name": "t", "spec": {**preset, "queue": "nightly"}}]
    with pytest.raises(ConfigError, match=r"templates\[0\].spec.queue: 'nightly' is not a "
                       r"queue of team\(s\) vision"):
        parse_config(data)
    data["templates"][0]["spec"]["queue"] = "prod"
    parse_config(data)
    data = _config(None)
    data["teams"][0]["weight"] = 2.5
    from broker.policy_inputs import quota_config

    cfg = parse_config(data)
    assert quota_config(cfg).teams["vision"].weight == 2.5


def test_a_teams_weight_puts_it_ahead_at_equal_use(db: Database) -> None:
    """Against equal a100 quotas vision holds 24 GPUs and language 32; language's weight 2
    halves its share (0.5 against 0.75), so its job goes first though vision's is older."""
    data = _config(None)
    for t in data["teams"]:
        t["quotas"] = {"a100-80g": {"nominal": 32}}
    data["teams"][1]["weight"] = 2
    sim = make_sim(db, parse_config(data))

    def a100(name: str, team: str, replicas: int = 1) -> str:
        job = submit(sim, spec().name(name).team(team).flavors("a100-80g").replicas(replicas)
                     .gpus(8).topology(None), 3600)
        sim.advance(1)
        return job

    # k8s-a100 has 8 nodes: 3 + 4 held, then room for one of the next two
    held = [a100("v-held", "vision", 3), a100("l-held", "language", 4)]
    cycle(sim, 1)
    assert _admitted(sim, held) == held
    older, newer = a100("v-next", "vision"), a100("l-next", "language")
    cycle(sim, 1)
    assert state(sim, newer)[0] != "QUEUED" and state(sim, older)[0] == "QUEUED", \
        (state(sim, older), state(sim, newer))


SHARED = [{"name": "research", "weight": 1, "share": 0.5}, {"name": "prod", "weight": 1}]


def test_a_queue_at_its_share_waits_while_another_queue_is_admitted(db: Database) -> None:
    """vision may hold 32 H100s (nominal 32; language lends none): research's share 0.5 caps
    it at 16, counting the cycle's admissions and then what it holds; prod goes on."""
    sim = make_sim(db, parse_config(_config(SHARED)))
    research = [_job(sim, f"r{i}", "research") for i in range(3)]
    prod = _job(sim, "p0", "prod")
    cycle(sim, 1)
    assert _admitted(sim, research) == research[:2] and state(sim, prod)[0] != "QUEUED", \
        [state(sim, j) for j in [*research, prod]]
    assert state(sim, research[2]) == ("QUEUED", "QueueShareReached")
    # the next cycle: what research holds counts (one node is still free), prod takes it
    later = _job(sim, "p1", "prod")
    cycle(sim, 1)
    assert state(sim, research[2]) == ("QUEUED", "QueueShareReached")
    assert state(sim, later)[0] != "QUEUED"
    with sim.plane.db.read() as s:
        from broker.store.queries import get_job

        job = get_job(s, research[2])
        assert job is not None
    assert "queue research holds 16 of the 16 h100-80g GPUs its share allows (50% of the 32 " \
        "h100-80g GPUs team vision may hold (nominal 32, borrowable 0)) and needs 8 more" \
        in job.message, job.message
    client = TestClient(create_app(sim.plane.config, sim.plane.db))
    lines = {v["queue"]: v for v in client.get("/v1/queues").json() if v["team"] == "vision"}
    r, p = lines["research"], lines["prod"]
    assert (r["share"], r["share_gpus"], r["gpus_held_by_flavor"]) == \
        (0.5, {"a100-80g": 40, "h100-80g": 16}, {"a100-80g": 0, "h100-80g": 16}), r
    assert (p["share"], p["share_gpus"]) == (None, {}), p
    text = client.get(f"/v1/jobs/{research[2]}/explain").json()["text"]
    assert "share 50% of the team's quota (a cap: of its nominal plus what it may borrow): " \
        "holds a100-80g 0 of 40, h100-80g 16 of 16 GPUs" in text, text
    page = TestClient(build_app(sim.plane.config, sim.plane.db)).get("/ui").text
    assert "<td>50% (a100-80g 0/40, h100-80g 16/16)</td>" in page, page


def test_a_single_queue_with_a_share_is_shown(db: Database) -> None:
    sim = make_sim(db, parse_config(_config([{"name": "research", "share": 0.25}])))
    job = _job(sim, "r0", "research")
    client = TestClient(create_app(sim.plane.config, sim.plane.db))
    text = client.get(f"/v1/jobs/{job}/explain").json()["text"] or ""
    assert "queue research of team vision" in text and "share 25%" in text, text
    assert "other queues" not in text, text
    page = TestClient(build_app(sim.plane.config, sim.plane.db)).get("/ui").text
    assert '<table id="queues">' in page and "25% (a100-80g 0/20, h100-80g 0/8)" in page


@pytest.mark.parametrize("share", [0, -0.5, 1.01, "nan"], ids=["zero", "negative", "over-1",
                                                             "nan"])
def test_the_configuration_refuses_a_share_outside_0_1_naming_the_field(share: object) -> None:
    with pytest.raises(ConfigError, match=r"teams\[0\]\.queues\[1\]\.share: .* give 0 < share "
                       r"<= 1"):
        parse_config(_config([{"name": "a"}, {"name": "b", "share": float(share)}]))  # type: ignore[arg-type]


def test_shares_may_add_up_to_more_than_one() -> None:
    cfg = parse_config(_config([{"name": "a", "share": 0.8}, {"name": "b", "share": 0.8}]))
    team = cfg.team("vision")
    assert team is not None and team.queue_shares() == {"a": 0.8, "b": 0.8}
