"""Where the dashboard's templates and static files live: inside this package."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).parent
