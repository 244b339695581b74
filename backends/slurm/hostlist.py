"""Slurm host lists ('a100-[1-3,5],h100-2') expanded without calling scontrol."""

from __future__ import annotations

import re

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top(text: str) -> list[str]:
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p for p in (x.strip() for x in parts) if p]


def _expand_one(item: str) -> list[str]:
    start = item.find("[")
    if start < 0:
        return [item]
    end = item.index("]", start)
    prefix, body, rest = item[:start], item[start + 1 : end], item[end + 1 :]
    tails = _expand_one(rest) if rest else [""]
    names: list[str] = []
    for piece in body.split(","):
        m = _RANGE.match(piece.strip())
        if not m:
            raise ValueError(f"bad host range {piece!r} in {item!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        width = len(lo)
        for n in range(int(lo), int(hi) + 1):
            names.extend(f"{prefix}{n:0{width}d}{tail}" for tail in tails)
    return names


def expand(hostlist: str | None) -> tuple[str, ...]:
    """Expand a Slurm host list; '', 'None assigned' and '(null)' give ()."""
    if not hostlist or hostlist in ("None assigned", "(null)", "None"):
        return ()
    names: list[str] = []
    for item in _split_top(hostlist):
        names.extend(_expand_one(item))
    return tuple(names)
