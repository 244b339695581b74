"""submit_as_owner never runs a job as a system account: not as SlurmUser (which can read the
JWT key and take the cluster over), root, nobody, a uid below min_owner_uid or in the reserved
system bands. Both transports check before anything is signed or run; over REST the uid the
cluster reports is checked again after submit (pure, no cluster: Slurm is faked)."""

from __future__ import annotations

import pwd
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from backends.base import SettingsError
from backends.slurm.owner_policy import OwnerPolicy, OwnerRefused, cluster_accounts
from backends.slurm.owner_tokens import OwnerTokenError, OwnerTokens
from backends.slurm.records import BatchJob
from backends.slurm.settings import SlurmSettings
from backends.slurm.shape import GangShape
from backends.slurm.transport import SubmitRefused
from backends.slurm.transport_cli import CliTransport
from backends.slurm.transport_rest import RestTransport

KEY = b"k" * 32
# the broker's host as the tests see it: name -> uid
UIDS = {"alice": 1001, "slurm": 64030, "postgres": 113, "nobody": 65534, "slurmadm": 2000,
        "daemon": 1}
CONFIG = "SlurmUser               = slurmadm(2000)\nSlurmdUser              = root(0)\n"


def _policy(**kw: Any) -> OwnerPolicy:
    return OwnerPolicy(lookup=UIDS.get, **kw)


@pytest.mark.parametrize(("user", "why"), [
    ("slurm", "'slurm' is a system account"),
    ("root", "'root' is a system account"),
    ("nobody", "'nobody' is a system account"),
    ("postgres", "owner 'postgres' is a system account (uid 113 < min_owner_uid 1000)"),
    ("daemon", "(uid 1 < min_owner_uid 1000)"),
    ("mallory", "no Unix user 'mallory' on the broker's host"),
])
def test_no_token_is_signed_for_a_system_account_or_an_unknown_name(user: str,
                                                                    why: str) -> None:
    tokens = OwnerTokens(KEY, 60, policy=_policy())
    with pytest.raises(OwnerTokenError) as err:
        tokens.headers(user)
    assert why in str(err.value)
    assert tokens.headers("alice")["X-SLURM-USER-NAME"] == "alice"


def test_reserved_system_uids_and_the_configured_floor() -> None:
    policy = _policy(min_uid=1500)
    assert "uid 1001 < min_owner_uid 1500" in str(policy.uid_problem("alice", 1001))
    assert "60000-65535 reserved" in str(policy.uid_problem("x", 64030))
    assert "reserved" in str(policy.uid_problem("x", 4294967294))
    assert policy.uid_problem("x", 70000) is None  # e.g. a directory service's users
    with pytest.raises(OwnerRefused, match="not a Unix user name"):
        policy.check_local("Alice; rm -rf /")


def test_a_name_unknown_here_is_allowed_only_when_the_admin_mapped_it() -> None:
    assert _policy(vouched=frozenset({"carol"})).check_local("carol") is None
    with pytest.raises(OwnerRefused, match="unix_users"):
        _policy().check_local("carol")


def test_the_clusters_slurm_user_is_read_from_its_configuration() -> None:
    names, uids = cluster_accounts(CONFIG)
    assert (names, uids) == ({"slurmadm", "root"}, {2000, 0})
    conf = "# SlurmUser=ignored\nSlurmUser=slurmsvc # the daemon's user\n"
    assert cluster_accounts(conf) == ({"slurmsvc"}, set())
    policy = _policy().with_cluster_accounts(names, uids)
    with pytest.raises(OwnerRefused, match="'slurmadm' is a system account"):
        policy.check_local("slurmadm")  # uid 2000 passes the floor; its name does not


# -- REST: checked before signing, and the cluster's uid after submit ---------------------------

