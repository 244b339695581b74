"""The simulated backend as a server runs it: on wall time, brought up to date before every
call the control loop makes, and built from isthmus.yaml (``kind: sim``) by broker/wiring."""

from __future__ import annotations

import os
from collections.abc import Sequence

from backends.base import (
    BackendUnavailable,
    CancelResult,
    SubmitRequest,
    SubmitResult,
)
from backends.sim.backend import SimBackend
from backends.sim.clock import WallClock
from backends.sim.faults import Fault
from backends.sim.model import ExternalLoad, SimFailures, SimPoolSpec
from backends.sim.progress import Reporter
from backends.sim.settings import SimSettings
from broker.domain.facts import Fact
from broker.domain.inventory import InventorySnapshot


class LiveSimBackend(SimBackend):
    """A SimBackend on a WallClock: each call first processes what happened since the last."""

    outage_file: str | None = None
    """While a file exists here, every call fails as unreachable (SimSettings.outage_file)."""

    def _check(self) -> None:
        if self.outage_file is not None and os.path.exists(self.outage_file):
            raise BackendUnavailable(f"simulated backend {self.name} is unreachable "
                                     f"(outage drill: {self.outage_file} exists)")
        super()._check()

    def inventory(self) -> InventorySnapshot:
        self.sync()
        return super().inventory()

    def submit(self, request: SubmitRequest) -> SubmitResult:
        self.sync()
        return super().submit(request)

    def lookup(self, name: str) -> Fact | None:
        self.sync()
        return super().lookup(name)

    def cancel(self, name: str, grace_seconds: int) -> CancelResult:
        self.sync()
        return super().cancel(name, grace_seconds)

    def observe(self, names: Sequence[str] | None = None) -> Sequence[Fact]:
        self.sync()
        return super().observe(names)


def build(name: str, pools: Sequence[SimPoolSpec], settings: SimSettings,
          progress_url: str | None) -> LiveSimBackend:
    """A LiveSimBackend named `name` with `pools` (their shapes from isthmus.yaml, translated
    by the wiring) and `settings`; progress goes to `progress_url` unless the settings say."""
    rates = settings.faults
    failures = SimFailures(
        start_delay_s=settings.start_delay,
        fault_rates=tuple((f, r) for f, r in ((Fault.NODE_LOSS, rates.node_loss),
                                              (Fault.OOM, rates.oom),
                                              (Fault.IMAGE_PULL, rates.image_pull)) if r > 0),
    )
    external = ExternalLoad(arrivals_per_hour=settings.foreign_arrivals_per_hour,
                            occupied=settings.foreign_load)
    url = settings.progress_url or progress_url
    reporter = Reporter(url, name=name) if settings.progress and url else None
    live = LiveSimBackend(
        name, settings.emulate, pools, WallClock(settings.speed),
        seed=settings.seed, failures=failures, external=external, reporter=reporter,
        runtime_fraction=settings.runtime_fraction,
        progress_every=settings.progress_interval,
    )
    live.outage_file = settings.outage_file
    return live
