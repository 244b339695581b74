"""Runs the control loop with APScheduler: a lease keeper, the admission cycle, the dispatcher
and one reconciler per backend instance, each on its own interval, plus immediate wake-ups.

Every replica runs the lease keeper; only the holder of the lease runs the other jobs, so two
replicas on one PostgreSQL database never both admit or dispatch. Losing the lease pauses the
loop at once; gaining it resumes it (recovery reads the database and the backends' facts).

Concurrency, made explicit:
- each control job runs in a scheduler thread, never two instances of one job at once
  (`max_instances=1`), but admission, dispatch and the reconcilers may overlap each other;
  they share only the database (transactions) and the backend adapters;
- one writer per adapter: every call into a backend adapter goes through its GatedBackend
  (gate.py), which holds that adapter's lock for the call, so the adapters' own caches need
  no locks. Adapters never wait for each other;
- nobody waits long for a slow backend: admission asks every backend for its inventory at
  once and waits at most `control.inventory_wait` (a backend still busy is served from its
  last inventory up to `control.inventory_max_age` old, else its pools are unavailable), a
  reconciler waits at most `control.observe_timeout` for its observe call, and submit, lookup
  and cancel wait at most `control.backend_lock_wait` for a busy adapter. A call that times out
  keeps running in its worker thread and keeps the adapter's lock until it returns; the
  caller goes on with BackendUnavailable (or the cached inventory).

Wake-ups (submit -> admission -> dispatch -> the reconcile that sees the job start): a commit of new
submissions wakes the admission cycle (on PostgreSQL also when another replica committed them: it
sends NOTIFY and this runtime listens, broker.store.notify); a cycle that admitted wakes the
dispatcher; a dispatch that created backend objects wakes the reconcilers at once and again after
`FOLLOW_UP_S` (a backend shows a fresh object as pending first). A wake that arrives while the job
runs is not lost: the job runs again one gap after that pass ends (its pass may have read the
database before the commit that woke it; run again at once, a loop woken by a steady stream of
submits ran its passes back to back); wakes closer than `min_wake_gap` are deferred to the end of
the gap, not dropped. A reconcile pass that moved a job wakes the admission cycle (an ended job's
GPUs are free), and a backend with a change feed (Kubernetes watches) wakes its reconciler on every
event, at most once per `min_wake_gap`.

Why APScheduler, and what is ours on top (issue 32 asked: use it for what it offers, or replace the
hand-built part): the scheduler gives the thread pool, the interval triggers with coalescing and no
misfire limit, one instance of a job at a time, pausing and resuming every loop job at a change of
leadership, moving a job's next run (a wake: `modify_job`) and one-shot follow-ups (`date` jobs).
Ours is only what it does not offer: a run asked for while the job runs is dropped by
`max_instances=1` ("skipped"), so `_rewake` runs it again one gap after the pass ends; wakes closer
than a gap are merged (`_woken`); and a change to the scheduler after `stop` began is refused
(`_change_scheduler`, as its shutdown holds the job-store lock while it waits for running jobs). A
loop of our own threads would trade those three for writing the generic part (timers, pool,
pause/resume) by hand.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, JobSubmissionEvent
from apscheduler.schedulers.background import BackgroundScheduler

from broker.control.admission import run_admission
from broker.control.decision_log import prune as prune_decisions
from broker.control.dispatch import run_dispatch
from broker.control.lease import LeaderLease
from broker.control.notices import run_notices
from broker.control.plane import ControlPlane
from broker.control.reconcile import run_reconcile
from broker.control.requeue import repair_undecided
from broker.logs import control_cycle, get_logger
from broker.store import notify
from broker.store.fence import Deposed

log = get_logger(__name__)

FOLLOW_UP_S = (0.1, 0.2, 0.3, 0.45, 0.6, 0.8, 1.0, 1.5, 2.0, 4.0)
"""After a dispatch created objects, the reconcilers are woken again this long after it: a
backend reports a freshly created job as pending first and as running a moment later (Slurm
here: 0.3-0.5 s after sbatch), so the first second is sampled densely."""

RECONCILE_WAKE_GAP_S = 0.1
"""Reconcilers may be woken this often (one backend query per pass; the follow-ups above
would otherwise merge into the admission-sized gap and see RUNNING up to half a second late)."""


SKIPPED_AGAIN_S = 0.05
"""A run skipped as the pass before it returned (`Runtime._skipped`) is asked for again this
much later (by then that run has returned; if not, it is skipped and asked for again)."""


@dataclass(frozen=True)
class Intervals:
    admission: float = 5.0
    dispatch: float = 2.0
    reconcile: float = 5.0
    lease_ttl: float = 15.0
    prune: float = 60.0
    """How often the leader prunes the decision log (control.decision_retention)."""
    repair: float = 60.0
    """How often the leader looks for attempt endings left without a retry decision
    (broker.control.requeue.repair_undecided); also at once whenever it starts leading."""
    notices: float = 2.0
    """How often the leader delivers notices (broker.control.notices)."""


class Runtime:
    def __init__(self, plane: ControlPlane, lease: LeaderLease,
                 intervals: Intervals | None = None) -> None:
        self.plane = plane
        self.lease = lease
        self.intervals = intervals or Intervals()
        self.scheduler = BackgroundScheduler(
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None}
        )
        self.leading = False
        self._lock = threading.Lock()
        self._loop_ids: list[str] = []
        self._woken: dict[str, float] = {}  # when each job was last scheduled by a wake
        self._wake_lock = threading.Lock()  # guards the three below (`_lock`: leadership)
        self._running: set[str] = set()
        self._rewake: set[str] = set()  # woken while running: run again a gap after the pass
        self._cycles: dict[str, int] = {}  # passes started per control job (in log lines)
        self._stopping = False  # set by stop() under _scheduling: no change to the scheduler after
        self._scheduling = threading.Lock()
        self._listener: notify.Listener | None = None  # PostgreSQL: wakes sent by other replicas
        self._following = False  # the backends' change feeds are followed (_follow_changes)
        self.min_wake_gap = min(0.5, self.intervals.admission / 4)
        plane.fence(lease.name)  # the loop's writes commit only under this replica's epoch

    # ---- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        iv = self.intervals
        def admission(plane: ControlPlane) -> None:
            if run_admission(plane).record.admitted:
                self.wake("dispatch")  # new intents: create their objects now

        def dispatch(plane: ControlPlane) -> None:
            if run_dispatch(plane):
                self.wake_reconcilers()  # observe the new objects now, not next interval

        self._add("admission", admission, iv.admission)
        self._add("dispatch", dispatch, iv.dispatch)
        self._add("decision-log", prune_decisions, iv.prune)
        self._add("retry-repair", repair_undecided, iv.repair)
        self._add("notices", run_notices, iv.notices)
        def reconcile(plane: ControlPlane, name: str) -> None:
            report = run_reconcile(plane, name)
            if report.transitions or report.lost or report.cancelled:
                self.wake("admission")  # an ended job's quota and GPUs are free now

        for name in self.plane.backends:
            self._add(f"reconcile:{name}", lambda p, n=name: reconcile(p, n), iv.reconcile)
        if notify.supported(self.plane.db):  # submits to other replicas wake this one's cycle
            self._listener = notify.Listener(self.plane.db, lambda: self.wake("admission"))
            self._listener.start()
        self.scheduler.add_job(self.keep_lease, "interval", seconds=iv.lease_ttl / 3,
                               id="lease", next_run_time=datetime.now())
        self.scheduler.add_listener(self._skipped, EVENT_JOB_MAX_INSTANCES)
        self.scheduler.start()

    def stop(self) -> None:
        with self._scheduling:
            self._stopping = True  # see _change_scheduler
        if self._listener is not None:
            self._listener.stop()
        self.scheduler.shutdown(wait=True)
        if self.leading:
            self.lease.release()
            self.leading = False

    def _add(self, job_id: str, fn: Any, seconds: float) -> None:
        def run() -> None:
            if not self.leading:
                return
            self._cycles[job_id] = cycle = self._cycles.get(job_id, 0) + 1
            with self._wake_lock:
                self._running.add(job_id)
                self._rewake.discard(job_id)
            try:
                with control_cycle(job_id, self.plane.epoch, cycle):
                    try:
                        fn(self.plane)
                    except Deposed as exc:  # another replica took over meanwhile
                        log.warning("control job %s: %s; stepping down", job_id, exc)
                        self.step_down()
                    except Exception:  # one failed pass must not stop the loop
                        log.exception("control job %s failed; it runs again next interval",
                                      job_id)
            finally:
                gap = self._gap(job_id)
                with self._wake_lock:
                    self._running.discard(job_id)
                    again = job_id in self._rewake
                    if again:
                        self._rewake.discard(job_id)
                        self._woken[job_id] = time.monotonic() + gap
                if again:
                    self._schedule(job_id, gap)

        self.scheduler.add_job(run, "interval", seconds=seconds, id=job_id)
        self.scheduler.pause_job(job_id)
        self._loop_ids.append(job_id)

    # ---- leadership --------------------------------------------------------------------
    def keep_lease(self) -> None:
        try:
            held = self.lease.try_acquire()
        except Exception:
            log.exception("lease renewal failed; stepping down")
            held = False
        with self._lock:
            if held and not self.leading:
                self.leading = True
                self.plane.epoch = self.lease.epoch
                self.plane.soft.told.clear()  # another leader may have written since
                log.info("leading the control loop (epoch %d)", self.lease.epoch)
                self._follow_changes()
                for job_id in self._loop_ids:
                    self._change_scheduler(partial(self.scheduler.resume_job, job_id),
                                           f"resume of {job_id}")
                    self.wake(job_id)
            elif not held and self.leading:
                log.warning("lost the lease; pausing the control loop")
                self._pause()

    def step_down(self) -> None:
        """Stop leading at once (a fenced write found the lease at a newer epoch). The lease
        keeper takes leadership again only by acquiring the lease anew."""
        with self._lock:
            if self.leading:
                self._pause()

    def _skipped(self, event: JobSubmissionEvent) -> None:
        """APScheduler skipped a run because the job's previous one still counted as running.
        While the pass runs, `_rewake` has it (or the interval came round: that pass covers
        it); once the pass has left `_running`, the run was a wake that came between the
        pass's end and its return to the scheduler, lost unless it is scheduled again."""
        job_id = event.job_id
        with self._wake_lock:
            if job_id in self._running or job_id not in self._loop_ids:
                return
            self._woken[job_id] = time.monotonic() + SKIPPED_AGAIN_S
        self._schedule(job_id, SKIPPED_AGAIN_S)

    def _pause(self) -> None:
        self.leading = False
        with self._wake_lock:
            self._woken.clear()  # a wake once leading again runs at once
        for job_id in self._loop_ids:
            self._change_scheduler(partial(self.scheduler.pause_job, job_id),
                                   f"pause of {job_id}")

    def _change_scheduler(self, change: Callable[[], object], what: str) -> None:
        """Apply `change` to the scheduler unless `stop` has begun. The scheduler's shutdown
        holds its job-store lock while it waits for the running control jobs, so a job that
        changed the scheduler after that (a wake, a follow-up, a pause) would wait for ever,
        and `stop` with it; `stop` sets `_stopping` under the same lock first."""
        with self._scheduling:
            if self._stopping:
                return
            try:
                change()
            except Exception:  # the scheduler is not running
                log.debug("%s ignored", what)

    def _follow_changes(self) -> None:
        """A backend with a change feed (Kubernetes: its Job, pod and Workload watches) wakes
        its reconciler on every event, at most once per `min_wake_gap`: a gang's end is seen,
        and its quota released, at once instead of at the next reconcile interval.

        Done when this replica first leads, not at start: a standby has nothing to wake,
        and a backend must not be led to watch for it (the Kubernetes backend's caches,
        which only the leader's reconciler reads and prunes, now start at its first
        observe, not when followed). A new leader's first passes read the backend directly
        while its watches list. A replica that led and stepped down keeps its watches, no
        longer pruned, until it is restarted."""
        if self._following:
            return
        self._following = True
        for name, backend in self.plane.backends.items():
            hook = getattr(backend, "on_change", None)
            if not callable(hook):
                continue
            try:
                hook(lambda n=name: self.wake(f"reconcile:{n}", gap=self.min_wake_gap))
            except Exception:
                log.warning("backend %s: its change feed cannot be followed; its reconciler "
                            "runs on its interval", name, exc_info=True)

    def wake(self, job_id: str, gap: float | None = None) -> None:
        """Run a control job now (after a submit, after new facts) instead of at its interval.
        Wake-ups closer than `min_wake_gap` are merged into one run at the end of the gap:
        under a burst of submissions the cycle runs often, not back to back (reconcilers:
        `RECONCILE_WAKE_GAP_S`; `gap` overrides both). A wake while the job runs makes it run
        again one gap (`_gap`) after that pass ends."""
        if not self.leading or job_id not in self._loop_ids:
            return
        with self._wake_lock:
            if job_id in self._running:
                self._rewake.add(job_id)
                return
            now = time.monotonic()
            last = self._woken.get(job_id)
            if last is not None and last > now:
                return  # a run is already scheduled after this moment: it sees this wake's cause
            if gap is None:
                gap = self._gap(job_id)
            at = now if last is None else max(now, last + gap)
            self._woken[job_id] = at
        self._schedule(job_id, at - now)

    def _gap(self, job_id: str) -> float:
        """The least time between two woken runs of a control job (reconcilers:
        `RECONCILE_WAKE_GAP_S`, the others `min_wake_gap`)."""
        if job_id.startswith("reconcile:"):
            return min(self.min_wake_gap, RECONCILE_WAKE_GAP_S)
        return self.min_wake_gap

    def wake_reconcilers(self) -> None:
        """Wake every backend's reconciler now and again after each of `FOLLOW_UP_S`."""
        names = [j for j in self._loop_ids if j.startswith("reconcile:")]

        def wake_all() -> None:
            for job_id in names:
                self.wake(job_id)

        wake_all()
        start = datetime.now()
        for delay in FOLLOW_UP_S:
            self._change_scheduler(
                partial(self.scheduler.add_job, wake_all, "date",
                        run_date=start + timedelta(seconds=delay)),
                "follow-up wake")

    def _schedule(self, job_id: str, delay: float) -> None:
        if not self.leading:
            return
        self._change_scheduler(
            lambda: self.scheduler.modify_job(
                job_id, next_run_time=datetime.now() + timedelta(seconds=delay)),
            f"wake of {job_id}")
