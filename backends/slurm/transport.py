"""The interface both transports implement (Slurm CLI on a login node, slurmrestd remotely)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from backends.base import Unsupported
from backends.slurm.records import BatchJob, NodeEvent, NodeRecord, SlurmJob, Switch
from backends.slurm.versions import Dialect


class SubmitRefused(Unsupported):
    """Slurm refused the job (bad partition, impossible request); the message says why. An
    Unsupported: for the broker it is the backend refusing the request, like any other."""


class Transport(Protocol):
    kind: str  # "cli" or "rest"

    def dialect(self) -> Dialect:
        """Detect (once) and return the Slurm dialect; raises UnsupportedSlurmVersion."""
        ...

    def nodes(self) -> list[NodeRecord]: ...

    def topology(self) -> list[Switch]: ...

    def jobs(self) -> list[SlurmJob]:
        """Every job slurmctld knows (pending, running, recently ended), in one call."""
        ...

    def find(self, name: str) -> list[SlurmJob]:
        """Jobs with exactly this name still known to slurmctld."""
        ...

    def accounting(
        self, *, names: Sequence[str] = (), job_ids: Sequence[str] = (), since: datetime
    ) -> list[SlurmJob]:
        """Jobs from the accounting database (by name and/or id), submitted after ``since``."""
        ...

    def node_events(self, nodes: Sequence[str], *, since: datetime) -> list[NodeEvent]:
        """State changes of these nodes recorded in accounting since ``since``; [] where the
        transport cannot read them."""
        ...

    def steps(self, job_ids: Sequence[str]) -> dict[str, tuple[str, ...]]:
        """The steps accounting recorded for these ended jobs ("batch", "extern", "0", ...),
        only for jobs whose end accounting has already recorded (its records arrive in order,
        so their steps are complete); jobs missing from the answer are unknown."""
        ...

    def submit(self, job: BatchJob, *, as_user: str | None = None) -> str:
        """Submit and return the Slurm job id; raises SubmitRefused or BackendUnavailable.
        `as_user`: submit as this Unix user (the broker runs as root; CLI only)."""
        ...

    def signal(self, job_id: str, signal: str) -> bool:
        """Send ``signal`` to the batch shell; False when Slurm does not know the job."""
        ...

    def signal_steps(self, job_id: str, signal: str) -> bool:
        """Send ``signal`` to the job's steps, not its batch shell (``scancel --signal``);
        False when Slurm does not know the job."""
        ...

    def signal_full(self, job_id: str, signal: str) -> bool:
        """Send ``signal`` to the batch shell and every step (``scancel --signal --full``);
        False when Slurm does not know the job."""
        ...

    def cancel(self, job_id: str) -> bool:
        """Cancel (SIGTERM, KillWait, SIGKILL); False when Slurm does not know the job."""
        ...

    def close(self) -> None: ...
