"""A job's entrypoint.image on Slurm: every rank starts inside it, per container runtime, with
user values quoted; a backend with runtime 'none' (the default) renders no image job."""

from __future__ import annotations

import base64
import re
import shlex

import pytest

from backends.base import SubmitRequest, Unsupported
from backends.slurm.containers import Bind, ContainerSettings, pyxis_ref
from backends.slurm.script import RenderSettings, render
from tests.harness.requests import slurm_request

IMAGE = "localhost:5000/team/train:1.0"
HOSTILE = "a'b; rm -rf / $(x)"


def _request(mounts: list[dict[str, str]] | None = None) -> SubmitRequest:
    entry: dict[str, object] = {"image": IMAGE, "command": ["python3", "train.py", HOSTILE]}
    return slurm_request(entry, nodes=("a100-1", "a100-2"), env={"NOTE": HOSTILE},
                         mounts=mounts or [])


def _render(runtime: str, **kw: object) -> str:
    settings = RenderSettings(container=ContainerSettings(runtime=runtime, **kw))  # type: ignore[arg-type]
    return render(_request(), partition="a100", settings=settings)


def _job_env(script: str) -> str:
    blocks = re.findall(r"job\.env\" <<'ISTHMUS_DATA_END'\n(.*?)\nISTHMUS_DATA_END", script,
                        re.S)
    return base64.b64decode(blocks[0].replace("\n", "")).decode()


@pytest.mark.parametrize(("runtime", "rank_start"), [
    ("oci", '--container="$ISTHMUS_JOB_DIR/bundle" --multi-prog "$ISTHMUS_JOB_DIR/ranks.conf"'),
    ("pyxis", "--container-image='localhost:5000#team/train:1.0' --container-mounts="),
    ("apptainer", "apptainer exec --bind /var/tmp/isthmus-slurm-jobs/isthmus-01abcdefghjkmnpq-2:"),
    ("podman", "podman run --rm --network=host --env-host -v "),
])
def test_each_runtime_starts_every_rank_inside_the_image(runtime: str, rank_start: str) -> None:
    script = _render(runtime)
    ranks = [line for line in script.splitlines() if line.startswith("srun --ntasks=2")]
    assert len(ranks) == 1 and rank_start in ranks[0], ranks
    assert "launch.py" not in ranks[0]  # the bare launcher never runs an image job's ranks
    if runtime == "oci":
        assert "prepare.py" in script and "ranks.conf" in script
    else:
        assert ranks[0].endswith('/bin/sh "$ISTHMUS_JOB_DIR/container.sh" &')
    # the user's argv and env reach the ranks as shell-quoted words, never as shell text
    env = _job_env(script)
    assert f"export NOTE={shlex.quote(HOSTILE)}" in env
    assert f"set -- python3 train.py {shlex.quote(HOSTILE)}" in env
    assert HOSTILE not in script
    assert "ISTHMUS_WORLD_SIZE=2" in env and "ISTHMUS_TASKS_PER_NODE=1" in env
    # oci: the comment waits for the digest its prepare step fills in; the others report none
    assert (",image=pending" in script) == (runtime == "oci")


def test_binds_and_volumes_reach_the_container() -> None:
    settings = RenderSettings(container=ContainerSettings(
        runtime="apptainer", binds=(Bind("/scratch", "/scratch", read_only=False),),
        volumes={"imagenet": "/data/imagenet"}))
    req = _request(mounts=[{"name": "imagenet", "path": "/datasets/in 22k"}])
    script = render(req, partition="a100", settings=settings)
    assert "--bind /scratch:/scratch " in script
    assert "--bind '/data/imagenet:/datasets/in 22k:ro'" in script


def test_refusals_name_the_field() -> None:
    with pytest.raises(Unsupported, match=r"container\.runtime: none"):
        render(_request(), partition="a100")  # the default: this backend runs no images
    settings = RenderSettings(container=ContainerSettings(runtime="podman"))
    with pytest.raises(Unsupported, match=r"container\.volumes"):
        render(_request(mounts=[{"name": "other", "path": "/d"}]), partition="a100",
               settings=settings)
    packed = slurm_request({"image": IMAGE, "command": ["true"]}, nodes=("a100-1", "a100-1"))
    oci = RenderSettings(container=ContainerSettings(runtime="oci"))
    with pytest.raises(Unsupported, match="one replica per node"):
        render(packed, partition="a100", settings=oci)


def test_a_job_without_an_image_runs_bare_as_before() -> None:
    script = render(slurm_request(nodes=("a100-1", "a100-2")), partition="a100")
    assert "launch.py\" \"$ISTHMUS_JOB_DIR/job.json\" &" in script
    assert "container" not in script and "image=" not in script


def test_pyxis_names_the_registry_as_enroot_does() -> None:
    assert pyxis_ref("localhost:5000/a/b:1") == "localhost:5000#a/b:1"
    assert pyxis_ref("nvcr.io/nvidia/pytorch:24.01") == "nvcr.io#nvidia/pytorch:24.01"
    assert pyxis_ref("ubuntu:22.04") == "ubuntu:22.04"


@pytest.mark.parametrize("runtime", ["none", "oci", "pyxis"])
def test_an_sbatch_script_runs_as_sbatch_runs_it_whatever_the_image(runtime: str) -> None:
    """isbatch gives every script the compat image, which is what it runs in on Kubernetes;
    on Slurm the script's own srun starts the ranks, so it is neither refused nor wrapped."""
    req = slurm_request({"image": IMAGE, "script": "#!/bin/bash\nsrun hostname\n",
                         "launcher": "batch"}, nodes=("a100-1", "a100-2"))
    assert req.snapshot.spec.entrypoint.ranks_image is None
    settings = RenderSettings(container=ContainerSettings(runtime=runtime))  # type: ignore[arg-type]
    script = render(req, partition="a100", settings=settings)
    assert "container" not in script and "image=" not in script
