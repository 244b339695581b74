"""Slurm's host list form of a node list (no other import: isbatch --test-only prints one)."""

from __future__ import annotations

import re

_HOST = re.compile(r"^(.*?)(\d+)$")


def compress(nodes: tuple[str, ...] | list[str]) -> str:
    """``a100-1,a100-2,a100-4`` -> ``a100-[1-2,4]`` (Slurm's host list form)."""
    groups: dict[str, list[int]] = {}
    order: list[str] = []
    plain: list[str] = []
    widths: dict[str, int] = {}
    for node in nodes:
        m = _HOST.match(node)
        if not m:
            plain.append(node)
            continue
        prefix, digits = m.groups()
        if prefix not in groups:
            groups[prefix] = []
            order.append(prefix)
            widths[prefix] = len(digits) if digits.startswith("0") else 0
        groups[prefix].append(int(digits))
    parts = list(plain)
    for prefix in order:
        nums = sorted(set(groups[prefix]))
        w = widths[prefix]
        if len(nums) == 1:
            parts.append(f"{prefix}{nums[0]:0{w}d}")
            continue
        ranges: list[str] = []
        start = prev = nums[0]
        for n in [*nums[1:], None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            ranges.append(f"{start:0{w}d}" if start == prev else f"{start:0{w}d}-{prev:0{w}d}")
            if n is not None:
                start = prev = n
        parts.append(f"{prefix}[{','.join(ranges)}]")
    return ",".join(parts)
