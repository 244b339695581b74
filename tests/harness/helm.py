"""The Helm chart as the deployment tests render it: paths, the values a site would give,
running helm, merging values, picking objects by kind."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.harness.paths import ROOT

REPO = ROOT
CHART = REPO / "deploy" / "helm" / "isthmus"
BUILD_HELM = REPO / "deploy" / "helm" / "build-helm"
KUBE_VERSION = "1.36.3"  # the local control plane's (deploy/testenv/k8s)

# values a site would give: PostgreSQL from a Secret, one k8s backend in its own namespace
SITE_VALUES: dict[str, Any] = {
    "database": {"existingSecret": "isthmus-db"},
    "config": {
        "server": {"host": "0.0.0.0", "port": 8080},
        "auth": {"mode": "token", "tokens": [
            {"name": "admin", "role": "admin", "token_env": "ISTHMUS_ADMIN_TOKEN"}]},
        "flavors": [{"name": "a100-80g", "gpu_model": "NVIDIA-A100-SXM4-80GB",
                     "gpu_memory_gb": 80}],
        "backends": [{"name": "k8s", "kind": "k8s",
                      "settings": {"namespace": "gpu-jobs", "create_namespace": False}}],
        "pools": [{"name": "a100", "backend": "k8s", "flavor": "a100-80g",
                   "node_selector": {"isthmus.io/pool": "a100"}}],
        "teams": [{"name": "vision", "quotas": {"a100-80g": {"nominal": 16}}}],
    },
}


def run_helm(helm: Path, args: Sequence[str], *, values: dict[str, Any] | None = None,
             tmp: Path | None = None, check: bool = True,
             env: dict[str, str] | None = None, timeout: float = 180,
             ) -> subprocess.CompletedProcess[str]:
    cmd = [str(helm), *args]
    if values is not None:
        assert tmp is not None
        path = tmp / f"values-{len(list(tmp.glob('values-*.yaml')))}.yaml"
        path.write_text(yaml.safe_dump(values))
        cmd += ["-f", str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                          check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} exited {proc.returncode}\n"
                             f"{proc.stdout}\n{proc.stderr}")
    return proc


Render = Callable[..., list[dict[str, Any]]]


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objs, kind)
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]
