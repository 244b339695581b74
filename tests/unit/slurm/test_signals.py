"""iscancel --signal's three addressees on Slurm, as scancel has them: the steps (default),
the batch shell (-b) and both (-f); the transport call chosen for each."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from backends.slurm.signals import send_signal
from tests.harness.slurm_fakes import FakeTransport, job


@dataclass
class Recording(FakeTransport):
    sent: list[tuple[str, str, str]] = field(default_factory=list)

    def signal(self, job_id: str, signal: str) -> bool:
        self.sent.append(("batch", job_id, signal))
        return True

    def signal_steps(self, job_id: str, signal: str) -> bool:
        self.sent.append(("steps", job_id, signal))
        return True

    def signal_full(self, job_id: str, signal: str) -> bool:
        self.sent.append(("full", job_id, signal))
        return True


@pytest.mark.parametrize(("whom", "words"), [
    ("steps", "sent to the steps of Slurm job 41"),
    ("batch", "sent to the batch shell of Slurm job 41"),
    ("full", "sent to the batch shell and steps of Slurm job 41"),
])
def test_each_addressee_takes_its_own_call(whom: str, words: str) -> None:
    transport = Recording(queue=[job("41", "RUNNING", name="isthmus-x-1"),
                                 job("40", "COMPLETED", name="isthmus-x-1")])
    message = send_signal(transport, "isthmus-x-1", "USR2", whom)
    assert transport.sent == [(whom, "41", "USR2")]
    assert message == f"SIGUSR2 {words}"


def test_slurmrestd_cannot_signal_the_batch_shell_alone() -> None:
    transport = Recording(kind="rest", queue=[job("41", "RUNNING", name="isthmus-x-1")])
    with pytest.raises(Exception, match="whole job"):
        send_signal(transport, "isthmus-x-1", "USR2", "batch")
    assert transport.sent == []
