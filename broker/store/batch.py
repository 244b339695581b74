"""Deferred writes: the statements of many jobs' transitions sent as one executemany each.

Inside `deferred(session)`, the write helpers of the hot paths (records.insert_event and
save_state, the ledger's entries and usage counters, attempts.insert_attempt,
save_explanation) queue their statement and parameters instead of executing them; the block's
end (or `flush`) executes each distinct statement once with all its parameter sets (once
per set of parameter names), in the order the statements were first queued (those only
SQLAlchemy can send, with a default computed in Python say, after the others). Everything else
(reads, other writes) runs at once. On PostgreSQL an insert, an update by key or a declared
upsert is one statement for all its rows (`_as_json`), an update's or upsert's key given twice
sent once with its last row where that leaves the row as the executemany did (an earlier
write of that key that the database would refuse is then not sent, and fails nothing).

What makes this safe for the batched admission (broker.control.admission):
- the queued statements are inserts, updates by primary key and additive upserts of different
  jobs: none reads what another queued, so grouping them by statement changes no outcome;
- a job's own reads in the block (its locked row, its earlier checkpoints) see the database
  as it was before the block, and no other job of the batch writes those rows; the ledger's
  "already reserved?" look-up is left to its unique key inside a batch (broker.ledger.reserve);
- a job whose step fails is cut out of the batch (`mark` / `cut`): its queued writes are
  dropped, as its savepoint would have been rolled back;
- a flush that fails raises: the caller rolls the whole batch back (its savepoint) and does
  the jobs again one by one, so a bad row costs speed, never another job's write;
- effects outside the database that go with a write (the transition metrics, `after`) are
  queued with it and run only once the batch is written (or, with `effects=False`, when the
  caller says so, after its commit): a batch done again job by job counts each once.

`held_effects(session)` holds only the effects, the writes running at once: for a
transaction of many savepoints (the reconcile chunk), whose caller drops the effects of a
savepoint it rolls back (`mark` / `cut`) and runs the rest once it committed.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import psycopg
import pydantic_core
import sqlalchemy as sa
from sqlalchemy.sql import operators
from sqlalchemy.sql.elements import BindParameter, Null
from sqlalchemy.types import TypeDecorator
from sqlmodel import Session

_KEY = "isthmus_deferred"
_EFFECTS_KEY = "isthmus_held_effects"


class Deferred:
    """Statements queued in order, with their parameter sets, and the effects that go with
    them."""

    def __init__(self) -> None:
        self.queued: list[tuple[Any, dict[str, Any]]] = []
        self.effects: list[Callable[[], None]] = []

    def mark(self) -> tuple[int, int]:
        return len(self.queued), len(self.effects)

    def cut(self, mark: tuple[int, int]) -> None:
        """Drop everything queued since `mark` (a failed job's writes and effects)."""
        del self.queued[mark[0]:]
        del self.effects[mark[1]:]

    def run_effects(self) -> None:
        """Run the queued effects (once: they are dropped as they run)."""
        effects, self.effects = self.effects, []
        for effect in effects:
            effect()

    def flush(self, session: Session) -> None:
        """Send the queued statements: one executemany per statement and set of parameter
        names (an executemany takes one set of columns: an insert queued with other columns,
        e.g. a ledger release beside a charge, gets its own), on PostgreSQL in one pipeline
        (`_pipelined`), an additive statement's parameter sets together (`additive`)."""
        groups: dict[Hashable, tuple[Any, list[dict[str, Any]]]] = {}
        for stmt, params in self.queued:
            key = id(stmt) if id(stmt) in _ADDITIVE else (id(stmt), tuple(params))
            group = groups.get(key)
            if group is None:
                groups[key] = (stmt, [params])
            else:
                group[1].append(params)
        self.queued.clear()
        conn = session.connection()
        shared = [(stmt, _merged(_ADDITIVE[id(stmt)][1], many)) for stmt, many in
                  groups.values() if id(stmt) in _ADDITIVE]
        plain = [(stmt, many) for stmt, many in groups.values() if id(stmt) not in _ADDITIVE]
        others: list[tuple[Any, list[dict[str, Any]]]] = []
        if plain:
            with _pipelined(conn):
                for stmt, many in plain:
                    if not _executemany_plain(conn, stmt, many):
                        others.append((stmt, many))
        # SQLAlchemy's own path, outside the pipeline: it reads results (a one-row insert's
        # RETURNING of its key) that a pipeline has not received yet
        for stmt, many in others:
            conn.execute(stmt, many)
        for stmt, many in shared:  # last, one row per key, in key order (see `additive`)
            apply = _ADDITIVE[id(stmt)][2]
            if apply is None:
                conn.execute(stmt, many)
            else:
                apply(session, many)


_Apply = Callable[[Session, list[dict[str, Any]]], None]
_ADDITIVE: dict[int, tuple[Any, tuple[str, ...], _Apply | None]] = {}


def additive(stmt: Any, key: tuple[str, ...], apply: _Apply | None = None) -> None:
    """Declare `stmt` an additive write to rows shared by many jobs (a counter per team and
    flavor): parameters other than `key` are amounts to add. In a batch its parameter sets
    are summed per key and sent after every other statement, one per key in key order, so a
    batch holds the shared rows' locks only at its end and takes them in the order every
    batch does (on PostgreSQL two batches, or a batch and a single write, took them in job
    order and deadlocked under the soak). `apply`: what to do with the summed parameter sets
    instead of executing them (the quota counters wait for the transaction's commit)."""
    _ADDITIVE[id(stmt)] = (stmt, key, apply)


def _merged(key: tuple[str, ...], many: list[dict[str, Any]]) -> list[dict[str, Any]]:
    sums: dict[tuple[Any, ...], dict[str, Any]] = {}
    for params in many:
        k = tuple(params[name] for name in key)
        total = sums.get(k)
        if total is None:
            sums[k] = dict(params)
        else:
            for name, value in params.items():
                if name not in key:
                    total[name] += value
    return [sums[k] for k in sorted(sums)]


_NO_PLAN = ("", ())
# keyed by the statement's id, the statement kept with its entry: an id reused by another
# statement (the first one collected) is not mistaken for it
_PLANS: dict[tuple[int, str, tuple[str, ...]],
             tuple[Any, tuple[str, tuple[tuple[str, Any], ...]]]] = {}


def _plan(stmt: Any, keys: tuple[str, ...], dialect: Any) -> tuple[str, tuple[Any, ...]]:
    """The SQL text of `stmt` for parameter sets with exactly `keys`, as an executemany sends
    it, and for each of its parameters (in their positional order on SQLite) its key and the
    type's bind processor (None: sent as it is); the empty plan when the statement needs more
    than that (a default computed in Python, a parameter expanded at execution)."""
    compiled = stmt.compile(dialect=dialect, column_keys=list(keys), for_executemany=True)
    names = compiled.positiontup if dialect.paramstyle == "qmark" else tuple(compiled.binds)
    if (names is None or not set(names) <= set(keys) or compiled.literal_execute_params
            or compiled.post_compile_params):
        return _NO_PLAN
    binds = tuple(
        (name, compiled.binds[name].type.dialect_impl(dialect).bind_processor(dialect))
        for name in names
    )
    return compiled.string, binds


_PLAIN_STYLES = {("sqlite", "qmark"), ("postgresql", "pyformat")}


@contextlib.contextmanager
def _pipelined(conn: Any) -> Iterator[None]:
    """On PostgreSQL, the block's statements sent in one pipeline (psycopg's pipeline mode):
    each executemany is one already, but each waited for the server's answer to the one
    before; here they all go out and the answers are read once, at the block's end, where the
    first error is raised (the flush fails whole, as before). Elsewhere, nothing."""
    if conn.dialect.name != "postgresql":
        yield
        return
    driver = conn.connection.driver_connection
    try:
        with driver.pipeline():
            yield
    except psycopg.Error as exc:
        # an answer read as the pipeline ends, outside any statement SQLAlchemy ran: wrapped
        # as it wraps a statement's error (sa.exc.OperationalError for a lost connection,
        # IntegrityError, ...; `.orig` the driver's, for broker.store.conflicts)
        raise sa.exc.DBAPIError.instance(None, None, exc, psycopg.Error,
                                         dialect=conn.dialect) from exc


def _converted(conn: Any, stmt: Any, many: list[dict[str, Any]]
               ) -> tuple[str, tuple[str, ...], list[tuple[Any, ...]]] | None:
    """The plain path's SQL text for `stmt`, its parameters' names in order, and each row of
    `many` as their values converted by their columns' bind processors; None when the plain
    path does not apply."""
    dialect = conn.dialect
    if (dialect.name, dialect.paramstyle) not in _PLAIN_STYLES:
        return None
    keys = tuple(many[0])
    key = (id(stmt), dialect.name, keys)
    kept = _PLANS.get(key)
    if kept is None or kept[0] is not stmt:
        kept = _PLANS[key] = (stmt, _plan(stmt, keys, dialect))
    sql, binds = kept[1]
    if not sql or any(len(params) != len(keys) for params in many):
        return None
    try:
        rows = [tuple([params[name] if proc is None else proc(params[name])
                       for name, proc in binds]) for params in many]
    except KeyError:  # parameter sets with other keys: SQLAlchemy's path
        return None
    return sql, tuple(name for name, _ in binds), rows


def _executemany_plain(conn: Any, stmt: Any, many: list[dict[str, Any]]) -> bool:
    """Send `stmt` with `many` as the driver's executemany, each parameter converted by its
    column's own bind processor: what SQLAlchemy sends, without its per-row, per-column
    bookkeeping (most of the flush's time for wide rows such as the attempts'). Tuples on
    SQLite (qmark), dictionaries on PostgreSQL (pyformat), there a plain insert's or a keyed
    update's rows as one JSON array (`_json_insert_text`, `_json_update`). False (nothing
    sent) when the plain path does not apply; the caller then executes through SQLAlchemy as
    before."""
    plain = _converted(conn, stmt, many)
    if plain is None:
        return False
    sql, names, rows = plain
    if conn.dialect.paramstyle == "qmark":
        conn.exec_driver_sql(sql, rows)
        return True
    as_json = _as_json(stmt, names, rows, conn.dialect)
    if as_json is not None:
        conn.exec_driver_sql(as_json[0], [{"rows": as_json[1]}])
    else:
        conn.exec_driver_sql(sql, [dict(zip(names, row, strict=True)) for row in rows])
    return True


def insert_returning(conn: Any, stmt: Any, many: list[dict[str, Any]]) -> Any | None:
    """On PostgreSQL, `stmt` (an insert ... RETURNING) with `many` as one statement taking
    its rows as one JSON array (`_json_insert_text`), the same text for any number of rows: its
    result. None elsewhere, or where that does not apply: the caller executes `stmt` through
    SQLAlchemy (whose insertmanyvalues renders a VALUES list as long as the batch, which the
    driver parses anew for every length)."""
    if conn.dialect.name != "postgresql":
        return None
    plain = _converted(conn, stmt, many)
    if plain is None:
        return None
    _, names, rows = plain
    as_json = _as_json(stmt, names, rows, conn.dialect)
    return None if as_json is None else conn.exec_driver_sql(as_json[0], {"rows": as_json[1]})


def _as_json(stmt: Any, names: tuple[str, ...], rows: list[tuple[Any, ...]],
             dialect: Any) -> tuple[str, str] | None:
    """`stmt`'s one-statement text for parameters `names` (`_json_insert_text`, `_json_update`)
    and `rows` as its JSON parameter (`_json_rows`), or None where either does not apply."""
    plan = _json_plan(stmt, names, dialect)
    if plan is None:
        return None
    sql, keys, last_wins = plan
    if keys:
        rows = _one_per_key(rows, keys, last_wins)
    doc = _json_rows(rows) if rows else None
    return None if doc is None else (sql, doc)


def _one_per_key(rows: list[tuple[Any, ...]], keys: tuple[int, ...], last_wins: bool
                 ) -> list[tuple[Any, ...]]:
    """An update's rows, one per key (the values at `keys`), in key order. A key given twice:
    its last row, as an executemany would leave the row when the update sets plain values
    and matches on its keys alone (`last_wins`); else no rows (an executemany sends them:
    a row that matched only until the first of them wrote it, say)."""
    one: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    for row in rows:
        one[tuple(row[i] for i in keys)] = row
    if len(one) < len(rows) and not last_wins:
        return []
    try:
        return [one[k] for k in sorted(one)]  # in key order (the callers hold their jobs' locks)
    except TypeError:  # keys that do not compare (a None): in the order given
        return list(one.values())


_JsonPlan = tuple[str, tuple[int, ...], bool]
"""A statement's one-statement text, the positions of an update's keys among its parameters
(none for an insert) and whether a key given twice leaves the last row's values."""
_JSON_PLANS: dict[tuple[int, tuple[str, ...]], tuple[Any, _JsonPlan | None]] = {}


def _json_plan(stmt: Any, names: tuple[str, ...], dialect: Any) -> _JsonPlan | None:
    key = (id(stmt), names)
    kept = _JSON_PLANS.get(key)
    if kept is not None and kept[0] is stmt:
        return kept[1]
    plan: _JsonPlan | None = None
    if isinstance(stmt, sa.Insert):
        sql = _json_insert_text(stmt, names, dialect)
        plan = None if sql is None else (sql, (), False)
    elif isinstance(stmt, sa.Update):
        plan = _json_update(stmt, names, dialect)
    elif (upsert := _UPSERTS.get(id(stmt))) is not None and upsert[0] is stmt:
        plan = _json_upsert(upsert, names, dialect)
    _JSON_PLANS[key] = (stmt, plan)
    return plan


_Upsert = tuple[Any, sa.Table, dict[str, str], str, tuple[str, ...], bool]
_UPSERTS: dict[int, _Upsert] = {}
_UPSERT_TEXT = re.compile(
    r"INSERT INTO (\w+) \(([\w, ]+)\) VALUES \(([:\w, ]+)\) (ON CONFLICT .+)", re.S)


def upsert_rows(stmt: Any, table: sa.Table, keys: tuple[str, ...], last_wins: bool) -> None:
    """Declare that a text upsert of `table` (`INSERT INTO t (columns) VALUES (:params) ON
    CONFLICT ...`, written out for both databases) may take its rows as one JSON array on
    PostgreSQL, as the plain inserts do (`_json_insert_text`), its ON CONFLICT clause as it
    is. `keys`: the parameters of its conflict key; a key given twice in one batch is sent
    once, with its last row when `last_wins` (the clause sets the new values: the row ends as
    the executemany left it), else the batch goes by executemany (one statement may not
    update a row twice)."""
    m = _UPSERT_TEXT.fullmatch(" ".join(stmt.text.split()))
    if m is None or m.group(1) != table.name:
        raise ValueError(f"not an upsert of {table.name}: {stmt.text}")
    columns = [c.strip() for c in m.group(2).split(",")]
    given = [p.strip() for p in m.group(3).split(",")]
    params = [p.removeprefix(":") for p in given]
    if (len(columns) != len(params) or len(set(params)) != len(params)
            or not all(p.startswith(":") for p in given) or not set(keys) <= set(params)
            or not all(c in table.c for c in columns)):
        raise ValueError(f"columns and parameters do not pair up: {stmt.text}")
    if "%" in m.group(4) or "'" in m.group(4):
        raise ValueError(f"a clause with literals is sent as written only by SQLAlchemy: "
                         f"{stmt.text}")
    if last_wins and "DO UPDATE" not in m.group(4):
        raise ValueError(f"only an upsert that sets the new values keeps the last row of a "
                         f"key: {stmt.text}")
    _UPSERTS[id(stmt)] = (stmt, table, dict(zip(params, columns, strict=True)), m.group(4),
                          keys, last_wins)


def _json_upsert(upsert: _Upsert, names: tuple[str, ...], dialect: Any) -> _JsonPlan | None:
    _, table, column_of, clause, keys, last_wins = upsert
    if set(names) != set(column_of):
        return None
    # the clause as declared (upsert_rows refuses one with literals)
    sql = _insert_select(table, [table.c[column_of[n]] for n in names], dialect, f" {clause}")
    return None if sql is None else (sql, tuple(names.index(k) for k in keys), last_wins)


def _json_update(stmt: Any, names: tuple[str, ...], dialect: Any) -> _JsonPlan | None:
    """On PostgreSQL, an update by key that sets each column to a parameter (`WHERE key =
    :k AND ... [AND column IS NULL ...]`, `SET column = :v, ...`) as one statement for all its
    rows, taken as one JSON array as the inserts take theirs (`_json_insert_text`): `UPDATE ...
    FROM` the array, each value cast as an insert casts it. The same text for any number of
    rows; PostgreSQL runs one statement instead of one per row (a job's transitions and its
    attempt's phases were most of the loop's statements). None where it does not apply."""
    if (stmt._returning or stmt._ordered_values or not stmt._values
            or not isinstance(stmt.table, sa.Table)
            or any(c.onupdate is not None for c in stmt.table.c)):
        return None  # a value of SQLAlchemy's own (`onupdate`) is not in the rows
    table, quote = stmt.table, dialect.identifier_preparer.quote
    at = {name: i for i, name in enumerate(names)}

    def cell(col: Any, param: Any) -> str | None:
        kind = _stored_type(col.type, dialect)
        if not isinstance(param, BindParameter) or param.key not in at or isinstance(
                kind, sa.LargeBinary):
            return None
        return _cell(f"given.r->>{at[param.key]}", col, kind, dialect)

    sets, set_names = [], set()
    for target, param in stmt._values.items():
        name = target if isinstance(target, str) else str(getattr(target, "key", ""))
        value = cell(table.c[name], param) if name in table.c else None
        if value is None:
            return None
        sets.append(f"{quote(table.c[name].name)} = {value}")
        set_names.add(table.c[name].key)
    where, keys, keys_only = [], [], True
    for crit in stmt._where_criteria:
        col, op, right = (getattr(crit, n, None) for n in ("left", "operator", "right"))
        if not isinstance(col, sa.Column) or col.table is not table:
            return None
        column = f"{quote(table.name)}.{quote(col.name)}"
        kind = _stored_type(col.type, dialect)
        if (op is operators.eq and isinstance(right, BindParameter) and right.key in at
                and col.key not in set_names and not isinstance(kind, sa.LargeBinary)):
            # a column both matched and set is not a key (its second write would not match)
            where.append(f"{column} = "
                         + _cell(f"given.r->>{at[right.key]}", col, kind, dialect, key=True))
            keys.append(at[right.key])
        elif op is operators.is_ and isinstance(right, Null):
            where.append(f"{column} IS NULL")
            keys_only = False
        else:
            return None
    if not keys:
        return None
    # identifiers from the table's metadata, quoted; every value is in the one parameter
    sql = (f"UPDATE {quote(table.name)} SET {', '.join(sets)} "  # noqa: S608
           "FROM jsonb_array_elements(CAST(%(rows)s AS JSONB)) AS given(r) "
           f"WHERE {' AND '.join(where)}")
    return sql, tuple(keys), keys_only


def _json_insert_text(stmt: Any, names: tuple[str, ...], dialect: Any) -> str | None:
    """On PostgreSQL, a plain insert of columns `names` (no ON CONFLICT, no values of its
    own; its RETURNING kept) as one statement taking all its rows as one JSON array: `INSERT ...
    SELECT` of each row's values, cast to their columns' types, in the order given (WITH
    ORDINALITY: serial keys rise as an executemany gives them). One parameter and one
    text for any number of rows: the driver encodes nothing per row (an executemany's
    binding of each row was most of a flush's client CPU). None where it does not apply.
    Text goes uncast into its column, whose length is checked on assignment as for any
    insert (an explicit cast to VARCHAR(n) would cut a longer value instead). The array is
    JSONB, parsed once: as JSON, every `->>` parsed its row's text again from the row's start,
    so a row cost its width times its columns (an attempt's, with its spec snapshot, the
    most)."""
    if not (isinstance(stmt, sa.Insert) and stmt._post_values_clause is None and not stmt._values
            and not stmt._multi_values and all(n in stmt.table.c for n in names)):
        return None
    quote = dialect.identifier_preparer.quote
    returned = [c for c in stmt._returning if isinstance(c, sa.Column)]
    if len(returned) != len(stmt._returning):
        return None  # RETURNING an expression: SQLAlchemy's path
    returning = " RETURNING " + ", ".join(quote(c.name) for c in returned) if returned else ""
    return _insert_select(stmt.table, [stmt.table.c[n] for n in names], dialect, returning)


def _insert_select(table: Any, cols: list[Any], dialect: Any, tail: str) -> str | None:
    """`INSERT INTO table (cols) SELECT` each row's values (`_cell`) from the one JSONB
    parameter, in the order given, then `tail` (a RETURNING, an ON CONFLICT clause); None
    when a column stores bytes (no JSON form: an executemany sends them)."""
    kinds = [_stored_type(c.type, dialect) for c in cols]
    if any(isinstance(k, sa.LargeBinary) for k in kinds):
        return None
    values = [_cell(f"given.r->>{i}", col, kind, dialect)
              for i, (col, kind) in enumerate(zip(cols, kinds, strict=True))]
    quote = dialect.identifier_preparer.quote
    # identifiers from the table's metadata, quoted; every value is in the one parameter
    return (f"INSERT INTO {quote(table.name)} "  # noqa: S608
            f"({', '.join(quote(c.name) for c in cols)}) SELECT {', '.join(values)} "
            "FROM jsonb_array_elements(CAST(%(rows)s AS JSONB)) WITH ORDINALITY AS given(r, n) "
            f"ORDER BY given.n{tail}")


def _stored_type(kind: Any, dialect: Any) -> Any:
    """The type a column stores, through its decorators (SQLModel's AutoString is a
    TypeDecorator over String; UTCDateTime one over DateTime)."""
    kind = kind.dialect_impl(dialect)
    while isinstance(kind, TypeDecorator):
        kind = kind.load_dialect_impl(dialect)
    return kind


def _cell(text: str, col: Any, kind: Any, dialect: Any, *, key: bool = False) -> str:
    """A row's value for `col` as the insert takes it: a string uncast (its column checks its
    length on assignment and refuses a longer value, where an explicit cast to VARCHAR(n)
    would cut it); an integer through NUMERIC (a float such as 2.0 is rounded, as an
    executemany's assignment did, not refused); anything else cast to the column's type. A
    `key` an update compares is cast as it is, never rounded (1.5 must not match row 2)."""
    if isinstance(kind, sa.String) and not isinstance(kind, sa.Enum):
        return text
    if isinstance(kind, sa.Integer) and not key:
        return f"CAST(CAST({text} AS NUMERIC) AS {kind.compile(dialect=dialect)})"
    return f"CAST({text} AS {kind.compile(dialect=dialect)})"


def _json_rows(rows: list[tuple[Any, ...]]) -> str | None:
    """`rows` as a JSON array of arrays (pydantic-core's encoder: times and days as ISO 8601
    text, which the casts read back; NaN and infinities as the strings PostgreSQL reads as
    those floats); None when a value has no JSON form: the caller sends an executemany."""
    try:
        return pydantic_core.to_json(rows, inf_nan_mode="strings").decode()
    except pydantic_core.PydanticSerializationError:
        return None


def execute_many(conn: Any, stmt: Any, many: list[dict[str, Any]]) -> None:
    """`conn.execute(stmt, many)` for a write whose result nobody reads, sent by the plain
    path where it applies (`_executemany_plain`): the writes a commit makes (the quota
    counters, the ledger's daily sums) are one such executemany each."""
    if not _executemany_plain(conn, stmt, many):
        conn.execute(stmt, many)


def active(session: Session) -> bool:
    """Whether writes of `session` are being deferred."""
    return _KEY in session.info


def pending(session: Session) -> Deferred | None:
    """The batch `session` queues into (`deferred`, else `held_effects`), if any: a caller
    that rolls back a savepoint of its own cuts what the savepoint queued (`mark` / `cut`)."""
    held: Deferred | None = session.info.get(_KEY) or session.info.get(_EFFECTS_KEY)
    return held


def write(session: Session, stmt: Any, params: dict[str, Any]) -> None:
    """Execute `stmt` now, or queue it inside `deferred` (a statement built once: its identity
    and the parameters' names group the batch). Only for writes whose result (rowcount, keys)
    nobody reads."""
    batch: Deferred | None = session.info.get(_KEY)
    if batch is None:
        session.connection().execute(stmt, params)
    else:
        batch.queued.append((stmt, params))


def after(session: Session, effect: Callable[[], None]) -> None:
    """Run `effect` (no database work: a metric) now, or inside `deferred` once the batch's
    writes are flushed, so that a batch that fails and is done again counts it once (inside
    `held_effects`, when its caller says so)."""
    batch: Deferred | None = session.info.get(_KEY) or session.info.get(_EFFECTS_KEY)
    if batch is None:
        effect()
    else:
        batch.effects.append(effect)


@contextlib.contextmanager
def deferred(session: Session, *, effects: bool = True) -> Iterator[Deferred]:
    """Queue the hot-path writes of the block; flushed at its end unless it raised, and then
    the queued effects run (`effects=False`: the caller runs them, `run_effects`, once its
    transaction committed)."""
    if session.info.get(_KEY) is not None:
        raise RuntimeError("deferred writes do not nest")
    batch = session.info[_KEY] = Deferred()
    try:
        yield batch
        del session.info[_KEY]
        batch.flush(session)
    finally:
        session.info.pop(_KEY, None)
    if effects:
        batch.run_effects()


@contextlib.contextmanager
def held_effects(session: Session) -> Iterator[Deferred]:
    """Hold the effects (`after`) of the block, its writes running at once; the caller cuts
    those of a rolled-back savepoint and runs the rest (`run_effects`) once it committed.
    Effects not run are dropped: a transaction that fails counts nothing."""
    if session.info.get(_KEY) is not None or session.info.get(_EFFECTS_KEY) is not None:
        raise RuntimeError("held effects do not nest")
    held = session.info[_EFFECTS_KEY] = Deferred()
    try:
        yield held
    finally:
        session.info.pop(_EFFECTS_KEY, None)
