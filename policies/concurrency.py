"""Concurrency limits per team and per user: running jobs, GPUs held, queued jobs. Pure.

Admission asks `ConcurrencyState.blocked(job)` before it places a job: admitting it must keep
its team's and its user's running jobs (ADMITTED, PREPARING, RUNNING) and the GPUs they hold
within their limits, else the job waits QUEUED with ConcurrencyLimit and a message naming the
limit (as `isthmus.yaml` spells it). Each admission of the cycle is charged at once, so one
cycle never admits past a limit. Checks, in order: the team's running jobs, the team's GPUs,
the user's running jobs, the user's GPUs; the first one exceeded is named.

Queued jobs are checked at submit (`queued_problem`), where one more job is being added: the
API answers 429 naming the limit.

Counts come in from the caller (`Held` per team and per (team, user)); nothing here reads the
store or the clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from broker.domain.reasons import Reason
from policies.types import PendingJob


@dataclass(frozen=True, slots=True)
class Caps:
    """Limits at once; None: no limit."""

    running_jobs: int | None = None
    queued_jobs: int | None = None
    gpus: int | None = None

    @property
    def bounds_admission(self) -> bool:
        return self.running_jobs is not None or self.gpus is not None


@dataclass(frozen=True, slots=True)
class Held:
    """What a team or a user has now: jobs holding GPUs and the GPUs they hold."""

    jobs: int = 0
    gpus: int = 0


@dataclass(frozen=True, slots=True)
class ConcurrencyInputs:
    """Limits per team (`team_caps`, the whole team) and per user of a team (`user_caps`,
    or `default_user` for a team not listed), with the counts held now."""

    team_caps: Mapping[str, Caps] = field(default_factory=dict)
    user_caps: Mapping[str, Caps] = field(default_factory=dict)
    default_user: Caps = Caps()
    team_held: Mapping[str, Held] = field(default_factory=dict)
    user_held: Mapping[tuple[str, str], Held] = field(default_factory=dict)

    def user_cap(self, team: str) -> Caps:
        return self.user_caps.get(team, self.default_user)

    @property
    def any_admission_limit(self) -> bool:
        return self.default_user.bounds_admission or any(
            c.bounds_admission for c in (*self.team_caps.values(), *self.user_caps.values()))


def _over(caps: Caps, held: Held, job_gpus: int, who: str,
          field_of: str) -> tuple[Reason, str] | None:
    if caps.running_jobs is not None and held.jobs + 1 > caps.running_jobs:
        return Reason.ConcurrencyLimit, (
            f"{who} runs {held.jobs} jobs, {field_of}.running_jobs allows {caps.running_jobs}")
    if caps.gpus is not None and held.gpus + job_gpus > caps.gpus:
        return Reason.ConcurrencyLimit, (
            f"{who} holds {held.gpus} GPUs and this job needs {job_gpus}, {field_of}.gpus "
            f"allows {caps.gpus}")
    return None


class ConcurrencyState:
    """A cycle's working copy of the counts: `blocked` checks, `charge` counts an admission."""

    def __init__(self, inputs: ConcurrencyInputs) -> None:
        self.inputs = inputs
        self.team = dict(inputs.team_held)
        self.user = dict(inputs.user_held)

    def blocked(self, job: PendingJob) -> tuple[Reason, str] | None:
        """Why admitting `job` now would pass a limit, or None."""
        i = self.inputs
        team_caps = i.team_caps.get(job.team)
        if team_caps is not None:
            over = _over(team_caps, self.team.get(job.team, Held()), job.total_gpus,
                         f"team {job.team}", f"teams[{job.team}].limits")
            if over is not None:
                return over
        user_caps = i.user_cap(job.team)
        where = f"teams[{job.team}].user_limits" if job.team in i.user_caps else "user_limits"
        return _over(user_caps, self.user.get((job.team, job.user), Held()), job.total_gpus,
                     f"user {job.user} of team {job.team}", where)

    def charge(self, job: PendingJob) -> None:
        t = self.team.get(job.team, Held())
        self.team[job.team] = Held(t.jobs + 1, t.gpus + job.total_gpus)
        u = self.user.get((job.team, job.user), Held())
        self.user[(job.team, job.user)] = Held(u.jobs + 1, u.gpus + job.total_gpus)


def queued_problem(team_caps: Caps | None, user_caps: Caps, team: str, user: str,
                   team_queued: int, user_queued: int, adding: int = 1,
                   user_field: str = "user_limits") -> tuple[str, str] | None:
    """(the limit's field, a message) when adding `adding` queued jobs would pass the team's
    or the user's queued_jobs limit; None when it would not."""
    if team_caps is not None and team_caps.queued_jobs is not None \
            and team_queued + adding > team_caps.queued_jobs:
        f = f"teams[{team}].limits.queued_jobs"
        return f, (f"team {team} has {team_queued} jobs waiting and {f} allows "
                   f"{team_caps.queued_jobs}; submit again when some have started or ended")
    if user_caps.queued_jobs is not None and user_queued + adding > user_caps.queued_jobs:
        f = f"{user_field}.queued_jobs"
        return f, (f"user {user} of team {team} has {user_queued} jobs waiting and {f} "
                   f"allows {user_caps.queued_jobs}; submit again when some have started or "
                   "ended")
    return None
