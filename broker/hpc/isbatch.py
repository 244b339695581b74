"""isbatch: sbatch for Isthmus.

``isbatch --parse-only --json [options] SCRIPT`` needs no server: it prints the normalised
request as one JSON object (member ``sbatch``). Otherwise the request is sent to the broker.
Exit codes and messages follow sbatch: 255 for an unknown option, 1 for a refused value, and
the message names the option.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from broker.hpc import sbatch_parse
from broker.hpc.sbatch_values import SbatchError

PROG = "isbatch"
USAGE = (
    "Usage: isbatch [OPTIONS(0)...] [ : [OPTIONS(N)...]] script(0) [args(0)...]\n"
    "isbatch takes sbatch's options (see sbatch(1)); its own: --parse-only, --json.\n"
)


def _read_script(path: str | None) -> str:
    if path is None:
        return sys.stdin.read()
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise SbatchError(f"Unable to open file {path}: {exc.strerror}") from exc


def run(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    try:
        parsed = sbatch_parse.parse(argv, environ, _read_script)
    except SbatchError as exc:
        text = str(exc)
        if exc.exit_code == 255 and text.startswith("unrecognized option"):
            print(f"{PROG}: {text}\nTry \"{PROG} --help\" for more information", file=sys.stderr)
        else:
            print(f"{PROG}: error: {text}", file=sys.stderr)
        return exc.exit_code
    options = parsed.command_line.options
    if options.help:
        sys.stdout.write(USAGE)
        return 0
    if options.parse_only:
        out = {"sbatch": parsed.request.sbatch_json(), "extra": parsed.request.extra,
               "script_args": list(parsed.script_args)}
        if options.json:
            print(json.dumps(out, indent=2, sort_keys=True))
        else:
            for key, value in parsed.request.sbatch_json().items():
                print(f"{key}={'' if value is None else value}")
        return 0
    print(f"{PROG}: error: submission needs a broker; see 'isbatch --help'", file=sys.stderr)
    return 1


def main() -> None:
    sys.exit(run(sys.argv[1:], os.environ))
