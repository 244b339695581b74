from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    d = tmp_path / "jobs"
    d.mkdir()
    d.chmod(0o777)
    return d
