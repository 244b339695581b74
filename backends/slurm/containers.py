"""How a Slurm backend runs a job's image (isthmus.yaml ``backends[].settings.container``).

The ranks of a job that names ``entrypoint.image`` run inside that image, every rank on every
node, with the runtime the site has:

- `oci`: `srun --container=BUNDLE`, Slurm's own (`oci.conf` with runc/crun). The batch script
  first fetches and unpacks the image on every node (`skopeo copy` + `umoci unpack` into the
  job's directory) and records the manifest digest in the job's comment (`image=sha256:...`).
  Slurm 22.05 runs one task per node in a container step, so the gang must be one per node.
- `pyxis`: `srun --container-image=REF` (NVIDIA pyxis/enroot pulls it on every node).
- `apptainer` / `singularity`: `srun apptainer exec docker://REF ...` (its own cache).
- `podman`: `srun podman run --rm --network=host --env-host ... REF ...`, one container a rank.
- `none`: this backend's pools cannot run images; placement never offers them to a job that
  names one (reason ImageUnsupported).

Inside the container every rank gets the job's env, the rank variables of
``backends.slurm.script`` (RANK, WORLD_SIZE, MASTER_ADDR, ...) and the step's ``SLURM_*``; the
job's directory is bound at the same path, each ``mounts`` entry of the spec at its path (its
host directory from ``volumes``), and the site's own ``binds``.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from backends.base import SubmitRequest, Unsupported
from backends.slurm.records import BatchJob
from broker.domain.facts import Finding, Phase
from broker.domain.failures import FailureCategory
from broker.domain.reasons import Reason

Runtime = Literal["oci", "pyxis", "apptainer", "singularity", "podman", "none"]
_HOST_PATH = r"^/[A-Za-z0-9._/+-]*$"
HostPath = Annotated[str, Field(pattern=_HOST_PATH, max_length=1024)]
_VOLUME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


@dataclass(frozen=True, slots=True)
class Bind:
    """A host directory every container of this backend sees (e.g. a shared scratch)."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    source: HostPath
    target: HostPath
    read_only: bool = True


@dataclass(frozen=True, slots=True)
class ContainerSettings:
    __pydantic_config__ = ConfigDict(extra="forbid")

    runtime: Runtime = "none"
    """How ranks run inside the job's image; 'none': this backend's pools run no images."""
    binds: tuple[Bind, ...] = ()
    """Host directories bound into every container."""
    volumes: Mapping[str, HostPath] = field(default_factory=dict)
    """Spec mount name -> host directory (what a PersistentVolumeClaim is on Kubernetes)."""
    tls_verify: bool = True
    """oci: skopeo checks the registry's TLS (false only for a loopback test registry)."""

    @property
    def runs_images(self) -> bool:
        return self.runtime != "none"

    def problems(self) -> list[tuple[str, str]]:
        out = []
        for name in self.volumes:
            if not _VOLUME.match(name):
                out.append((f"container.volumes.{name}",
                            "must be a mount name as jobs give it (a lower-case DNS name)"))
        return out


# -- rendering (used by backends.slurm.script) ---------------------------------------------------

_IMAGE_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,511}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Runs one rank inside the image, with /bin/sh (the image must have one). Fixed text; the job's
# env and argv come from job.env, written by the batch script with every value shell-quoted.
# $1: the rank when the runtime hands it as an argument (oci: Slurm 22.05 gives a container
# the environment of the srun that started it, not each task's, so SLURM_PROCID would be 0 for
# every rank; srun --multi-prog's %t is each task's own number).
CONTAINER_LAUNCHER = r'''#!/bin/sh
# Isthmus container launcher: one rank inside the job's image.
rank=${1:-${SLURM_PROCID:-0}}
. "$ISTHMUS_JOB_DIR/job.env"
tpn=${ISTHMUS_TASKS_PER_NODE:-}
if [ -n "$tpn" ]; then
  node=$((rank / tpn)); local=$((rank % tpn)); lws=$tpn
else
  node=${SLURM_NODEID:-0}; local=${SLURM_LOCALID:-0}; lws=1; i=0
  for part in $(echo "${SLURM_STEP_TASKS_PER_NODE:-1}" | tr ',' ' '); do
    count=${part%%(*}; rep=1
    case $part in *"(x"*) rep=${part#*(x}; rep=${rep%)} ;; esac
    if [ "$node" -ge "$i" ] && [ "$node" -lt $((i + rep)) ]; then lws=$count; fi
    i=$((i + rep))
  done
fi
export RANK="$rank" WORLD_SIZE="$ISTHMUS_WORLD_SIZE" LOCAL_RANK="$local" \
  LOCAL_WORLD_SIZE="$lws" NODE_RANK="$node" NNODES="${SLURM_JOB_NUM_NODES:-1}" \
  GPUS_PER_NODE=$((lws * ISTHMUS_GPUS_PER_REPLICA)) MASTER_ADDR="$ISTHMUS_MASTER_ADDR"
exec "$@"
'''

