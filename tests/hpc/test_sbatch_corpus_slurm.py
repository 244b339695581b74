"""The corpus against the real sbatch of the local cluster (tests marked slurm).

Every script isbatch accepts is accepted by ``sbatch --test-only`` with the node count isbatch
derived, and, submitted held, ``scontrol show job`` shows the same nodes, GPUs and time limit;
every script isbatch refuses is refused by sbatch too, unless the corpus notes a deliberate
difference (``slurm: accept`` on a refused script, e.g. ``--nodes=0``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from broker.domain.hostlist import expand
from broker.dropins.isbatch import run
from tests.fixtures.slurm import SlurmCluster
from tests.hpc.corpus_cases import Case, cases

pytestmark = pytest.mark.slurm
ALL = cases()


@pytest.fixture(scope="module")
def parent(slurm_cluster: SlurmCluster) -> Iterator[str]:
    """A held job for the corpus's dependencies to name."""
    job_id = slurm_cluster.run(
        ["sbatch", "--parsable", "-H", "-J", "isthmus-corpus-parent", "--wrap", "true"]
    ).stdout.strip()
    yield job_id
    slurm_cluster.run(["scancel", job_id], check=False)


def _seconds(limit: str) -> int | None:
    if limit in ("UNLIMITED", "INFINITE"):
        return None
    days, _, rest = limit.rpartition("-")
    h, m, s = (int(x) for x in rest.split(":"))
    return ((int(days or 0) * 24 + h) * 60 + m) * 60 + s


def _show(cluster: SlurmCluster, job_id: str) -> dict[str, str]:
    line = cluster.run(["scontrol", "show", "job", "-o", job_id]).stdout.splitlines()[0]
    return dict(re.findall(r"(\S+?)=(\S*)", line))


@pytest.mark.parametrize("case", ALL, ids=[c.id for c in ALL])
def test_real_sbatch_agrees(
    case: Case, slurm_cluster: SlurmCluster, parent: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = case.argv(parent)
    code = run(["--parse-only", "--json", *argv], case.env)
    out, err = capsys.readouterr()
    test_only = slurm_cluster.run(["sbatch", "--test-only", *argv], check=False, env=case.env)
    if case.slurm == "refuse":
        assert code != 0, out
        assert test_only.returncode != 0, test_only.stderr
        return
    assert test_only.returncode == 0, test_only.stderr
    if code != 0:  # a deliberate difference, noted in the corpus
        assert case.error is not None and case.note, err
        return
    got = json.loads(out)["sbatch"]
    m = re.search(r"on nodes (\S+) in partition", test_only.stderr)
    assert m, test_only.stderr
    if got["replicas"] is not None:
        assert len(expand(m.group(1))) >= got["replicas"]
    submitted = slurm_cluster.run(["sbatch", "--parsable", "--hold", *argv], env=case.env)
    job_id = submitted.stdout.strip().split(";")[0]
    try:
        job = _show(slurm_cluster, job_id)
    finally:
        slurm_cluster.run(["scancel", job_id], check=False)
    assert int(job["NumNodes"].split("-")[0]) == got["replicas"]
    tres = dict(item.split("=", 1) for item in job["TRES"].split(",") if "=" in item)
    gpus = int(tres.get("gres/gpu", "0"))
    assert gpus == (got["gpus_per_node"] or 0) * got["replicas"], job["TRES"]
    limit = _seconds(job["TimeLimit"])
    if got["time_limit_s"] is None:
        assert limit is None
    else:
        assert limit == -(-got["time_limit_s"] // 60) * 60
    if got["partition"]:
        assert job["Partition"] == got["partition"]
    if got["job_name"] and " " not in got["job_name"]:
        assert job["JobName"] == got["job_name"]
