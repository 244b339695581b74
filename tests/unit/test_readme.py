"""The README's reason table and state table stay in step with the code, and it names exactly
two set-up commands."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

from broker.domain import REASONS, JobState
from tests.harness.paths import ROOT
from tests.harness.tiers import left_out_by

README = (ROOT / "README.md").read_text()


def _section(title: str) -> str:
    start = README.index(title)
    nxt = re.search(r"^#{2,3} ", README[start + len(title):], re.M)
    return README[start:start + len(title) + (nxt.start() if nxt else len(README))]


def test_every_reason_is_documented_with_its_severity() -> None:
    for reason, info in REASONS.items():
        assert f"| `{reason.value}` | {info.kind.value} | {info.severity} |" in README, reason


def _state_table() -> dict[str, str]:
    """The lifecycle section's | state | meaning | table: each state named in a row's first
    cell (``A / B / C`` names several) -> its meaning."""
    rows = re.findall(r"^\| ([A-Z /]+) \| (.*) \|$", _section("## The lifecycle"), re.M)
    return {s.strip(): meaning.strip() for cell, meaning in rows for s in cell.split("/")}


def test_every_state_is_documented() -> None:
    table = _state_table()
    assert sorted(table) == sorted(s.value for s in JobState)
    assert all(table.values()), table


def test_readme_names_exactly_two_setup_commands() -> None:
    section = _section("## Two commands")
    blocks = re.findall(r"^```sh\n(.*?)^```", section, re.M | re.S)
    # the section's first block sets up; the later ones use the running broker
    commands = [line.split("#", 1)[0].strip() for line in blocks[0].splitlines() if line.strip()]
    assert commands == ["scripts/demo", "scripts/test"]
    for command in commands:
        assert os.access(ROOT / command, os.X_OK), command


def test_the_readme_test_command_runs_every_test() -> None:
    """``scripts/test`` with no arguments deselects nothing: no marker filter in the script or in
    pytest's configured options; the fast tier is an argument the reader adds."""
    script = (ROOT / "scripts" / "test").read_text()
    pytest_line = next(line for line in script.splitlines() if "-m pytest" in line)
    # options before the reader's arguments only choose how tests run (xdist workers), never which
    assert re.search(r"-m pytest( -n \d+ --dist loadgroup)? \"\$@\"\s*$", pytest_line), pytest_line
    addopts = re.search(r"^addopts = (.*)$", (ROOT / "pyproject.toml").read_text(), re.M)
    assert addopts is not None and " -m " not in f" {addopts.group(1)} "


def test_every_documented_reason_exists_and_is_produced() -> None:
    """The reason table names only reasons of the code, and each of those is set somewhere
    outside its own definition (a reason no code path produces is a promise the broker does
    not keep)."""
    documented = set(re.findall(r"^\| `(\w+)` \| \w+ \| \d+ \|", _section("## Reasons"), re.M))
    assert documented == {r.value for r in REASONS}
    code = "\n".join(
        p.read_text() for package in ("broker", "backends", "policies")
        for p in (ROOT / package).rglob("*.py")
        if p != ROOT / "broker" / "domain" / "reasons.py" and "migrations" not in p.parts
    )
    unused = [r.name for r in REASONS
              if not re.search(rf"\b(Reason|R)\.{r.name}\b|\"{r.value}\"", code)]
    assert unused == []


def test_every_command_that_prints_a_result_takes_json() -> None:
    """The README's promise about --json, with its exceptions, matches the commands."""
    import typer

    from broker.cli.main import app

    def leaves(cmd: object, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, object]]:
        subs = getattr(cmd, "commands", None)
        if not subs:
            yield " ".join(prefix), cmd
            return
        for name, sub in subs.items():
            yield from leaves(sub, (*prefix, name))

    without = {name for name, cmd in leaves(typer.main.get_command(app))
               if not any("--json" in p.opts for p in getattr(cmd, "params", []))}
    claim = re.search(r"Every command that prints a result takes `--json` \(all but ([^)]*)\)",
                      " ".join(README.split()))
    assert claim is not None
    assert without == set(re.findall(r"`([\w ]+)`", claim.group(1)))


def test_the_fast_tier_command_names_markers_that_exist() -> None:
    """The README's fast tier deselects by markers pytest knows (and so leaves out the slow and
    browser tests), and every test module that takes a cluster or PostgreSQL fixture directly
    carries its marker."""
    line = re.search(r'`scripts/test -m "([^"]+)"`', README)
    assert line is not None
    named = set(re.findall(r"not (\w+)", line.group(1)))
    declared = set(re.findall(r'^  "(\w+):', (ROOT / "pyproject.toml").read_text(), re.M))
    assert named == {"slurm", "k8s", "postgres"} and named <= declared
    assert left_out_by(line.group(1)) == {"slow", "ui"} <= declared
    for fixture, marker in (("slurm_cluster", "slurm"), ("k8s_cluster", "k8s"),
                            ("pg_server", "postgres")):
        for path in sorted((ROOT / "tests").rglob("test_*.py")):
            text = path.read_text()
            uses = re.search(rf"def test_\w+\([^)]*\b{fixture}\b", text, re.S)
            if uses and f"mark.{marker}" not in text:
                raise AssertionError(f"{path.relative_to(ROOT)} uses {fixture} unmarked")