# oci: fetch and unpack the image on this node (once per job and host: a lock and a finished
# bundle are shared when nodes share the directory), bind the job's directories, and put the
# manifest digest in the job's Slurm comment (image=sha256:...) for the run's record.
PREPARE = r'''"""Isthmus: fetch and unpack a job's image into an OCI bundle here. Fixed text."""
import fcntl, json, os, socket, subprocess, sys, time
with open(sys.argv[1]) as f:
    cfg = json.load(f)
bundle = cfg["bundle"]
layout = bundle + ".layout"
os.makedirs(os.path.dirname(bundle), mode=0o700, exist_ok=True)
node = os.environ.get("SLURMD_NODENAME", socket.gethostname())
t0 = time.monotonic()
with open(bundle + ".lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if os.path.exists(os.path.join(bundle, "config.json")):
        action = "reused"
    else:
        tls = [] if cfg["tls_verify"] else ["--src-tls-verify=false"]
        # the credentials file is the job's own (none: an anonymous pull); left to itself,
        # skopeo probes /run/containers/<uid>/, which a root container tool makes 0700 on a
        # host, and then fails every job user's pull with "permission denied"
        auth = ["--authfile", bundle + ".auth.json"]
        subprocess.run(["skopeo", "copy", "--quiet", *tls, *auth, "docker://" + cfg["image"],
                        "oci:" + layout + ":image"], check=True)
        subprocess.run(["umoci", "unpack", "--rootless", "--image", layout + ":image", bundle],
                       check=True, stdout=subprocess.DEVNULL)
        path = os.path.join(bundle, "config.json")
        with open(path) as f:
            config = json.load(f)
        config["process"]["terminal"] = False
        config.setdefault("mounts", []).extend(
            {"destination": b["target"], "type": "bind", "source": b["source"],
             "options": ["rbind", "ro" if b["read_only"] else "rw"]} for b in cfg["binds"])
        with open(path + ".tmp", "w") as f:
            json.dump(config, f)
        os.replace(path + ".tmp", path)
        action = "fetched and unpacked"
    with open(os.path.join(layout, "index.json")) as f:
        digest = json.load(f)["manifests"][0]["digest"]
print(f"isthmus: image {cfg['image']} {action} on {node} in {time.monotonic() - t0:.2f}s "
      f"({digest})", file=sys.stderr, flush=True)
if os.environ.get("SLURM_NODEID", "0") == "0":
    comment = cfg["comment"].replace("image=pending", "image=" + digest)
    subprocess.run(["scontrol", "update", "JobId=" + os.environ["SLURM_JOB_ID"],
                    "Comment=" + comment], stdout=subprocess.DEVNULL, check=True)
'''


# -- the job comment's image field (read by the adapter) -----------------------------------------

IMAGE_PENDING = "pending"
_COMMENT_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def image_comment(image: str | None, settings: ContainerSettings) -> str:
    """The comment field a job with an image starts with under `oci` (its prepare step
    replaces it with the digest); nothing for the other runtimes, which pull on their own and
    report no digest."""
    return f",image={IMAGE_PENDING}" if image and settings.runtime == "oci" else ""


