"""What a job's Slurm comment says of its image (the oci prepare step writes it): while it is
'pending' a running job has not started its ranks, afterwards its digest is what ran; a
comment edited into anything else is no evidence."""

from __future__ import annotations

import pytest

from backends.slurm.containers import ContainerSettings, comment_image, image_comment, with_image
from broker.domain.facts import Finding, Phase
from broker.domain.failures import FailureCategory
from broker.domain.reasons import Reason
from broker.domain.reproducibility import digest_of

DIGEST = "sha256:" + "ab" * 32
BASE = "isthmus,job=j1,attempt=1"
RUNNING = Finding(Phase.RUNNING, Reason.Running)
FAILED = Finding(Phase.FAILED, Reason.UserError, FailureCategory.USER_ERROR, exit_code=125,
                 message="exit code 125")


@pytest.mark.parametrize(("comment", "expected"), [
    pytest.param(BASE, None, id="no-image"),
    pytest.param(f"{BASE},image=pending", "pending", id="pending"),
    pytest.param(f"{BASE},image={DIGEST}", DIGEST, id="digest"),
    pytest.param(f"{BASE},image=pending,image={DIGEST}", DIGEST, id="last-wins"),
    pytest.param(f"{BASE},image=sha256:xyz", None, id="not-a-digest"),
    pytest.param(f"{BASE},image=latest", None, id="a-tag-is-no-evidence"),
    pytest.param("x" * 5000 + f",image={DIGEST}", None, id="bounded-length"),
])
def test_comment_image(comment: str, expected: str | None) -> None:
    assert comment_image(comment) == expected


def test_only_oci_jobs_start_pending() -> None:
    oci, pyxis = ContainerSettings(runtime="oci"), ContainerSettings(runtime="pyxis")
    assert image_comment("r/i:1", oci) == ",image=pending"
    assert image_comment(None, oci) == ""
    assert image_comment("r/i:1", pyxis) == ""  # nobody would ever replace it


def test_running_while_pending_is_pulling_the_image() -> None:
    got, ids = with_image(RUNNING, f"{BASE},image=pending")
    assert (got.phase, got.reason, ids) == (Phase.STARTING, Reason.PullingImage, ())


def test_digest_is_what_the_ranks_run() -> None:
    got, ids = with_image(RUNNING, f"{BASE},image={DIGEST}")
    assert (got, ids) == (RUNNING, (DIGEST,))
    assert digest_of(ids[0]) == DIGEST  # what the run's resolved record takes


def test_failure_before_the_image_was_there_is_the_images() -> None:
    got, _ = with_image(FAILED, f"{BASE},image=pending")
    assert (got.failure, got.reason) == (FailureCategory.RESOURCE_ENV, Reason.ResourceEnv)
    assert "image" in got.message
    assert with_image(FAILED, f"{BASE},image={DIGEST}")[0] == FAILED  # the code's own failure
    assert with_image(FAILED, BASE) == (FAILED, ())
