"""isinfo: sinfo's partition list for tools that ask it which partitions exist.

The partitions are the broker's ``slurm_compat.partitions`` (an sbatch ``-p`` name, not one
Slurm partition: it may span Slurm and Kubernetes pools). ``-h`` drops the header, ``-o`` takes
``%P`` (the name, ``*`` after the default partition), ``%R`` (the name alone), ``%a``
(``up``), ``%D`` (the nodes of its pools) and ``%G`` (their GPUs a node, ``gpu:TYPE:N``, from
the pools' configured shapes); other fields are refused by name.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from broker.dropins import pipes
from broker.dropins.common import DropInError, connect, main_guard

PROG = "isinfo"
DEFAULT_FORMAT = "%9P %5a"
_HEADERS = {"P": "PARTITION", "R": "PARTITION", "a": "AVAIL", "D": "NODES", "G": "GRES"}
_SPEC = re.compile(r"%(\.)?(-)?(\d+)?([A-Za-z])")


def lines(partitions: Sequence[str], default: str | None, fmt: str, header: bool,
          shapes: Mapping[str, Mapping[str, Any]] | None = None) -> list[str]:
    specs = list(_SPEC.finditer(fmt))
    for m in specs:
        if m.group(4) not in _HEADERS:
            raise DropInError(f"Invalid node format specification: {m.group(4)}")
    shapes = shapes or {}
    rows: list[dict[str, str] | None] = [None] if header else []
    rows += [{"P": name + ("*" if name == default else ""), "R": name, "a": "up",
              "D": str((shapes.get(name) or {}).get("nodes", 0)),
              "G": str((shapes.get(name) or {}).get("gres", "(null)"))}
             for name in partitions]
    out = []
    for row in rows:
        text, pos = [], 0
        for m in specs:
            text.append(fmt[pos:m.start()])
            pos = m.end()
            value = _HEADERS[m.group(4)] if row is None else row[m.group(4)]
            width = min(int(m.group(3)), 1024) if m.group(3) else 0
            if m.group(1) and width:
                value = value[:width]
            text.append(value.rjust(width) if m.group(1) and not m.group(2)
                        else value.ljust(width))
        text.append(fmt[pos:])
        out.append("".join(text).rstrip())
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="sinfo's partitions for Isthmus",
                                add_help=False)
    p.add_argument("-h", "--noheader", action="store_true")
    p.add_argument("-o", "--format", default=DEFAULT_FORMAT)
    p.add_argument("-s", "--summarize", action="store_true", help="accepted; one line each")
    p.add_argument("--help", action="help")
    return p


def run(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    args = parser().parse_args(argv)

    def body() -> int:
        with connect(environ) as api:
            answer = api.slurm_compat()
        compat = answer["slurm_compat"]
        names = sorted(compat.get("partitions") or {})
        for line in lines(names, compat.get("default_partition"), args.format,
                          not args.noheader, answer.get("partition_shapes")):
            print(line)
        return 0

    return main_guard(PROG, body)


def main() -> None:
    pipes.end_quietly_on_closed_pipe()
    sys.exit(run(sys.argv[1:], os.environ))