def comment_image(comment: str) -> str | None:
    """The image field of an Isthmus job comment: 'pending' until every node has the image,
    then its manifest digest 'sha256:<64 hex>'; None when absent (a job without an image) or
    not one of those (a comment edited by hand is no evidence)."""
    value = None
    for part in comment[:1024].split(","):
        if part.startswith("image="):
            value = part.removeprefix("image=")
    if value == IMAGE_PENDING or (value is not None and _COMMENT_DIGEST.match(value)):
        return value
    return None


def with_image(got: Finding, comment: str) -> tuple[Finding, tuple[str, ...]]:
    """A classified finding with what the comment says of the image: a job Slurm runs whose
    image is still being fetched has not started its ranks (STARTING, PullingImage); one that
    failed before any node had it failed for its image (RESOURCE_ENV). Returns the finding and
    the image digests the ranks run (the Fact's image_ids)."""
    image = comment_image(comment)
    if image is None:
        return got, ()
    if image != IMAGE_PENDING:
        return got, (image,)
    if got.phase is Phase.RUNNING:
        return replace(got, phase=Phase.STARTING, reason=Reason.PullingImage,
                       message="fetching and unpacking the job's image on every node"), ()
    if got.phase is Phase.FAILED and got.failure is FailureCategory.USER_ERROR:
        return replace(got, reason=Reason.ResourceEnv, failure=FailureCategory.RESOURCE_ENV,
                       message=f"the job's image could not be fetched or unpacked "
                       f"({got.message or 'see the job output'})"), ()
    return got, ()


def check_image(image: str) -> str:
    if not _IMAGE_REF.match(image):
        raise Unsupported(f"entrypoint.image {image!r} is not an image reference Slurm can run")
    return image


def pyxis_ref(image: str) -> str:
    """'host:5000/ns/img:tag' -> 'host:5000#ns/img:tag' (enroot names the registry with '#');
    a reference without a registry host is left as it is."""
    first, _, rest = image.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return f"{first}#{rest}"
    return image


def _binds(request: SubmitRequest, settings: ContainerSettings, job_dir: str) -> list[Bind]:
    out = [Bind(job_dir, job_dir, read_only=False), *settings.binds]
    for m in request.snapshot.spec.mounts:
        host = settings.volumes.get(m.name)
        if host is None:
            raise Unsupported(f"mounts: volume {m.name!r} has no host directory on this Slurm "
                              "backend (container.volumes)")
        out.append(Bind(host, m.path, m.read_only))
    return out


def _bind_arg(b: Bind) -> str:
    return shlex.quote(f"{b.source}:{b.target}" + (":ro" if b.read_only else ""))


