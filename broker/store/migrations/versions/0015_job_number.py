"""Numeric job ids: jobs.number, and jobs.array_number/array_index for array tasks

HPC tools read a job id with a regular expression for digits, so every job also gets a number
(1 to 4,294,967,293: Slurm's 32-bit ids below its NO_VAL markers), unique across replicas and
never given twice. PostgreSQL draws it from the sequence ``job_number_seq`` (NO CYCLE);
SQLite from the one row of ``job_number_counter``, bumped inside the submit's write
transaction (SQLite has one writer, so the bump is serialised). An array task also carries the
array's number (its first task's, as Slurm's ArrayJobId) and its index, so ``ARRAY_TASK`` is
one index search.

Existing jobs are numbered in submit order (created_at, then id); an existing array's number
is the number of its lowest-index task. The sequence or counter then starts after them.

Downgrade drops the columns, the sequence and the counter.

Revision ID: 0015_job_number
Revises: 0014
"""

import json
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0015_job_number"
down_revision = "0014"
branch_labels = None
depends_on = None

MAX_NUMBER = 4_294_967_293


def _number_existing(bind: Any) -> int:
    """Number the jobs in submit order; the highest number given (0 for none)."""
    # Both dialects take UPDATE ... FROM (SQLite since 3.33).
    op.execute(
        "UPDATE jobs SET number = t.rn FROM (SELECT id, row_number() OVER "
        "(ORDER BY created_at, id) AS rn FROM jobs) AS t WHERE t.id = jobs.id"
    )
    return int(bind.execute(sa.text("SELECT coalesce(max(number), 0) FROM jobs")).scalar())


def _number_arrays(bind: Any) -> None:
    """array_number/array_index of the array tasks already stored (read from their specs)."""
    rows = bind.execute(sa.text(
        "SELECT id, number, spec_json FROM jobs WHERE spec_json LIKE '%\"array\"%'"))
    tasks: dict[str, list[tuple[int, int, str]]] = {}
    for job_id, number, spec_json in rows:
        array = (json.loads(spec_json).get("scheduling") or {}).get("array")
        if isinstance(array, dict) and array.get("id") is not None:
            tasks.setdefault(str(array["id"]), []).append((int(array["index"]), number, job_id))
    params = []
    for members in tasks.values():
        first = min(members)[1]
        params += [{"a": first, "i": index, "id": job_id} for index, _n, job_id in members]
    if params:
        bind.execute(sa.text(
            "UPDATE jobs SET array_number = :a, array_index = :i WHERE id = :id"), params)


def upgrade() -> None:
    bind = op.get_bind()
    op.add_column("jobs", sa.Column("number", sa.BigInteger(), nullable=True))
    op.add_column("jobs", sa.Column("array_number", sa.BigInteger(), nullable=True))
    op.add_column("jobs", sa.Column("array_index", sa.Integer(), nullable=True))
    last = _number_existing(bind)
    _number_arrays(bind)
    op.create_index("uq_jobs_number", "jobs", ["number"], unique=True)
    op.create_index("ix_jobs_array", "jobs", ["array_number", "array_index"])
    if bind.dialect.name == "postgresql":
        op.execute(f"CREATE SEQUENCE job_number_seq AS bigint MINVALUE 1 MAXVALUE {MAX_NUMBER} "
                   f"START WITH {last + 1} NO CYCLE")
    else:
        op.create_table(
            "job_number_counter",
            sa.Column("id", sa.Integer(), primary_key=True),
            sa.Column("next", sa.BigInteger(), nullable=False),
            sa.CheckConstraint("id = 1", name="ck_job_number_counter_one_row"),
        )
        bind.execute(sa.text("INSERT INTO job_number_counter (id, next) VALUES (1, :next)"),
                     {"next": last + 1})


def downgrade() -> None:
    """Forgets the numbers (a later upgrade numbers the jobs again, in submit order)."""
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP SEQUENCE job_number_seq")
    else:
        op.drop_table("job_number_counter")
    op.drop_index("ix_jobs_array", "jobs")
    op.drop_index("uq_jobs_number", "jobs")
    for column in ("array_index", "array_number", "number"):
        op.drop_column("jobs", column)
