"""A job's extra sbatch options (native.slurm.options) reach the submission: as #SBATCH lines of
the batch script sbatch reads, and as fields of the slurmrestd body; a constraint of the job's
own is ANDed with the rack Isthmus asks for; the site's own directives keep the last word."""

from __future__ import annotations

import dataclasses

import pytest

from backends.base import SubmitRequest, Unsupported
from backends.slurm.script import RenderSettings, batch_job
from backends.slurm.transport_rest import RestTransport
from broker.domain.attempts import RunSnapshot
from broker.domain.native import SlurmNative
from broker.domain.spec import JobSpec
from tests.harness.requests import slurm_request


def _request(*options: str, level: str | None = None, domain: str | None = None
             ) -> SubmitRequest:
    return slurm_request(native={"slurm": {"options": list(options)}}, level=level,
                         domain=domain)


def _directives(script: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in script.splitlines()
            if line.startswith("#SBATCH ")]


def _rest(version: str = "v0.0.38") -> RestTransport:
    return RestTransport(url="http://slurmrestd.invalid", user="u", token="t", version=version)


def test_the_options_are_sbatch_directives_of_the_script() -> None:
    job = batch_job(_request("--qos=high", "--reservation=maint-window", "--nice=10"),
                    RenderSettings(), partition="a100")
    lines = _directives(job.script)
    assert {"--qos=high", "--reservation=maint-window", "--nice=10"} <= set(lines)
    assert job.native == (("qos", "high"), ("reservation", "maint-window"), ("nice", "10"))


def test_the_site_directives_come_after_the_teams_options() -> None:
    """sbatch takes an option's last value: an admin's extra_directives win."""
    job = batch_job(_request("--qos=high"), RenderSettings(extra_directives=("--qos=site",)),
                    partition="a100")
    lines = _directives(job.script)
    assert lines.index("--qos=high") < lines.index("--qos=site")


def test_a_constraint_is_anded_with_the_rack_isthmus_asks_for() -> None:
    own = batch_job(_request("--constraint=ib|roce"), RenderSettings(), partition="a100")
    assert own.constraint == "ib|roce" and "--constraint=ib|roce" in _directives(own.script)
    racked = batch_job(_request("--constraint=ib|roce", level="rack", domain="spine/rack1"),
                       RenderSettings(rack_features=True), partition="a100")
    assert racked.constraint == "rack1&(ib|roce)"
    assert [d for d in _directives(racked.script) if d.startswith("--constraint")] == [
        "--constraint=rack1&(ib|roce)"]


def test_the_rest_body_carries_the_options_as_fields() -> None:
    job = batch_job(_request("--qos=high", "--wckey=cv", "--nice=5", "--constraint=ib"),
                    RenderSettings(), partition="a100")
    props = _rest().submit_body(job)["job"]
    assert (props["qos"], props["wckey"], props["nice"], props["constraints"]) == (
        "high", "cv", 5, "ib")


def test_an_option_slurmrestd_cannot_carry_is_refused_naming_it() -> None:
    job = batch_job(_request("--acctg-freq=task=30"), RenderSettings(), partition="a100")
    with pytest.raises(Unsupported, match="--acctg-freq has no slurmrestd field"):
        _rest().submit_body(job)


def test_an_option_isthmus_sets_never_passes_whatever_was_stored() -> None:
    """The spec refuses it at submit; a snapshot built around that check (an older stored
    spec, a bug) is refused by the backend too, never rendered."""
    request = _request("--qos=high")
    spec = request.snapshot.spec
    assert spec.native is not None and spec.native.slurm is not None
    forged_slurm = SlurmNative.model_construct(options=["--partition=other"])
    forged = spec.model_copy(update={"native": spec.native.model_copy(
        update={"slurm": forged_slurm})})
    forged_request = dataclasses.replace(request, snapshot=RunSnapshot.of(forged))
    with pytest.raises(Unsupported, match="--partition: Isthmus sets it"):
        batch_job(forged_request, RenderSettings(), partition="a100")
    assert isinstance(forged, JobSpec)
