"""Tenancy on the real Slurm cluster: the broker (root) submits each job as its owner's Unix
user, under the team's account; each job's directory is 0700 and its files 0600, owned by that
user, so another team's user cannot read them (job.json holds the job's env and its token)."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import stat
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from backends.base import SubmitRequest
from backends.slurm import SlurmBackend
from backends.slurm.owner_tokens import OwnerTokens, read_key
from backends.slurm.transport import SubmitRefused
from broker.config import Backend as BackendConfig
from broker.config import Pool
from broker.domain.attempts import Placement, RunSnapshot, backend_object_name
from broker.domain.facts import Phase
from broker.domain.ids import new_job_id
from broker.domain.spec import JobSpec
from broker.wiring.adapters import slurm_adapter
from tests.fixtures.slurm import SlurmCluster
from tests.harness.wait import wait_until

pytestmark = pytest.mark.slurm
USERS = {"alice": "isthmus-t1", "bob": "isthmus-t2"}  # API user -> Unix user
ACCOUNT = "isthmus"  # created by deploy/testenv/slurm/up
SUBMITTED: list[str] = []  # cancelled after each test
POOL = Pool(name="slurm-a100", backend="slurm-local", partition="a100", flavor="a100-80g")


@pytest.fixture(scope="module")
def unix_users() -> dict[str, pwd.struct_passwd]:
    if os.geteuid() != 0:
        pytest.skip("submitting as another user needs root")
    # useradd lives in /usr/sbin, which a CI's or a user's PATH may not hold
    useradd = shutil.which("useradd", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
    for unix in USERS.values():
        try:
            pwd.getpwnam(unix)
        except KeyError:
            assert useradd is not None, "useradd not found (package passwd): cannot add " + unix
            subprocess.run([useradd, "--no-create-home", "--shell", "/bin/bash", unix],
                           check=True, capture_output=True, text=True)
    return {api: pwd.getpwnam(unix) for api, unix in USERS.items()}


def _transport(slurm: SlurmCluster, kind: str, work: Path) -> dict[str, Any]:
    if kind == "cli":
        return {"transport": "cli", "slurm_conf": str(slurm.slurm_conf)}
    # over REST the broker cannot create work_dir on the cluster: the site does, mode 1777
    work.mkdir(parents=True)
    work.chmod(0o1777)
    # the broker's own token is the unprivileged user's: it cannot act on others' jobs, so
    # whatever the owners' jobs see was done with the token signed for their owner
    return {"transport": "rest", "rest_url": slurm.rest_url, "rest_user": slurm.user_name,
            "rest_token": slurm.user_jwt,
            "rest_jwt_key_file": str(slurm.slurm_conf.parent / "jwt_hs256.key"),
            "owner_token_lifespan_s": 30}


@pytest.fixture(params=["cli", "rest"])
def backend(request: pytest.FixtureRequest, slurm_cluster: SlurmCluster,
            unix_users: Any) -> Iterator[SlurmBackend]:
    work = slurm_cluster.work_dir / f"tenancy-{uuid.uuid4().hex[:8]}"
    settings: dict[str, Any] = {
        **_transport(slurm_cluster, request.param, work),
        "work_dir": str(work), "python": "/usr/bin/python3", "timeout": 30,
        "submit_as_owner": True, "unix_users": USERS, "accounts": {"vision": ACCOUNT},
    }
    be = slurm_adapter(BackendConfig(name="slurm-local", kind="slurm", settings=settings),
                      [POOL])
    yield be
    for name in SUBMITTED:
        be.cancel(name, 0)
    SUBMITTED.clear()
    be.close()
    shutil.rmtree(work, ignore_errors=True)


def _request(backend: SlurmBackend, owner: str, argv: list[str],
             env: dict[str, str]) -> SubmitRequest:
    job_id = new_job_id()
    spec = JobSpec.model_validate({
        "name": "tenancy", "team": "vision", "flavors": ["a100-80g"],
        "gang": {"replicas": 1, "gpus_per_replica": 1}, "entrypoint": {"command": argv},
        "env": env, "max_runtime": "10m",
    })
    name = backend_object_name(job_id, 1)
    SUBMITTED.append(name)
    placement = Placement(backend="slurm", backend_instance="slurm-local", pool=POOL.name,
                          flavor="a100-80g")
    return SubmitRequest(job_id=job_id, attempt=1, name=name, snapshot=RunSnapshot.of(spec),
                         placement=placement, owner=owner,
                         env={"ISTHMUS_PROGRESS_TOKEN": "secret-token-of-" + owner})


def _phase(backend: SlurmBackend, name: str, *phases: Phase) -> bool:
    return any(f.backend_name == name and f.phase in phases for f in backend.observe([name]))


def test_jobs_run_as_their_owner_and_cannot_read_each_others_directory(
    backend: SlurmBackend, slurm_cluster: SlurmCluster, unix_users: dict[str, Any]
) -> None:
    work = Path(backend.settings.work_dir)
    release = work / "release-alice"
    alice = _request(backend, "alice", ["/bin/bash", "-c",
                     'for i in $(seq 1200); do [ -e "$RELEASE" ] && exit 0; sleep 0.1; done; '
                     "exit 7"], {"RELEASE": str(release)})
    backend.submit(alice)
    alice_dir = work / alice.name
    wait_until(lambda: (alice_dir / "job.json").exists()
               and _phase(backend, alice.name, Phase.RUNNING), timeout=90,
               what="alice's job to run")
    (fact,) = [f for f in backend.observe([alice.name]) if f.backend_name == alice.name]
    assert fact.gpu_models == ("a100",)  # for the run snapshot: the GPU type of its nodes
    t1 = unix_users["alice"]
    st = alice_dir.stat()
    assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o700, t1.pw_uid)
    for f in ("job.json", "launch.py"):
        fst = (alice_dir / f).stat()
        assert (stat.S_IMODE(fst.st_mode), fst.st_uid) == (0o600, t1.pw_uid), f
    out = slurm_cluster.run(["squeue", "-h", "-n", alice.name, "-o", "%u %a"]).stdout.split()
    assert out == ["isthmus-t1", ACCOUNT]

    # bob's job tries to read alice's directory and job.json (with her token) from inside
    bob = _request(backend, "bob", ["/bin/bash", "-c",
                   'ls "$OTHER" >/dev/null 2>&1 && echo LIST-OK || echo LIST-DENIED; '
                   'cat "$OTHER/job.json" >/dev/null 2>&1 && echo READ-OK || echo READ-DENIED'],
                   {"OTHER": str(alice_dir)})
    backend.submit(bob)
    wait_until(lambda: _phase(backend, bob.name, Phase.SUCCEEDED, Phase.FAILED), timeout=90,
               what="bob's job to end")
    (output,) = work.glob(f"{bob.name}-*.out")
    text = output.read_text()
    assert "LIST-DENIED" in text and "READ-DENIED" in text, text
    ost = output.stat()
    assert (stat.S_IMODE(ost.st_mode), ost.st_uid) == (0o600, unix_users["bob"].pw_uid)
    assert (work / bob.name).stat().st_uid == unix_users["bob"].pw_uid
    release.touch()
    wait_until(lambda: _phase(backend, alice.name, Phase.SUCCEEDED), timeout=90,
               what="alice's job to succeed")


def test_an_owner_without_a_unix_user_is_refused(backend: SlurmBackend,
                                                 slurm_cluster: SlurmCluster) -> None:
    req = _request(backend, "mallory-has-no-account", ["/bin/true"], {})
    with pytest.raises(SubmitRefused, match="no Unix user"):
        backend.submit(req)
    # nothing of it may be in the queue (over REST no token is signed for a name unknown here)
    assert slurm_cluster.run(["squeue", "-h", "-t", "PD,R", "-n", req.name]).stdout == ""


def _system_owners(slurm: SlurmCluster) -> list[tuple[str, str]]:
    service = pwd.getpwnam(slurm.user_name)  # the testenv's REST user: useradd --system
    assert service.pw_uid < 1000
    return [("slurm", "owner 'slurm' is a system account"),
            (slurm.user_name, f"owner '{slurm.user_name}' is a system account "
                              f"(uid {service.pw_uid} < min_owner_uid 1000)")]


def test_a_system_account_owner_is_refused(backend: SlurmBackend,
                                           slurm_cluster: SlurmCluster) -> None:
    """An API user named like SlurmUser or a service account (here the testenv's REST user,
    which has a Slurm association) gets no job: nothing signed, sbatch never run."""
    for owner, why in _system_owners(slurm_cluster):
        req = _request(backend, owner, ["/bin/true"], {})
        with pytest.raises(SubmitRefused, match=re.escape(why)):
            backend.submit(req)
        assert slurm_cluster.run(["squeue", "-h", "-t", "all", "-n", req.name]).stdout == ""


@pytest.mark.parametrize("backend", ["rest"], indirect=True)
def test_over_rest_the_clusters_uid_is_checked_after_submit(
    backend: SlurmBackend, slurm_cluster: SlurmCluster
) -> None:
    """A broker host that does not know the cluster's users, with an admin mapping to a name
    that is a system account on the cluster: Slurm's user_id is checked, the job cancelled."""
    owners = backend.transport.owner_tokens  # type: ignore[attr-defined]
    owners.policy = replace(owners.policy, lookup=lambda user: None,
                            vouched=frozenset({slurm_cluster.user_name}))
    uid = pwd.getpwnam(slurm_cluster.user_name).pw_uid
    req = _request(backend, slurm_cluster.user_name, ["/bin/true"], {})
    with pytest.raises(SubmitRefused) as err:
        backend.submit(req)
    assert re.fullmatch(rf"owner '{slurm_cluster.user_name}' is a system account \(uid "
                        rf"{uid} < min_owner_uid 1000\); job \d+ cancelled", str(err.value))
    assert "eyJ" not in str(err.value)  # no token (a JWT starts with "eyJ")
    out = slurm_cluster.run(["squeue", "-h", "-t", "PD,R", "-n", req.name, "-o", "%u"]).stdout
    assert out == ""


