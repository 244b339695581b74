"""The job's env may not set what Isthmus gives the ranks, nor the loader's hooks."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from broker.domain.spec import JobSpec
from tests.builders import spec


@pytest.mark.parametrize("name", ["ISTHMUS_PROGRESS_TOKEN", "ISTHMUS_JOB_ID",
                                  "ISTHMUS_RESUME_FROM", "ISTHMUS_ATTEMPT", "LD_PRELOAD",
                                  "LD_AUDIT"])
def test_reserved_names_are_refused_naming_the_field(name: str) -> None:
    data = spec().build().model_dump()
    data["env"] = {name: "x", "KEPT_VAR": "1"}
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate(data)
    err = exc.value.errors()[0]
    assert err["loc"] == ("env",) and name in err["msg"] and "KEPT_VAR" not in err["msg"]


def test_ordinary_and_simulator_names_are_kept() -> None:
    data = spec().build().model_dump()
    data["env"] = {"LD_LIBRARY_PATH": "/usr/local/cuda/lib64", "ISTHMUS_SIM_DURATION": "30",
                   "MY_ISTHMUS_JOB_ID": "fine"}
    assert JobSpec.model_validate(data).env == data["env"]
