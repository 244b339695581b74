"""Paths into the repository that tests read."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_CONFIG = ROOT / "examples" / "isthmus.yaml"  # the simulated federation
LOCAL_CONFIG = ROOT / "examples" / "isthmus-local.yaml"  # the same on the test clusters
