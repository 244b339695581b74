"""Resource quantities as the API server writes them, read by the Kubernetes client's parser
(the hand-written one before it read neither `n` nor `u`: '100n' was a ValueError)."""

from __future__ import annotations

import pytest

from backends.k8s.inventory import MAX_QUANTITY, quantity


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("500m", 0.5),
        ("1Gi", 2**30),
        ("100n", 100e-9),
        ("2u", 2e-6),
        ("8", 8.0),
        (8, 8.0),
        ("24500m", 24.5),
        ("2Ti", 2 * 2**40),
        ("1e3", 1000.0),
        ("1k", 1000.0),
        (None, 0.0),
    ],
    ids=["milli", "gibi", "nano", "micro", "plain", "int", "many-milli", "tebi", "exponent",
         "kilo", "absent"],
)
def test_quantities(text: object, number: float) -> None:
    assert quantity(text) == pytest.approx(number)


@pytest.mark.parametrize(
    ("text", "number"),
    [("-1", 0.0), ("NaN", 0.0), ("inf", MAX_QUANTITY), ("1e400", MAX_QUANTITY)],
    ids=["negative", "nan", "inf", "huge"],
)
def test_absurd_quantities_are_bounded(text: str, number: float) -> None:
    assert quantity(text) == number


def test_a_quantity_that_is_no_quantity_is_refused() -> None:
    with pytest.raises(ValueError, match="abc"):
        quantity("abc")
