"""What a run actually ran with, resolved once when its ranks start.

The run snapshot (`attempts.RunSnapshot`) is what was asked for, fixed at admission and never
changed. Some facts that reproducing a run needs are only known once the backend runs it: the
image digest behind a tag, the GPU model of the nodes it got. They are kept beside the snapshot
(`attempts.resolved_json`), written by the first observation of the running gang and never
rewritten, so that an export of an old attempt stays what it was.

Image digest, in order: the digests the ranks report (Kubernetes pods' `imageID`; a Slurm job
under the `oci` runtime: the digest its prepare step wrote into the job's comment), else the
digest pinned in the image reference (`repo@sha256:...`), else none. The entrypoint's SHA-256
(the script text, or the command as canonical JSON) is always recorded: on Slurm without an
image it is what identifies the code that ran.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime

from pydantic import BaseModel, ConfigDict

from broker.domain.attempts import RunSnapshot
from broker.domain.facts import Fact

_DIGEST_MARK = "@sha256:"


class ResolvedRun(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    resolved_at: datetime
    backend: str
    backend_id: str | None = None
    image: str | None = None  # as asked
    image_digest: str | None = None  # sha256:..., when known
    image_ids: tuple[str, ...] = ()  # as the ranks reported them
    entrypoint_sha256: str
    gpu_models: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    code_version: str | None = None
    data_version: str | None = None


def digest_of(image_ref: str) -> str | None:
    """'docker-pullable://repo@sha256:ab..', 'repo@sha256:ab..' or a bare 'sha256:ab..' (a
    Slurm job's comment) -> 'sha256:ab..'."""
    if image_ref.startswith("sha256:"):
        return image_ref
    if _DIGEST_MARK not in image_ref:
        return None
    return "sha256:" + image_ref.rsplit(_DIGEST_MARK, 1)[1]


def entrypoint_sha256(snapshot: RunSnapshot) -> str:
    ep = snapshot.spec.entrypoint
    text = ep.script if ep.script is not None else json.dumps(ep.command, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def resolve(snapshot: RunSnapshot, fact: Fact, now: datetime) -> ResolvedRun:
    """The facts of a started run. Pure."""
    image = snapshot.spec.entrypoint.image
    ids = tuple(sorted(set(i for i in fact.image_ids if i)))
    digests = sorted({d for d in (digest_of(i) for i in ids) if d})
    digest = digests[0] if len(digests) == 1 else None  # ranks disagreeing: no one digest
    if digest is None and not digests and image:
        digest = digest_of(image)
    return ResolvedRun(
        resolved_at=now, backend=fact.backend, backend_id=fact.backend_id, image=image,
        image_digest=digest, image_ids=ids, entrypoint_sha256=entrypoint_sha256(snapshot),
        gpu_models=tuple(sorted(set(fact.gpu_models))), nodes=tuple(sorted(set(fact.nodes))),
        code_version=snapshot.code_version, data_version=snapshot.data_version,
    )
