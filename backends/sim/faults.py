"""The faults a simulated job can hit, how each is classified, and when it strikes.

A fault comes from the spec (`isthmus.io/sim-fail: node-loss|oom|image-pull`, on the first
attempt only, so that a demo shows a retry that then succeeds) or from the backend's fault
rates (each attempt draws once). Classification is what the real adapters do with the same
evidence: a lost node is INFRA_TRANSIENT (retried elsewhere on the pool), an OOM kill a
USER_ERROR (the same code would run out again), an image that cannot be pulled RESOURCE_ENV
(retried in another pool). An image pull fails while the ranks start; the others part-way
through the run.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from enum import StrEnum

from broker.domain.failures import FailureCategory

FAIL_ANNOTATION = "isthmus.io/sim-fail"


class Fault(StrEnum):
    NODE_LOSS = "node-loss"
    OOM = "oom"
    IMAGE_PULL = "image-pull"

    @property
    def category(self) -> FailureCategory:
        return _CATEGORY[self]

    def message(self, node: str) -> str:
        return {
            Fault.NODE_LOSS: f"node {node} stopped responding (simulated node loss)",
            Fault.OOM: f"rank on {node} was OOMKilled (simulated out-of-memory)",
            Fault.IMAGE_PULL: f"ErrImagePull on {node}: the image cannot be pulled (simulated)",
        }[self]

    def strikes_after(self, start_delay: float, duration: float, rng: random.Random) -> float:
        """Simulated seconds from the start of the attempt to the failure."""
        if self is Fault.IMAGE_PULL:
            return start_delay / 2
        return start_delay + duration * rng.uniform(0.3, 0.7)


_CATEGORY = {
    Fault.NODE_LOSS: FailureCategory.INFRA_TRANSIENT,
    Fault.OOM: FailureCategory.USER_ERROR,
    Fault.IMAGE_PULL: FailureCategory.RESOURCE_ENV,
}


def from_annotations(annotations: dict[str, str], attempt: int | None) -> Fault | None:
    """The fault the spec asks for on this attempt (first attempts only); unknown values are
    ignored (the spec was accepted; the simulator has nothing to do with them)."""
    value = annotations.get(FAIL_ANNOTATION)
    if value is None or (attempt or 1) > 1:
        return None
    try:
        return Fault(value.strip().lower())
    except ValueError:
        return None


def draw(rates: Sequence[tuple[Fault, float]], rng: random.Random) -> Fault | None:
    """At most one fault per attempt, each with its rate (rates summing above 1 are scaled)."""
    if not rates:
        return None
    total = sum(r for _, r in rates)
    x = rng.random() * max(1.0, total)
    for fault, rate in rates:
        if x < rate:
            return fault
        x -= rate
    return None
