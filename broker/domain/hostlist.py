"""Slurm's host lists (``a100-[1-3,5],h100-2``), both ways, by python-hostlist (the library
Slurm sites use for this): expanded from what squeue, sacct and the REST API report, and
compressed for what isqueue, isacct and isbatch print. One home for both directions.

python-hostlist bounds an expansion (100,000 names): a host list from a backend cannot make
the broker build an unbounded list.
"""

from __future__ import annotations

from collections.abc import Iterable

import hostlist as _hostlist

EMPTY = frozenset({"", "None assigned", "(null)", "None"})
"""What Slurm prints for "no nodes"."""


def expand(text: str | None) -> tuple[str, ...]:
    """``a100-[1-2],h100-3`` -> the node names; what Slurm prints for no nodes gives ().
    ValueError for a list that is not one (or expands beyond the library's bound)."""
    if text is None or text.strip() in EMPTY:
        return ()
    try:
        return tuple(_hostlist.expand_hostlist(text.strip()))
    except _hostlist.BadHostlist as exc:
        raise ValueError(f"bad host list {text[:200]!r}: {exc}") from None


def compress(nodes: Iterable[str]) -> str:
    """``a100-1,a100-2,a100-4`` -> ``a100-[1-2,4]`` (sorted, zero padding kept)."""
    names = list(nodes)
    return _hostlist.collect_hostlist(names) if names else ""
