"""Fixtures for the deployment tests: the helm binary (deploy/helm/build-helm) and rendering."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness.helm import BUILD_HELM, CHART, KUBE_VERSION, SITE_VALUES, Render, merge, run_helm


@pytest.fixture(scope="session")
def helm() -> Path:
    """The cached helm binary; built from its Go module on first use (about 1-4 minutes)."""
    proc = subprocess.run(["bash", str(BUILD_HELM)], capture_output=True, text=True,
                          timeout=1200, check=False)
    last = proc.stdout.strip().splitlines()[-1:] or [""]
    if proc.returncode != 0 or not last[0].startswith("HELM="):
        pytest.fail(f"deploy/helm/build-helm exited {proc.returncode}\n--- stdout ---\n"
                    f"{proc.stdout}\n--- stderr ---\n{proc.stderr}", pytrace=False)
    return Path(last[0].removeprefix("HELM="))


@pytest.fixture
def render(helm: Path, tmp_path: Path) -> Render:
    """helm template with SITE_VALUES merged with `overrides` -> the rendered objects."""

    def do(overrides: dict[str, Any] | None = None, *, namespace: str = "isthmus-system",
           release: str = "rel") -> list[dict[str, Any]]:
        values = merge(SITE_VALUES, overrides or {})
        out = run_helm(helm, ["template", release, str(CHART), "-n", namespace,
                              "--kube-version", KUBE_VERSION], values=values, tmp=tmp_path)
        return [d for d in yaml.safe_load_all(out.stdout) if d]

    return do