@pytest.mark.parametrize("backend", ["rest"], indirect=True)
def test_over_rest_a_job_is_cancelled_as_its_owner(
    backend: SlurmBackend, slurm_cluster: SlurmCluster
) -> None:
    req = _request(backend, "alice", ["/bin/bash", "-c", "sleep 600"], {})
    job_id = backend.submit(req).backend_id
    wait_until(lambda: _phase(backend, req.name, Phase.RUNNING), timeout=90,
               what="alice's job to run")
    # the broker's own (unprivileged) token may not cancel alice's job ...
    resp = httpx.delete(slurm_cluster.rest_path(f"job/{job_id}"),
                        headers=slurm_cluster.rest_headers(slurm_cluster.user_name))
    assert any("denied" in str(e).lower() for e in resp.json().get("errors") or ()), resp.text
    assert _phase(backend, req.name, Phase.RUNNING)
    # ... the backend does, with a token signed for alice
    assert backend.cancel(req.name, 0).found
    wait_until(lambda: _phase(backend, req.name, Phase.CANCELLED), timeout=90,
               what="alice's job to be cancelled")


def test_slurmrestd_takes_a_signed_owner_token_only_while_it_lives_and_only_from_the_key(
    slurm_cluster: SlurmCluster, unix_users: Any
) -> None:
    key = read_key(str(slurm_cluster.slurm_conf.parent / "jwt_hs256.key"))
    now = time.time()

    def diag(tokens: OwnerTokens) -> httpx.Response:
        return httpx.get(slurm_cluster.rest_path("diag"), headers=tokens.headers("isthmus-t1"),
                         timeout=30)

    assert diag(OwnerTokens(key, 60)).status_code == 200
    expired = diag(OwnerTokens(key, 60, clock=lambda: now - 120))
    forged = diag(OwnerTokens(b"not-the-cluster-key-" * 2, 60))
    for resp in (expired, forged):
        assert resp.status_code != 200 and resp.json().get("errors"), resp.text
