"""Job numbers: the numeric job ids HPC tools parse, and what a user may write for a job.

A number is drawn at submit, once per job, from PostgreSQL's sequence ``job_number_seq`` (shared
by every replica; a sequence never hands a value out twice, even from a rolled-back
transaction) or SQLite's one-row ``job_number_counter``, bumped in the caller's write
transaction (one writer at a time: the bump and the job commit or roll back together). Both stop
at MAX_NUMBER instead of wrapping: a number is never reused. Migration 0015 made them.

A job reference is the Isthmus id, the number, or ``ARRAY_TASK`` (an array's number and a
task's index, as squeue shows array tasks).
"""

from __future__ import annotations

import re

import sqlalchemy as sa
from sqlmodel import Session

from broker.domain.ids import is_job_id
from broker.store.records import JOBS

MAX_NUMBER = 4_294_967_293
"""Slurm's job ids are 32-bit; 0xfffffffe and 0xffffffff are its NO_VAL/INFINITE markers."""
MAX_BLOCK = 10_000
"""Numbers drawn at once at most (an array's tasks; ArrayMember.count's bound)."""
_REF = re.compile(r"^(\d{1,10})(?:_(\d{1,7}))?$")


class NumbersExhausted(Exception):
    pass


def allocate(session: Session, count: int = 1) -> list[int]:
    """`count` new numbers, ascending, inside the session's write transaction."""
    if not 1 <= count <= MAX_BLOCK:
        raise ValueError(f"count: 1 to {MAX_BLOCK}, not {count}")
    conn = session.connection()
    if conn.dialect.name == "postgresql":
        try:
            rows = conn.execute(sa.text(
                "SELECT nextval('job_number_seq') FROM generate_series(1, :n)"), {"n": count})
            return sorted(int(r[0]) for r in rows)
        except sa.exc.DBAPIError as exc:
            if "reached maximum value" in str(exc):
                raise NumbersExhausted(f"job numbers are used up (at most {MAX_NUMBER})") from exc
            raise
    end = int(conn.execute(sa.text(
        "UPDATE job_number_counter SET next = next + :n WHERE id = 1 RETURNING next"),
        {"n": count}).scalar_one())
    if end - 1 > MAX_NUMBER:
        raise NumbersExhausted(f"job numbers are used up (at most {MAX_NUMBER})")
    return list(range(end - count, end))


def parse_ref(ref: str) -> tuple[int, int | None] | None:
    """(number, task index or None) for ``N`` or ``N_T``; None for anything else."""
    m = _REF.match(ref.strip())
    if m is None or not 1 <= int(m.group(1)) <= MAX_NUMBER:
        return None
    return int(m.group(1)), None if m.group(2) is None else int(m.group(2))


def resolve(session: Session, ref: str) -> str | None:
    """The Isthmus id a reference stands for (an Isthmus id is returned as it is, unchecked);
    None when it is no reference or no job has it."""
    if is_job_id(ref):
        return ref
    parsed = parse_ref(ref)
    if parsed is None:
        return None
    number, index = parsed
    if index is None:
        where = JOBS.c.number == number
    else:
        where = sa.and_(JOBS.c.array_number == number, JOBS.c.array_index == index)
    found = session.connection().execute(
        sa.select(JOBS.c.id).where(where).order_by(JOBS.c.number).limit(1)).scalar()
    return None if found is None else str(found)
