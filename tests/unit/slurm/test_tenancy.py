"""Slurm tenancy without a cluster: the batch script makes the job's directory and files
private before anything is written (slurmrestd sets no umask of its own), and the settings
that submit as the owner are checked up front."""

from __future__ import annotations

import pytest

from backends.base import SettingsError
from backends.slurm.script import render
from backends.slurm.settings import SlurmSettings
from tests.harness.requests import slurm_request


def test_job_directory_is_private_before_any_file_is_written() -> None:
    lines = render(slurm_request(), partition="a100").splitlines()
    umask = lines.index("umask 077")
    mkdir = next(i for i, line in enumerate(lines) if line.startswith("mkdir "))
    assert lines[mkdir] == 'mkdir -p -m 0700 "$ISTHMUS_JOB_DIR"'
    assert lines[mkdir + 1] == 'chmod 0700 "$ISTHMUS_JOB_DIR"'  # also when it existed
    first_write = next(i for i, line in enumerate(lines) if '> "$ISTHMUS_JOB_DIR/' in line)
    assert umask < mkdir < first_write


@pytest.mark.parametrize(("data", "key"), [
    ({"transport": "rest", "rest_url": "http://x", "submit_as_owner": True}, "submit_as_owner"),
    ({"accounts": {"vision": "ml; rm"}}, "accounts.vision"),
    ({"unix_users": {"alice": "Root Admin"}}, "unix_users.alice"),
], ids=["owner-needs-cli", "bad-account", "bad-unix-user"])
def test_tenancy_settings_are_checked(data: dict[str, object], key: str) -> None:
    with pytest.raises(SettingsError) as err:
        SlurmSettings.from_dict(data)
    assert key in [k for k, _ in err.value.problems]


def test_owner_maps_to_a_unix_user_or_the_same_name() -> None:
    s = SlurmSettings.from_dict({"submit_as_owner": True, "unix_users": {"alice": "t1"}})
    assert s.unix_user("alice") == "t1" and s.unix_user("bob") == "bob"
    assert SlurmSettings.from_dict({}).unix_user("alice") is None  # off: the broker's user
    with pytest.raises(ValueError, match="no owner"):
        s.unix_user(None)