def file_lines(request: SubmitRequest, job: BatchJob, settings: ContainerSettings,
               b64: Callable[[bytes], str], end: str) -> list[str]:
    """Batch-script lines writing the container launcher, its env file and (oci) the prepare
    step's files into the job's directory; none for a job without an image."""
    spec = request.snapshot.spec
    if not spec.entrypoint.ranks_image:  # none, or launcher 'batch': the script runs as sbatch
        return []                        # runs it (Entrypoint.ranks_image)
    if not settings.runs_images:
        raise Unsupported("this Slurm backend runs no images (container.runtime: none); "
                          f"entrypoint.image {spec.entrypoint.image!r} cannot run here")
    image = check_image(spec.entrypoint.ranks_image)
    env = {**spec.env, **request.env}
    env.setdefault("ISTHMUS_JOB_ID", request.job_id)
    env.setdefault("ISTHMUS_ATTEMPT", str(request.attempt))
    shape = job.shape
    env["ISTHMUS_WORLD_SIZE"] = str(shape.replicas)
    env["ISTHMUS_GPUS_PER_REPLICA"] = str(shape.gpus_per_replica)
    if shape.tasks_per_node is not None:
        env["ISTHMUS_TASKS_PER_NODE"] = str(shape.tasks_per_node)
    lines = []
    for key, value in env.items():
        if not _ENV_NAME.match(key):
            raise Unsupported(f"env: {key!r} is not a shell variable name")
        lines.append(f"export {key}={shlex.quote(value)}")
    argv = spec.entrypoint.command
    if argv is None:
        lines.append('set -- /bin/sh "$ISTHMUS_JOB_DIR/user-script"')
    else:
        lines.append("set -- " + " ".join(shlex.quote(a) for a in argv))
    out = [
        f"cat > \"$ISTHMUS_JOB_DIR/container.sh\" <<'{end}'", CONTAINER_LAUNCHER.rstrip("\n"),
        end,
        f"base64 -d > \"$ISTHMUS_JOB_DIR/job.env\" <<'{end}'",
        b64(("\n".join(lines) + "\n").encode()), end,
    ]
    if settings.runtime == "oci":
        if shape.tasks_per_node != 1:
            raise Unsupported("container.runtime 'oci': Slurm runs one task per node in a "
                              "container step (22.05: 'unexpected number of tasks'); this "
                              "gang needs one replica per node")
        cfg = {"image": image, "tls_verify": settings.tls_verify, "comment": job.comment,
               "bundle": f"{job.work_dir}/bundle",
               "binds": [{"source": b.source, "target": b.target, "read_only": b.read_only}
                         for b in _binds(request, settings, job.work_dir)]}
        out += [
            f"cat > \"$ISTHMUS_JOB_DIR/prepare.py\" <<'{end}'", PREPARE.rstrip("\n"), end,
            f"base64 -d > \"$ISTHMUS_JOB_DIR/container.json\" <<'{end}'",
            b64(json.dumps(cfg, sort_keys=True).encode()), end,
            f"echo '* /bin/sh {job.work_dir}/container.sh %t' > \"$ISTHMUS_JOB_DIR/ranks.conf\"",
        ]
    return out


def rank_lines(request: SubmitRequest, job: BatchJob, settings: ContainerSettings,
               python: str) -> list[str]:
    """The batch-script lines that start every rank inside the image (in the background)."""
    spec = request.snapshot.spec
    image = check_image(spec.entrypoint.ranks_image or "")
    shape = job.shape
    opts = " ".join(shape.srun_options()) + " --kill-on-bad-exit=1"
    launch = '/bin/sh "$ISTHMUS_JOB_DIR/container.sh"'
    if settings.runtime == "oci":
        nodes = shape.nodes if shape.nodes is not None else shape.replicas
        return [
            "# Fetch and unpack the image on every node (skopeo + umoci), then run each rank",
            "# in it with Slurm's own --container (oci.conf); --multi-prog hands each its rank.",
            f"srun --nodes={nodes} --ntasks={nodes} --ntasks-per-node=1 {python} "
            '"$ISTHMUS_JOB_DIR/prepare.py" "$ISTHMUS_JOB_DIR/container.json" || exit 125',
            f'srun {opts} --container="$ISTHMUS_JOB_DIR/bundle" '
            '--multi-prog "$ISTHMUS_JOB_DIR/ranks.conf" &',
        ]
    binds = _binds(request, settings, job.work_dir)
    if settings.runtime == "pyxis":
        mounts = shlex.quote(",".join(
            f"{b.source}:{b.target}" + (":ro" if b.read_only else "") for b in binds))
        return [
            "# pyxis (enroot) pulls the image on every node and runs each rank in it.",
            f"srun {opts} --container-image={shlex.quote(pyxis_ref(image))} "
            f"--container-mounts={mounts} {launch} &",
        ]
    if settings.runtime in ("apptainer", "singularity"):
        flags = " ".join(f"--bind {_bind_arg(b)}" for b in binds)
        return [
            f"# {settings.runtime} pulls the image on every node and runs each rank in it",
            "# (the host environment, SLURM_* included, passes into the container).",
            f"srun {opts} {settings.runtime} exec {flags} "
            f"{shlex.quote('docker://' + image)} {launch} &",
        ]
    flags = " ".join(f"-v {_bind_arg(b)}" for b in binds)
    return [
        "# podman pulls the image on every node and runs each rank in its own container.",
        f"srun {opts} podman run --rm --network=host --env-host {flags} "
        f"{shlex.quote(image)} {launch} &",
    ]
