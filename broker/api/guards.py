"""Checks every request passes at the door, before any handler or database sees its input."""

from __future__ import annotations

from typing import Annotated

from fastapi import Header, Request

from broker.api.problems import Problem
from broker.domain.text import control_character

# Attempt numbers and progress steps are INTEGER columns: 2^31 - 1 on PostgreSQL.
DB_INT_MAX = 2**31 - 1
IDEMPOTENCY_KEY_MAX = 255


async def plain_query(request: Request) -> None:
    """No control characters in any query parameter: PostgreSQL refuses NUL in a comparison
    as it does in a row, and no name or cursor of this API contains one.

    Async on purpose: a sync dependency would cost a worker-thread hop per request."""
    for name, value in request.query_params.multi_items():
        bad = control_character(name) or control_character(value)
        if bad is not None:
            raise Problem(
                422, "invalid-request", "Invalid request",
                f"{name}: control character {bad} is not allowed",
                [{"field": name, "message": f"control character {bad} is not allowed"}],
            )


async def idempotency_key(
    idempotency_key: Annotated[
        str | None,
        Header(
            description="the same key and body return the same job; 1-255 printable "
            "characters",
        ),
    ] = None,
) -> str | None:
    """The Idempotency-Key header, or None when it is absent. An empty or blank key is a
    client mistake (an unset variable in a script), never a key shared by every such request.
    Async like the other dependencies of submit: a sync one would cost a worker-thread hop."""
    if idempotency_key is None:
        return None
    key = idempotency_key.strip()
    problem = None
    if not key:
        problem = "must not be empty; omit the header or send a unique key"
    elif len(key) > IDEMPOTENCY_KEY_MAX:
        problem = f"at most {IDEMPOTENCY_KEY_MAX} characters"
    elif (bad := control_character(key)) is not None:
        problem = f"control character {bad} is not allowed"
    if problem is not None:
        raise Problem(
            400, "invalid-idempotency-key", "Invalid Idempotency-Key",
            f"Idempotency-Key: {problem}", [{"field": "Idempotency-Key", "message": problem}],
        )
    return key
