"""The wall clock, in UTC: the default `now` of the write paths (callers and tests may pass
their own)."""

from __future__ import annotations

from datetime import UTC, datetime


def utcnow() -> datetime:
    return datetime.now(UTC)
