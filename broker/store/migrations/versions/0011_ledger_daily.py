"""ledger_daily and explanations.queue_position

ledger_daily: the usage and waste entries of the ledger summed per UTC day, kind and group
(team; team and pool; team and flavor; team and user), kept by a trigger on every insert into
ledger_entries, so that usage reports over long windows read the sums of whole days instead
of every entry (broker/store/reports.py adds the raw entries of partial days at the edges).

(Revision 0013 drops the trigger: the application writes the sums at each commit.)
The trigger, not the application, keeps it: every writer of the ledger (the control loop,
a migration, a bulk load) updates it in the same transaction, and the ledger is append-only,
so inserts are the only change to follow. An entry without a pool or submitter (booked before
revision 0010) is summed under its attempt's pool and its job's submitter, looked up as the
report did ('' when there is none). Existing entries are summed once here.

explanations.queue_position: the admission position stored inside each job's verdicts (JSON),
as a column the database computes and stores when a verdict is written, so that the dashboard's
queue sorts 3,000 waiting jobs without parsing 3,000 verdicts. NULL unless the position is a
JSON number, whole, from 0 to 999,999,999 (a verdict without one is stored, and sorts last); on
PostgreSQL text that is not JSON at all is refused (verdicts are written by json.dumps).

Revision ID: 0011
Revises: 0010
"""

# The statements below are built from this module's constants only, never from any input.
# ruff: noqa: S608

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

COLUMNS = "dim, day, team, value, kind, gpu_hours, cost, unpriced_gpu_hours, entries"
KEY = "dim, day, team, value, kind"
ADD = ("gpu_hours = {t}.gpu_hours + excluded.gpu_hours, cost = {t}.cost + excluded.cost, "
       "unpriced_gpu_hours = {t}.unpriced_gpu_hours + excluded.unpriced_gpu_hours, "
       "entries = {t}.entries + excluded.entries")
HOURS = "kind NOT IN ('reserve', 'release')"
PG_DAY = "({row}.at AT TIME ZONE 'UTC')::date"
SQLITE_DAY = "substr({row}.at, 1, 10)"
"""SQLite stores a time as 'YYYY-MM-DD HH:MM:SS.ffffff' in UTC: its day is the first ten."""


def _groups(row: str) -> dict[str, str]:
    """Each dimension's value of ledger row `row` (NEW in the triggers)."""
    pool = (f"(SELECT a.pool FROM attempts a WHERE a.job_id = {row}.job_id "
            f"AND a.number = {row}.attempt)")
    user = f"(SELECT j.submitted_by FROM jobs j WHERE j.id = {row}.job_id)"
    return {"team": f"{row}.team", "pool": f"COALESCE({row}.pool, {pool}, '')",
            "flavor": f"{row}.flavor", "user": f"COALESCE({row}.submitted_by, {user}, '')"}


def _sums(row: str) -> tuple[str, str, str]:
    """GPU-hours, cost (0 when not priced) and unpriced GPU-hours of ledger row `row`."""
    return (f"{row}.gpu_hours", f"COALESCE({row}.cost, 0)",
            f"CASE WHEN {row}.cost IS NULL THEN {row}.gpu_hours ELSE 0 END")


def _values(day: str) -> str:
    """The four rows (one per dimension) that one new entry adds to."""
    return ", ".join(f"('{dim}', {day}, NEW.team, {value}, NEW.kind, {', '.join(_sums('NEW'))}, 1)"
                     for dim, value in _groups("NEW").items())


def _backfill(day: str) -> None:
    """Sum the entries booked before this revision, one statement per dimension."""
    hours, cost, unpriced = _sums("l")
    for dim, value in _groups("l").items():
        op.execute(
            f"INSERT INTO ledger_daily ({COLUMNS}) "
            f"SELECT '{dim}', e.day, e.team, e.value, e.kind, SUM(e.h), SUM(e.c), SUM(e.u), "
            f"COUNT(*) FROM (SELECT {day} AS day, l.team AS team, {value} AS value, "
            f"l.kind AS kind, {hours} AS h, {cost} AS c, {unpriced} AS u "
            f"FROM ledger_entries l WHERE l.{HOURS}) e GROUP BY e.day, e.team, e.value, e.kind"
        )


