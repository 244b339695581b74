"""bench/loop_cost.py at a tiny size: every job ends, the checks are clean and the report's last
line parses; the backend's share is counted call by call (facts built lazily too) and taken
out of the per-job figure. No timing is asserted."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest

from backends.sim.backend import SimBackend, SimClock, SimPoolSpec
from bench import loop_cost
from broker.domain.facts import Fact, Phase


@pytest.mark.slow
def test_a_tiny_run_ends_every_job_with_clean_checks(tmp_path: Path) -> None:
    run = loop_cost.run_loop(f"sqlite:///{tmp_path / 'loop.db'}", "sqlite", 40, 2.0, 5.0, 1,
                             max_ticks=400)
    assert run.problems == []
    assert sum(run.states.values()) == 40
    assert set(run.states) <= set(loop_cost.TERMINAL)
    assert run.failed_attempts > 0, "the workload has jobs that fail once"
    assert run.attempts == 40 + run.failed_attempts + run.preempted_attempts
    assert all(run.passes[p].calls > 0 for p in ("admission", "dispatch", "reconcile"))
    # 40 jobs at 2 a second, 5 s ticks: arrivals met by the first four admission cycles
    assert run.arriving == 4 and len(run.pending) > run.arriving


@pytest.mark.slow
def test_the_command_ends_with_a_line_that_parses(capsys: pytest.CaptureFixture[str]) -> None:
    handlers, level = list(logging.getLogger().handlers), logging.getLogger().level
    assert loop_cost.main(["--jobs", "40", "--db", "sqlite", "--api-jobs", "10"]) == 0
    # the server's logging it ran under is taken down again (it runs inside this test session)
    assert (logging.getLogger().handlers, logging.getLogger().level) == (handlers, level)
    lines = capsys.readouterr().out.strip().splitlines()
    figures = loop_cost.parse_last_line(lines[-1])
    assert figures["postgres"] is None
    assert figures["sqlite"] is not None and figures["api"] is not None
    assert any(line.startswith("loop sqlite: 40 jobs") and "checks clean" in line
               for line in lines)


def test_the_last_line_round_trips_and_marks_a_database_not_run() -> None:
    line = loop_cost.last_line(12.345, None, 0.5)
    assert line == "loop-cost: sqlite 12.35 ms/job postgres - ms/job api-submit 0.50 ms/job"
    assert loop_cost.parse_last_line(line) == {"sqlite": 12.35, "postgres": None, "api": 0.5}
    with pytest.raises(ValueError, match="not a loop-cost line"):
        loop_cost.parse_last_line("loop-cost: sqlite 1 ms/job")


def test_a_queue_that_grows_through_the_arrivals_is_reported_as_growing() -> None:
    run = loop_cost.LoopRun("sqlite", 100)
    run.pending = [10, 12, 11, 13, 12, 11, 10, 14, 12, 11, 0, 0, 0]
    run.arriving = 10  # the drain after the arrivals does not count
    fifths, level = run.steadiness()
    assert fifths == pytest.approx([11.0, 12.0, 11.5, 12.0, 11.5]) and level
    assert any(line.endswith(": level") for line in run.lines())
    run.pending = [10, 12, 20, 25, 40, 45, 60, 70, 80, 90, 0, 0]
    fifths, level = run.steadiness()
    assert fifths[-1] == 85.0 and not level
    assert any("GROWING" in line for line in run.lines())
    run.arriving = 3  # too few cycles to tell: no line
    assert run.steadiness() == ([], True)
    assert not any(line.startswith("  steady") for line in run.lines())


def test_per_job_figure_takes_the_backend_share_out() -> None:
    assert loop_cost.per_job_ms(10.0, 2.0, 1000) == pytest.approx(8.0)
    run = loop_cost.LoopRun("sqlite", 100)
    run.passes["admission"] = loop_cost.PassCost(calls=3, cpu=1.0, backend=0.25)
    run.passes["reconcile"] = loop_cost.PassCost(calls=6, cpu=0.5, backend=0.25)
    assert run.per_job_ms() == pytest.approx(10.0)
    with pytest.raises(ValueError):
        loop_cost.per_job_ms(1.0, 0.0, 0)


def test_metered_counts_every_backend_call_and_each_fact_built_lazily(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from backends.base import Observed, said_of
    from broker.domain.facts import Finding
    from broker.domain.reasons import Reason

    now = datetime(2026, 11, 29, tzinfo=UTC)
    sim = SimBackend("s", "slurm", [SimPoolSpec("p", "a100-80g")], SimClock(now))
    m = loop_cost.Metered(sim)
    m.inventory()
    said = {n: said_of(Phase.RUNNING, Reason.Running, "") for n in ("a", "b")}

    def build(name: str) -> Fact:
        return Finding(phase=Phase.RUNNING, reason=Reason.Running).fact(
            backend="s", backend_name=name, observed_at=now)

    monkeypatch.setattr(sim, "observe", lambda names=None: Observed(said, build, now))
    facts = m.observe()
    assert isinstance(facts, Observed) and facts.said == said
    assert m.calls == {"inventory": 1, "observe": 1}  # nothing built yet
    assert facts.fact("a") is facts.fact("a")
    assert m.calls["fact"] == 1  # built once, when read, and counted
    assert [f.backend_name for f in facts] == ["a", "b"]
    assert m.calls["fact"] == 2
    assert m.cpu >= 0.0
