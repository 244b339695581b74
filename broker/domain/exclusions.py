"""The pools and nodes a job's next attempts avoid (after a failure blamed on them, or a
dispatch refused there). Stored with the job as JSON (`exclude_json`); this is the one place
that reads, merges and writes that shape."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Exclusions:
    pools: frozenset[str] = frozenset()
    nodes: frozenset[str] = frozenset()

    @classmethod
    def from_json(cls, text: str | None) -> Exclusions:
        """The stored shape ({"pools": [...], "nodes": [...]}, either key optional); an
        empty or missing value excludes nothing."""
        data = json.loads(text or "{}")
        return cls(frozenset(data.get("pools", ())), frozenset(data.get("nodes", ())))

    def to_json(self) -> str:
        return json.dumps({"pools": sorted(self.pools), "nodes": sorted(self.nodes)})

    def adding(self, pools: Iterable[str] = (), nodes: Iterable[str] = ()) -> Exclusions:
        """These exclusions and the given ones (exclusions only grow)."""
        return Exclusions(self.pools | frozenset(pools), self.nodes | frozenset(nodes))
