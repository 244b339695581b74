"""`logs` of the Slurm backend on the real local cluster: the job's output file."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from backends.slurm import SlurmBackend
from broker.domain.facts import Phase
from tests.fixtures.slurm import SlurmCluster
from tests.harness.slurm_backend import Jobs, make_backend, wait_fact
from tests.harness.wait import wait_until

pytestmark = pytest.mark.slurm


@pytest.fixture
def backend(slurm_cluster: SlurmCluster) -> Iterator[SlurmBackend]:
    be = make_backend(slurm_cluster, "cli")  # reading the file is the same for REST
    yield be
    be.close()


@pytest.fixture
def jobs(slurm_cluster: SlurmCluster) -> Iterator[Jobs]:
    j = Jobs(slurm_cluster)
    yield j
    j.cleanup()


PRINT_RANK = "import os; print('hello from rank', os.environ['NODE_RANK'], flush=True)"


def test_logs_read_the_output_file_of_every_rank(
    backend: SlurmBackend, jobs: Jobs
) -> None:
    req = jobs.request({"command": ["/usr/bin/python3", "-c", PRINT_RANK]})
    assert backend.logs(req.name) == []  # not submitted: nothing to read
    backend.submit(req)
    wait_fact(backend, req.name, {Phase.SUCCEEDED, Phase.FAILED}, timeout=120)

    def both_ranks() -> str | None:
        (log,) = backend.logs(req.name)
        ok = "hello from rank 0" in log.text and "hello from rank 1" in log.text
        return log.text if ok else None

    text = wait_until(both_ranks, timeout=20, interval=0.5, what="both ranks in the output")
    (log,) = backend.logs(req.name)
    assert log.rank is None and log.source.endswith(".out") and req.name in log.source
    (tail,) = backend.logs(req.name, tail=1)
    assert tail.text == text.splitlines(keepends=True)[-1]
    (one,) = backend.logs(req.name, rank=1)
    assert "one file" in one.note  # Slurm keeps every rank in one file, and says so
