"""Date arithmetic on untrusted durations saturates instead of raising OverflowError."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from broker.domain.timebox import FAR_FUTURE, FAR_PAST, add_seconds

T0 = datetime(2026, 11, 29, tzinfo=UTC)
TOP = FAR_FUTURE.replace(tzinfo=UTC)


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        pytest.param(7200, T0 + timedelta(hours=2), id="ordinary"),
        pytest.param(0, T0, id="zero"),
        pytest.param(-60, T0 - timedelta(minutes=1), id="negative"),
        pytest.param(10**12, TOP, id="1e12-int"),
        pytest.param(1e12, TOP, id="1e12-float"),
        pytest.param(10**400, TOP, id="10^400"),
        pytest.param(float("inf"), TOP, id="inf"),
        pytest.param(-(10**400), FAR_PAST.replace(tzinfo=UTC), id="-10^400"),
    ],
)
def test_add_seconds_saturates(seconds: float, expected: datetime) -> None:
    assert add_seconds(T0, seconds) == expected


def test_add_seconds_keeps_naive_datetimes_naive() -> None:
    naive = T0.replace(tzinfo=None)
    assert add_seconds(naive, 10**400) == FAR_FUTURE
    assert add_seconds(naive, 60) == naive + timedelta(seconds=60)


def test_the_far_future_leaves_room_for_more_arithmetic() -> None:
    assert add_seconds(T0, 10**12) + timedelta(days=365 * 100) > TOP


def test_nan_is_refused() -> None:
    with pytest.raises(ValueError, match="NaN"):
        add_seconds(T0, float("nan"))
