"""The test tiers. The full suite (``scripts/test``, no ``-m``) runs every test. Tests marked
``slow`` or ``ui`` run there and under any ``-m`` that names their marker; an ``-m`` that names
neither, such as the fast tier ``-m "not slurm and not k8s and not postgres"``, leaves them out
(pytest reports them as deselected). tests/conftest.py applies this at collection."""

from __future__ import annotations

import re

OUT_OF_FAST_TIER = ("slow", "ui")


def left_out_by(markexpr: str) -> set[str]:
    """The markers of `OUT_OF_FAST_TIER` whose tests an ``-m`` expression leaves out because it
    does not name them; none without an expression."""
    if not markexpr.strip():
        return set()
    named = set(re.findall(r"[A-Za-z_][\w-]*", markexpr))
    return {m for m in OUT_OF_FAST_TIER if m not in named}
