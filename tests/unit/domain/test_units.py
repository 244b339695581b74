"""Durations and sizes: every JSON type is a ValueError with a hint or a bounded int, never
another exception (which the API would answer with a 500)."""

from __future__ import annotations

import pytest

from broker.domain.text import control_character
from broker.domain.units import format_size, parse_duration, parse_size

DAY = 86400

DURATIONS_REFUSED = [
    ("list", [1], "got a list"),
    ("object", {}, "got an object"),
    ("null", None, "got null"),
    ("bool", True, "boolean"),
    ("infinity", float("inf"), "finite"),
    ("nan", float("nan"), "finite"),
    ("fraction", 1.5, "whole number"),
    ("huge-int", 10**400, "at most 366d"),
    ("huge-text", "9" * 400, "too long"),
    ("many-days", "11574074d", "at most 366d"),
    ("unicode-digits", "\u0661\u0662", "not a duration"),
    ("zero", 0, "positive"),
]


@pytest.mark.parametrize(
    ("value", "words"), [d[1:] for d in DURATIONS_REFUSED], ids=[d[0] for d in DURATIONS_REFUSED]
)
def test_durations_refused(value: object, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_duration(value, 366 * DAY)


SIZES_REFUSED = [
    ("list", ["64Gi"], "got a list"),
    ("float-inf", float("inf"), "finite"),
    ("huge-int", 10**400, "at most 1Pi"),
    ("huge-text", "9" * 400 + "Gi", "too long"),
    ("above", "2Pi", "at most 1Pi"),
    ("bool", False, "boolean"),
    ("garbage", "lots", "not a size"),
]


@pytest.mark.parametrize(
    ("value", "words"), [s[1:] for s in SIZES_REFUSED], ids=[s[0] for s in SIZES_REFUSED]
)
def test_sizes_refused(value: object, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_size(value, 2**50)


def test_documented_forms_still_parse() -> None:
    assert parse_duration("1h30m") == 5400
    assert parse_duration(" 90 ") == 90
    assert parse_duration(7200.0) == 7200
    assert parse_duration("366d", 366 * DAY) == 366 * DAY
    assert parse_size("1.5Gi") == 3 * 2**29
    assert parse_size("16Ti", 16 * 2**40) == 16 * 2**40
    assert parse_size(1024.0) == 1024
    assert [format_size(n) for n in (16 * 2**40, 512 * 2**20, 1000)] == ["16Ti", "512Mi", "1000"]


def test_control_characters() -> None:
    assert control_character("grüß ✓ \u00a0") is None
    assert control_character("a\x00") == "U+0000"
    assert control_character("\x9b") == "U+009B"  # C1 CSI
    assert control_character("\ud800") == "U+D800"  # lone surrogate
    assert control_character("a\n\tb") == "U+000A"
    assert control_character("a\n\tb", multiline=True) is None
    assert control_character("a\r\n", multiline=True) == "U+000D"
