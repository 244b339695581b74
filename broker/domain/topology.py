"""Topology levels, encoded once: the enum a job names (`node`, `rack`, `block`) and the ranks
the placement policies compute with, tightest first, where `POOL` (one past the tightest
named level) means "no constraint"."""

from __future__ import annotations

from enum import StrEnum


class TopologyLevel(StrEnum):
    NODE = "node"
    RACK = "rack"
    BLOCK = "block"

    @property
    def rank(self) -> int:
        """Tighter levels have lower rank: node < rack < block (the declaration order)."""
        return _ORDER.index(self)


_ORDER: tuple[TopologyLevel, ...] = tuple(TopologyLevel)

NODE, RACK, BLOCK = (level.rank for level in _ORDER)
POOL = len(_ORDER)
"""The rank of "anywhere in the pool": no topology constraint."""

LEVELS: tuple[TopologyLevel | None, ...] = (*_ORDER, None)
"""The level of each rank; None for POOL."""

LEVEL_NAMES: tuple[str, ...] = (*(level.value for level in _ORDER), "pool")
"""The word for each rank, as reasons spell it."""


def rank_of(level: TopologyLevel | None) -> int:
    """The rank of a required level; POOL when none is required."""
    return POOL if level is None else level.rank