PG_POSITION = (
    "ALTER TABLE explanations ADD COLUMN queue_position integer GENERATED ALWAYS AS ("
    "CASE WHEN json_typeof(payload_json::json -> 'position') = 'number' "
    "AND (payload_json::json ->> 'position') ~ '^[0-9]{1,9}$' "
    "THEN (payload_json::json ->> 'position')::integer END) STORED"
)
SQLITE_POSITION = (
    "CASE WHEN json_valid(payload_json) THEN CASE WHEN json_type(payload_json, '$.position') "
    "= 'integer' AND json_extract(payload_json, '$.position') BETWEEN 0 AND 999999999 "
    "THEN json_extract(payload_json, '$.position') END END"
)


def _sqlite_position() -> None:
    """SQLite adds only virtual generated columns to a table (computed again on every read):
    the table is copied into one with a stored column instead."""
    op.create_table(
        "explanations_0011",
        sa.Column("job_id", sa.String(16), sa.ForeignKey("jobs.id"), primary_key=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("payload_json", sa.Text, nullable=False),
        sa.Column("queue_position", sa.Integer, sa.Computed(SQLITE_POSITION, persisted=True)),
    )
    op.execute("INSERT INTO explanations_0011 (job_id, at, payload_json) "
               "SELECT job_id, at, payload_json FROM explanations")
    op.drop_table("explanations")
    op.rename_table("explanations_0011", "explanations")


def upgrade() -> None:
    op.create_table(
        "ledger_daily",
        sa.Column("dim", sa.String(8), nullable=False),
        sa.Column("day", sa.Date, nullable=False),
        sa.Column("team", sa.String(63), nullable=False),
        sa.Column("value", sa.String(255), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("gpu_hours", sa.Float, nullable=False),
        sa.Column("cost", sa.Float, nullable=False),
        sa.Column("unpriced_gpu_hours", sa.Float, nullable=False),
        sa.Column("entries", sa.Integer, nullable=False),
        sa.PrimaryKeyConstraint("dim", "day", "team", "value", "kind", name="pk_ledger_daily"),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(PG_POSITION)
        _backfill(PG_DAY.format(row="l"))
    else:
        _sqlite_position()
        _backfill(SQLITE_DAY.format(row="l"))
    create_trigger(op.get_bind().dialect.name)


def create_trigger(dialect: str) -> None:
    """The trigger that adds each new usage or waste entry to its rows (revision 0013 drops
    it, and its downgrade makes it again with this function)."""
    if dialect == "postgresql":
        op.execute(
            "CREATE FUNCTION isthmus_ledger_daily() RETURNS trigger AS $$ BEGIN "
            f"INSERT INTO ledger_daily AS r ({COLUMNS}) VALUES "
            f"{_values(PG_DAY.format(row='NEW'))} "
            f"ON CONFLICT ({KEY}) DO UPDATE SET {ADD.format(t='r')}; "
            "RETURN NULL; END $$ LANGUAGE plpgsql"
        )
        op.execute(
            "CREATE TRIGGER ledger_daily_rollup AFTER INSERT ON ledger_entries FOR EACH ROW "
            f"WHEN (NEW.{HOURS}) EXECUTE FUNCTION isthmus_ledger_daily()"
        )
    else:
        op.execute(
            "CREATE TRIGGER ledger_daily_rollup AFTER INSERT ON ledger_entries "
            f"WHEN NEW.{HOURS} BEGIN "
            f"INSERT INTO ledger_daily ({COLUMNS}) VALUES {_values(SQLITE_DAY.format(row='NEW'))} "
            f"ON CONFLICT ({KEY}) DO UPDATE SET {ADD.format(t='ledger_daily')}; END"
        )


def downgrade() -> None:
    raise NotImplementedError("Isthmus migrations are forward-only; restore from a backup")
