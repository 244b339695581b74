"""A submission's dependencies, checked when it is submitted, as sbatch does ("Job dependency
problem"): each job a dependency names must be a job of the submitting team.

A reference is an Isthmus id, a job number or ``ARRAY_TASK``; the stored spec names Isthmus
ids only, so the holds of admission read one kind of reference. A job that does not exist and a
job of another team are refused with the same words: the answer is no oracle for another team's
ids, and nothing of that job (its state, its name) is shown.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlmodel import Session

from broker.domain.ids import is_job_id
from broker.domain.spec import JobSpec
from broker.store import job_numbers
from broker.store.in_lists import in_chunks
from broker.store.queries import jobs_by_ids
from broker.store.records import JOBS


class UnknownDependency(ValueError):
    def __init__(self, field: str, ref: str, team: str) -> None:
        super().__init__(f"job {ref} does not exist in team {team}")
        self.field = field


def _by_number(s: Session, numbers: list[int]) -> dict[int, str]:
    out: dict[int, str] = {}
    for chunk in in_chunks(numbers):
        for job_id, number in s.connection().execute(
                sa.select(JOBS.c.id, JOBS.c.number).where(JOBS.c.number.in_(chunk))):
            out[int(number)] = str(job_id)
    return out


def _ids(s: Session, refs: list[str]) -> dict[str, str | None]:
    """Each reference -> the Isthmus id it stands for (unchecked for an id), or None."""
    numbers = {r: p[0] for r in refs if not is_job_id(r)
               and (p := job_numbers.parse_ref(r)) is not None and p[1] is None}
    found = _by_number(s, sorted(set(numbers.values()))) if numbers else {}
    out: dict[str, str | None] = {}
    for ref in refs:
        if is_job_id(ref):
            out[ref] = ref
        elif ref in numbers:
            out[ref] = found.get(numbers[ref])
        else:  # ARRAY_TASK, or no reference at all
            out[ref] = job_numbers.resolve(s, ref)
    return out


def checked_dependencies(s: Session, spec: JobSpec) -> JobSpec:
    """``spec`` with every dependency naming Isthmus ids of its own team's jobs, or
    UnknownDependency for the first reference that names none."""
    sched = spec.scheduling
    if sched is None or not any(d.jobs for d in sched.dependencies):
        return spec
    refs = list(dict.fromkeys(r for d in sched.dependencies for r in d.jobs))
    ids = _ids(s, refs)
    jobs = jobs_by_ids(s, sorted({i for i in ids.values() if i is not None}))
    deps = []
    for i, dep in enumerate(sched.dependencies):
        resolved = []
        for k, ref in enumerate(dep.jobs):
            job_id = ids[ref]
            job = jobs.get(job_id) if job_id is not None else None
            if job is None or job.team != spec.team:
                raise UnknownDependency(f"scheduling.dependencies[{i}].jobs[{k}]", ref,
                                        spec.team)
            resolved.append(job.id)
        deps.append(dep.model_copy(update={"jobs": resolved}))
    if all(d.jobs == o.jobs for d, o in zip(deps, sched.dependencies, strict=True)):
        return spec
    return spec.model_copy(update={"scheduling": sched.model_copy(update={"dependencies": deps})})
