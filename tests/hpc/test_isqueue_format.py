"""isqueue -o with a field letter squeue does not know is refused with squeue's wording and exit
1, before the broker is asked (it used to crash with a ValueError traceback)."""

from __future__ import annotations

import pytest

import broker.dropins.common as common
from broker.dropins import isqueue


def test_an_unknown_format_letter_is_refused_before_any_call(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def no_broker(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the broker was asked")

    monkeypatch.setattr(common, "connect", no_broker)
    monkeypatch.setattr(isqueue, "connect", no_broker)
    assert isqueue.run(["-o", "%.10i %Z"], {}) == 1
    err = capsys.readouterr().err
    assert err.strip() == "isqueue: error: Invalid job format specification: Z"


def test_known_letters_pass_the_check() -> None:
    isqueue.check_format("%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R %S")
    isqueue.check_format(None)
