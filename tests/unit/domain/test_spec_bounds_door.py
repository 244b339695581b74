"""Values at the door: bidirectional controls ("Trojan Source") are refused in names and
scripts as the other invisible characters are (right-to-left text is kept); array limits are
bounded like array counts."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from broker.domain.spec import JobSpec
from broker.domain.text import control_character
from tests.builders import spec


@pytest.mark.parametrize("ch", ["\u202e", "\u202a", "\u2066", "\u2069", "\u200f", "\u061c"])
def test_a_bidi_control_in_the_queue_is_refused_naming_the_field(ch: str) -> None:
    data = spec().build().model_dump()
    data["queue"] = f"team{ch}a"
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate(data)
    err = exc.value.errors()[0]
    assert err["loc"] == ("queue",) and f"U+{ord(ch):04X}" in err["msg"]


def test_in_a_script_too_but_not_plain_right_to_left_text() -> None:
    assert control_character("echo hi # \u202e evil", multiline=True) == "U+202E"
    assert control_character("echo \u05e9\u05dc\u05d5\u05dd # \u0645\u0631\u062d\u0628\u0627",
                             multiline=True) is None


def test_an_array_limit_is_bounded_like_its_count() -> None:
    data = spec().build().model_dump()
    data["scheduling"] = {"array": {"id": "a1", "index": 0, "count": 4, "limit": 10**30}}
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate(data)
    assert exc.value.errors()[0]["loc"] == ("scheduling", "array", "limit")
    data["scheduling"]["array"]["limit"] = 2
    assert JobSpec.model_validate(data).scheduling is not None


@pytest.mark.parametrize("path", ["/home/u/../../etc/cron.d/x", "/tmp/..", "/a/../b"])
def test_output_paths_that_climb_are_refused(path: str) -> None:
    from broker.domain.batch_options import BatchOptions

    with pytest.raises(ValidationError) as exc:
        BatchOptions(output=path)
    assert exc.value.errors()[0]["loc"] == ("output",) and "'..'" in exc.value.errors()[0]["msg"]
    assert BatchOptions(error="/home/u/out..txt/%j.err").error == "/home/u/out..txt/%j.err"
