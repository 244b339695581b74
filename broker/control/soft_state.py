"""The control plane's soft state: what the leading replica keeps between passes so as not to
do the same work again. Never a source of truth: a restart or a hand-over starts empty and
rebuilds each entry from the database (at the cost of the work it saves).

Each cache is declared here with its owner (the one module that reads and writes it) and its
bound, so that none grows with the number of jobs ever seen: over a week of jobs, the specs
cache holds the SPECS_MAX most recently used specs, and every other cache holds only what the
last pass saw (the jobs waiting, the attempts in flight) or a fixed number of entries.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import TYPE_CHECKING, Any

from cachetools import LRUCache

from broker.domain.attempts import RunSnapshot
from broker.domain.spec import JobSpec

if TYPE_CHECKING:
    from policies.eta import Running, RunningEnds
    from policies.run_length import RuntimeModel
    from policies.types import PendingJob

SPECS_MAX = 20_000
"""Parsed job specs kept (least recently used dropped): more than the jobs one cycle reads
under the soaks (about 3,000 waiting), so a steady loop parses each spec once."""

SNAPSHOTS_MAX = 4_096
"""Parsed run snapshots kept between an attempt's dispatch and the reconciler's first sight of
its run (least recently used dropped): more than the attempts dispatched and not yet seen
started under the soaks."""

ETA_FACTS_MAX = 44_000
"""Attempt facts kept for the run-time model (broker.control.eta_inputs); four times what it
reads per pass (RATIO_SAMPLES ended + MAX_RUNNING running attempts)."""

def fresh(at: datetime | None, now: datetime, seconds: float) -> bool:
    """Whether a value kept at `at` is younger than `seconds` at `now`: none kept, or a clock
    that went back since, makes it stale (the caches kept for a while use this)."""
    return at is not None and timedelta(0) <= now - at < timedelta(seconds=seconds)


ViewKey = tuple[str, object, object, str | None]
"""A waiting job's admission view is a function of these: id, submission time, not-before,
exclusions (and the configuration, checked apart)."""
AttemptKey = tuple[str, int]
EtaFacts = tuple[str, float, tuple[str, ...] | None, int]
"""Team, declared limit (s), placed nodes (None: not read yet; () placed by the backend),
GPUs of the gang."""
KeptEnds = tuple["RuntimeModel", datetime, "RunningEnds", tuple["Running", ...]]
"""The model and start a running attempt's ends were predicted with, the ends
(policies.eta.running_ends: they hold while their ratios cover the time it has run), and the
work on its nodes as last given (empty: to be made again)."""
Told = tuple[str, datetime]
"""A waiting message as applied to its job, and when (reconcile)."""
Estimated = tuple[int, float | None, str]
"""Queue position, estimated start (epoch seconds), method: what was last stored."""


@dataclass
class SoftState:
    specs: LRUCache[str, JobSpec] = field(
        default_factory=lambda: LRUCache(maxsize=SPECS_MAX))
    """Owner: ControlPlane.spec. Bound: SPECS_MAX (LRU); steady, the live jobs: the reconciler
    drops the jobs it ends (ControlPlane.forget_specs), admission those that left the queue
    otherwise (cancelled: `waiting`), and readers of ended ones do not keep theirs (about 8 KB
    a spec: a full cache would be 150 MB, grown over minutes of the soak)."""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    """Held for every use of `specs` and `snapshots`: an LRU cache changes even when read
    (the order), and the passes run in threads of their own (runtime), so two passes at once
    could corrupt it (a pop racing an eviction leaves a key in the order that every later
    insert then fails on)."""
    snapshots: LRUCache[AttemptKey, RunSnapshot] = field(
        default_factory=lambda: LRUCache(maxsize=SNAPSHOTS_MAX))
    """Owner: ControlPlane.snapshot. Dispatch parses an attempt's run snapshot and keeps it;
    the reconciler's first sight of the run takes it out (one parse instead of two), as does
    the retry engine for an attempt that never ran. Each holds a parsed spec of its own, so it
    is not kept for the run: steady, mostly the attempts dispatched and not yet seen started;
    the reconciler drops those of the jobs it ends (ControlPlane.forget_specs); a few are left
    until evicted (a dispatch refused, an attempt another leader saw start). Bound:
    SNAPSHOTS_MAX (LRU). A stored snapshot never changes once committed, and only committed
    rows are parsed into it: an entry is never stale, whoever leads."""
    waiting: frozenset[str] = frozenset()
    """Owner: admission._forget_left: the jobs left waiting by the last cycle, whose specs are
    dropped once they are no longer queued. Bound: the queue of the last cycle."""
    views: tuple[int, dict[ViewKey, PendingJob]] | None = None
    """Owner: admission._pending_views (with the id of the configuration they were built
    under). Bound: the jobs of the last cycle (replaced every cycle)."""
    placed_nodes: dict[AttemptKey, tuple[str, ...]] = field(default_factory=dict)
    """Owner: admission._in_flight. Bound: the live attempts not yet seen running by their
    backend in the last cycle (replaced every cycle)."""
    estimated: dict[str, Estimated] = field(default_factory=dict)
    """Owner: admission (estimates not written again while they do not move). Bound: the
    waiting jobs with an estimate in the last cycle (pruned every cycle)."""
    estimated_at: datetime | None = None
    """Owner: admission (ESTIMATE_EVERY_S). When the real cycle last made the queue's
    estimates. One value."""
    runtime_model: tuple[datetime, RuntimeModel] | None = None
    """Owner: admission._runtime_model. One value, learnt again every
    RUNTIME_MODEL_EVERY_S."""
    usage_history: object = None
    """Owner: admission_usage (its History, typed there: that module imports this one).
    Bound: the reservations closed within its window (it drops those out of the window, and
    is rebuilt every FULL_EVERY_S)."""
    decisions_logged: dict[str, datetime] = field(default_factory=dict)
    """Owner: decision_log. Bound: the jobs of the last cycle (replaced every cycle)."""
    progress_key: bytes | None = field(default=None, repr=False)
    """Owner: dispatch: the server secret its progress tokens are derived from. One value: a
    server secret is made once and never changed (broker.store.secrets), so it is read once,
    not in a transaction of every pass. A database restored from elsewhere, or the row deleted
    by hand, is seen when the process starts again. Never shown (repr)."""
    idle_cycle: int | None = None
    """Owner: admission. The stored cycle the idle cycles since are counted on (None: the last
    cycle had jobs to decide). Losing it (a restart) costs one more row."""
    victim_views: tuple[object, dict[AttemptKey, Any]] | None = None
    """Owner: preempt.running_views: the configuration they were built under and each live
    attempt's preemption view with its parsed spec (preempt.KeptView, typed there: that module
    imports this one); only its times are read again. Bound: the live attempts of its last
    call (replaced every call)."""
    running_ends: dict[AttemptKey, KeptEnds] = field(default_factory=dict)
    """Owner: eta_inputs.running_work. Bound: the running attempts of its last pass (replaced
    every pass)."""
    eta_facts: dict[AttemptKey, EtaFacts] = field(default_factory=dict)
    """Owner: eta_inputs. Bound: the RATIO_SAMPLES ended attempts the run-time model last
    learnt from and the attempts running at the last estimating pass (each learning of the
    real cycle, once a minute, keeps only those); ETA_FACTS_MAX between two (emptied when it
    would pass it)."""
    told: dict[str, dict[str, Told]] = field(default_factory=dict)
    """Owner: reconcile. By backend, then by object name: the message its backend said while
    the object waited or started, as last applied to its job, and when (a new one is applied
    even when the reason stays: HeldByKueue 'not evaluated yet', then Kueue's verdict). Bound:
    the live attempts of each backend's last pass (replaced every pass). Emptied when the
    process starts to lead (runtime.keep_lease): the waiting attempts are applied once
    again."""
    budget_used: tuple[datetime, object, dict[date, dict[tuple[str, str | None], float]]] | None \
        = None
    """Owner: control.budgets. When the budgets' use was read (by the period clock), the windows
    read and the use (read again after USE_EVERY_S or when a period rolls over). Bound: the
    teams and users with a budget."""
    budget_told: frozenset[str] = frozenset()
    """Owner: control.budgets. The keys of the budget thresholds told in the current periods
    (a restart asks the notices table again). Bound: the budgets x fractions configured."""
