"""The two soaks (bench/soak.py over the simulated federation, bench/soak_real.py over the
real clusters) take the same run options from one definition, each with its own run length
and rate, and each its own extra options."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench import soak, soak_real
from tests.harness.wait import wait_until

SHARED = ["--minutes", "4", "--rate", "50", "--outage", "5", "--warmup", "1", "--drain", "30",
          "--seed", "3", "--keep", "--no-drills"]


def test_each_soak_keeps_its_own_run_length_and_rate() -> None:
    sim, real = soak.parse_args([]), soak_real.parse_args([])
    assert (sim.minutes, sim.rate) == (30, 200)
    assert (real.minutes, real.rate) == (10, 2)
    for args in (sim, real):
        assert (args.outage, args.warmup, args.drain, args.seed) == (60, 2, 300, 17)
        assert not args.keep and not args.no_drills and not args.split


def test_both_soaks_take_the_shared_options_alike() -> None:
    sim = soak.parse_args([*SHARED, "--split", "--db", "postgresql://x/y"])
    real = soak_real.parse_args([*SHARED, "--slurm-state", "/tmp/s"])
    shared = ("minutes", "rate", "outage", "warmup", "drain", "seed", "keep", "no_drills")
    assert {k: vars(sim)[k] for k in shared} == {k: vars(real)[k] for k in shared} == {
        "minutes": 4.0, "rate": 50.0, "outage": 5.0, "warmup": 1, "drain": 30.0, "seed": 3,
        "keep": True, "no_drills": True}
    assert sim.split and sim.db == "postgresql://x/y"
    assert real.slurm_state == Path("/tmp/s")


@pytest.mark.parametrize("given", [["--split"], ["--db", "x"], ["--control-nice", "5"]])
def test_the_real_soak_refuses_the_simulated_ones_own_options(given: list[str]) -> None:
    with pytest.raises(SystemExit):
        soak_real.parse_args(given)


def test_the_jobs_progress_load_is_stated_and_spread_over_the_replicas(tmp_path: Path) -> None:
    """Each simulated backend's jobs report to one API replica in turn (a load balancer's
    share: they all went to one replica), every `--progress-every` simulated seconds; 0 turns
    the reports off."""
    import yaml

    assert soak.parse_args([]).progress_every == 400
    cfg = yaml.safe_load(soak.write_config(tmp_path, 100, tmp_path / "o", 400,
                                           ["http://a", "http://b"]).read_text())
    settings = [b["settings"] for b in cfg["backends"]]
    assert [s["progress_url"] for s in settings] == ["http://a", "http://b"]
    assert [s["progress_interval"] for s in settings] == [400, 400]
    off = yaml.safe_load(soak.write_config(tmp_path, 100, tmp_path / "o", 0).read_text())
    assert all(b["settings"]["progress"] is False and "progress_url" not in b["settings"]
               for b in off["backends"])


def test_the_control_processes_start_under_the_nice_asked(tmp_path: Path) -> None:
    """`--control-nice 5`: a control process runs at the harness's niceness plus 5 (its pid the
    one the soak measures and kills), an API replica at the harness's own."""
    config = tmp_path / "isthmus.yaml"
    os.mkfifo(config)  # the process blocks on reading its configuration: alive until killed
    base = os.getpriority(os.PRIO_PROCESS, 0)
    for role, nice, expected in (("control", 5, min(base + 5, 19)), ("api", 0, base)):
        r = soak.Replica("c", config, "sqlite:///x", tmp_path, role=role, nice=nice)
        r.start()
        try:
            assert r.proc is not None
            comm = Path(f"/proc/{r.proc.pid}/comm")

            def execd() -> bool:  # nice has exec'd python (the process waits on its config)
                assert r.alive(), r.log.read_text()
                return comm.read_text().strip() != "nice"

            wait_until(execd, 30, "nice to exec the broker", interval=0.01)
            assert os.getpriority(os.PRIO_PROCESS, r.proc.pid) == expected
        finally:
            r.kill()


def test_the_control_nice_option_defaults_to_equal_weight_and_needs_split() -> None:
    assert soak.parse_args([]).control_nice == 0
    assert soak.parse_args(["--split", "--control-nice", "5"]).control_nice == 5
    with pytest.raises(SystemExit):  # without --split the loop runs in the API's processes
        soak.parse_args(["--control-nice", "5"])
