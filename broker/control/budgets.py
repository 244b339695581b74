"""GPU-hour budgets in the control loop: read by the admission cycle, thresholds told once.

`budget_inputs` reads the GPU-hours used in every configured budget's current period from the
ledger's daily sums (one summing statement per period start, at most every USE_EVERY_S;
nothing when no budget is set), the period bounds by the database's clock
(`ControlPlane.period_clock`), so replicas and restarts agree on when a period renews.
`tell_thresholds` writes a `budget_threshold` notice and a warning log line the first time a
budget reaches one of its `warn_at` fractions (or 1.0) in a period: the notice key names the
budget, period start and fraction, and the notices table is asked before writing, so a restart
or a hand-over tells nobody twice.
"""

from __future__ import annotations

import hashlib
from datetime import datetime

from sqlmodel import Session

from broker.control.plane import ControlPlane
from broker.control.soft_state import fresh
from broker.logs import get_logger
from broker.policy_inputs import budget_periods, budget_windows, budgets
from broker.store import budget_usage
from broker.store import notices as notice_store
from policies.budgets import Budget, BudgetInputs, crossed

log = get_logger(__name__)


USE_EVERY_S = 10.0
"""The budgets' use is read again at most this often (while the periods stay the same): a
month of a thousand users' daily sums took 50 ms on SQLite, too much for every cycle, and
hours booked 10 s late change no decision that matters."""


def budget_inputs(plane: ControlPlane, s: Session) -> BudgetInputs | None:
    """Every budget in its current period with its use; None when no budget is configured."""
    if not budget_periods(plane.config):
        return None
    now = plane.period_clock(s.connection())
    windows = budget_windows(plane.config, now)
    key = tuple(sorted((d, tuple(sorted(a)), tuple(sorted(b))) for d, (a, b) in windows.items()))
    cached = plane.soft.budget_used
    if cached is not None and cached[1] == key and fresh(cached[0], now, USE_EVERY_S):
        used = cached[2]
    else:
        used = budget_usage.used_in(s, windows)
        plane.soft.budget_used = (now, key, used)
    return budgets(plane.config, used, now)


def threshold_key(b: Budget, fraction: float) -> str:
    """The notice key of `b` reaching `fraction` in its current period (at most 128
    characters whatever the team and user names: those are hashed)."""
    who = hashlib.sha256(f"{b.team}\0{b.user or ''}".encode()).hexdigest()[:24]
    return f"budget:{b.period}:{b.start:%Y%m%d}:{fraction:g}:{who}"


def tell_thresholds(plane: ControlPlane, inputs: BudgetInputs | None) -> int:
    """Tell each threshold reached for the first time in its period; the number told."""
    if inputs is None:
        plane.soft.budget_told = frozenset()
        return 0
    reached = {threshold_key(b, f): (b, f) for bs in inputs.by_team.values() for b in bs
               for f in crossed(b)}
    new = [k for k in reached if k not in plane.soft.budget_told]
    told = 0
    if new:
        now = plane.clock()
        with plane.db.write() as s:
            for key in sorted(set(new) - notice_store.existing_keys(s, new)):
                b, fraction = reached[key]
                _tell(s, key, b, fraction, now)
                told += 1
    plane.soft.budget_told = frozenset(reached)  # keys of past periods drop out
    return told


def _tell(s: Session, key: str, b: Budget, fraction: float, now: datetime) -> None:
    spent = fraction >= 1.0
    message = (f"{b.who} used {b.used:.1f} of its {b.gpu_hours:g} GPU-hour {b.period} budget "
               f"({b.fraction:.0%}, {b.field}); "
               + (f"enforced ({b.enforce}) until {b.renews:%Y-%m-%dT%H:%MZ}" if spent
                  else f"warning at {fraction:.0%}; it renews at {b.renews:%Y-%m-%dT%H:%MZ}"))
    notice_store.add(s, key=key, kind="budget_threshold", team=b.team, at=now,
                     details={"message": message, "user": b.user, "period": b.period,
                              "gpu_hours": b.gpu_hours, "used_gpu_hours": round(b.used, 6),
                              "threshold": fraction, "enforce": b.enforce,
                              "period_start": b.start.isoformat(),
                              "renews_at": b.renews.isoformat(), "budget": b.field})
    log.warning("budget threshold %s reached: %s", f"{fraction:g}", message)
