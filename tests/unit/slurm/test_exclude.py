"""A job queued in Slurm while a starving gang holds nodes there is kept off them: the
placement's exclude_nodes become `#SBATCH --exclude`, and the pools of a CLI-transport backend
say they honour it (the slurmrestd transport does not send it: its pools fall back to closing
the queue, policies/queue_guard.py)."""

from __future__ import annotations

import pytest

from backends.base import SubmitRequest, Unsupported
from backends.slurm.script import RenderSettings, batch_job
from backends.slurm.versions import Dialect
from broker.domain.attempts import Placement, RunSnapshot
from broker.domain.spec import JobSpec
from tests.harness.slurm_fakes import FakeTransport, make, node


class _Listing(FakeTransport):
    def dialect(self) -> Dialect:  # read, not used, by inventory()
        return None  # type: ignore[return-value]


def _request(exclude: tuple[str, ...]) -> SubmitRequest:
    spec = JobSpec.model_validate({
        "name": "train", "team": "vision", "flavors": ["a100-80g"],
        "gang": {"replicas": 1, "gpus_per_replica": 4},
        "entrypoint": {"command": ["python", "train.py"]}, "max_runtime": "1h",
    })
    placement = Placement(backend="slurm", backend_instance="s", pool="slurm-a100",
                          flavor="a100-80g", exclude_nodes=exclude)
    return SubmitRequest(job_id="01abcdefghjkmnpq", attempt=1, name="isthmus-01abcdefghjkmnpq-1",
                         snapshot=RunSnapshot.of(spec), placement=placement)


def _sbatch_lines(exclude: tuple[str, ...]) -> list[str]:
    job = batch_job(_request(exclude), RenderSettings(), partition="a100")
    return [ln for ln in job.script.splitlines() if ln.startswith("#SBATCH ")]


def test_excluded_nodes_become_one_sbatch_exclude_line() -> None:
    lines = _sbatch_lines(("gpu-r1-n0", "gpu-r1-n1"))
    assert "#SBATCH --exclude=gpu-r1-n0,gpu-r1-n1" in lines
    assert not any("--nodelist" in ln for ln in lines)
    assert not any("--exclude" in ln for ln in _sbatch_lines(()))


def test_a_node_name_slurm_cannot_carry_safely_is_refused() -> None:
    with pytest.raises(Unsupported, match="node"):
        _sbatch_lines(("n1,n2",))  # would widen the list
    with pytest.raises(Unsupported, match="node"):
        _sbatch_lines(("n1\n#SBATCH --uid=0",))


@pytest.mark.parametrize(("kind", "honours"), [("cli", True), ("rest", False)])
def test_only_the_cli_transports_pools_say_they_exclude(kind: str, honours: bool) -> None:
    backend = make(_Listing(kind=kind, node_list=[node("n1", "idle")]))
    pools = backend.inventory().pools
    assert pools and all(p.excludes_nodes is honours for p in pools)