def _rest(owners: OwnerTokens, cluster_user: tuple[str, int]) -> tuple[RestTransport,
                                                                       list[str]]:
    calls: list[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(f"{req.method} {req.url.path}")
        if req.method == "POST":
            return httpx.Response(200, json={"job_id": 42, "errors": []})
        if req.method == "GET":
            name, uid = cluster_user
            return httpx.Response(200, json={"jobs": [{"job_id": 42, "user_name": name,
                                                       "user_id": uid}]})
        return httpx.Response(200, json={"errors": []})

    client = httpx.Client(base_url="http://slurmrestd", transport=httpx.MockTransport(handler))
    rest = RestTransport(url="http://slurmrestd", user="isthmus", token="broker-token",
                         version="v0.0.38", client=client, owner_tokens=owners)
    return rest, calls


def _job() -> BatchJob:
    return BatchJob(name="isthmus-x-1", script="#!/bin/bash\ntrue\n", comment="",
                    partition="a100", shape=GangShape(1, 1, None, None), gpu_type="",
                    gpu_request="gres", time_limit_min=10, output="/work/isthmus-x-1.out",
                    work_dir="/work")


@pytest.mark.parametrize("user", ["slurm", "postgres"])
def test_rest_submits_nothing_for_a_system_account(user: str) -> None:
    rest, calls = _rest(OwnerTokens(KEY, 60, policy=_policy()), (user, UIDS[user]))
    with pytest.raises(SubmitRefused, match=f"owner '{user}' is a system account"):
        rest.submit(_job(), as_user=user)
    assert calls == []  # no token signed, nothing sent


def test_rest_cancels_a_job_the_cluster_runs_as_a_system_uid() -> None:
    # 'svc' is unknown on the broker's host but mapped by the admin: only the cluster knows
    owners = OwnerTokens(KEY, 60, policy=_policy(vouched=frozenset({"svc"})))
    rest, calls = _rest(owners, ("svc", 64030))
    with pytest.raises(SubmitRefused) as err:
        rest.submit(_job(), as_user="svc")
    text = str(err.value)
    assert text == ("owner 'svc' is a system account (uid 64030 is in the range 60000-65535 "
                    "reserved for system accounts); job 42 cancelled")
    assert "DELETE /slurm/v0.0.38/job/42" in calls
    assert "broker-token" not in text and "k" * 8 not in text


def test_rest_keeps_a_job_of_an_ordinary_uid() -> None:
    owners = OwnerTokens(KEY, 60, policy=_policy(vouched=frozenset({"svc"})))
    rest, calls = _rest(owners, ("svc", 5000))
    assert rest.submit(_job(), as_user="svc") == "42"
    assert not [c for c in calls if c.startswith("DELETE")]


# -- CLI: checked before sbatch runs as the owner ------------------------------------------------

@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[CliTransport, list[Any]]:
    sbatch: list[Any] = []

    def getpwnam(name: str) -> pwd.struct_passwd:
        if name not in UIDS:
            raise KeyError(name)
        uid = UIDS[name]
        return pwd.struct_passwd((name, "x", uid, uid, "", f"/home/{name}", "/bin/bash"))

    def fake_run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        if argv[:3] == ["scontrol", "show", "config"]:
            return subprocess.CompletedProcess(argv, 0, CONFIG, "")
        sbatch.append(kw.get("user"))
        return subprocess.CompletedProcess(argv, 0, "77\n", "")

    monkeypatch.setattr(pwd, "getpwnam", getpwnam)
    monkeypatch.setattr("os.getgrouplist", lambda user, gid: [gid])
    monkeypatch.setattr(subprocess, "run", fake_run)
    return CliTransport(timeout=5), sbatch


@pytest.mark.parametrize(("user", "why"), [
    ("slurm", "owner 'slurm' is a system account"),
    ("slurmadm", "owner 'slurmadm' is a system account"),  # the cluster's SlurmUser
    ("postgres", "owner 'postgres' is a system account (uid 113 < min_owner_uid 1000)"),
    ("nobody", "owner 'nobody' is a system account"),
])
def test_cli_never_runs_sbatch_as_a_system_account(cli: tuple[CliTransport, list[Any]],
                                                   tmp_path: Path, user: str,
                                                   why: str) -> None:
    transport, sbatch = cli
    job = replace(_job(), output=str(tmp_path / "spool" / "x.out"))
    with pytest.raises(SubmitRefused) as err:
        transport.submit(job, as_user=user)
    assert why in str(err.value)
    assert sbatch == []


def test_cli_runs_sbatch_as_an_ordinary_owner(cli: tuple[CliTransport, list[Any]],
                                              tmp_path: Path) -> None:
    transport, sbatch = cli
    job = replace(_job(), output=str(tmp_path / "spool" / "x.out"))
    assert transport.submit(job, as_user="alice") == "77"
    assert sbatch == [1001]


# -- settings -------------------------------------------------------------------------------

@pytest.mark.parametrize(("data", "key"), [
    ({"min_owner_uid": 0}, "min_owner_uid"),
    ({"min_owner_uid": 10**9}, "min_owner_uid"),
    ({"denied_owners": ["ops; rm"]}, "denied_owners[0]"),
    ({"denied_owners": [f"u{i}" for i in range(300)]}, "denied_owners"),
    ({"unix_users": {"mallory": "slurm"}}, "unix_users.mallory"),
    ({"unix_users": {"mallory": "ops"}, "denied_owners": ["ops"]}, "unix_users.mallory"),
])
def test_owner_settings_are_bounded(data: dict[str, object], key: str) -> None:
    with pytest.raises(SettingsError) as err:
        SlurmSettings.from_dict(data)
    assert key in [k for k, _ in err.value.problems]


def test_settings_build_the_policy() -> None:
    s = SlurmSettings.from_dict({"submit_as_owner": True, "min_owner_uid": 2000,
                                 "denied_owners": ["ops"], "unix_users": {"alice": "t1"}})
    policy = s.owner_policy()
    assert policy.min_uid == 2000 and {"ops", "slurm", "root"} <= policy.denied
    assert policy.vouched == frozenset({"t1"})
