"""Benchmark: how `isbatch` reads a script's #SBATCH lines as their number grows.

Times `isbatch --parse-only SCRIPT` (the console script, as a user runs it) for scripts of
1,000 and 10,000 `#SBATCH --comment=...` lines, median of N runs each. Reading is linear when
the ratio is about 10 (argparse in one call made it quadratic: 13 s for 10,000 lines).

    .venv/bin/python -m bench.isbatch_directives [--runs 5]

Last line: ``isbatch-directives: 1000 lines <a> s 10000 lines <b> s ratio <b/a>``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _script(path: Path, lines: int) -> Path:
    body = "".join(f"#SBATCH --comment=c{i}\n" for i in range(lines))
    path.write_text(f"#!/bin/bash\n#SBATCH --gres=gpu:1\n{body}srun python train.py\n")
    return path


def _median_s(isbatch: str, script: Path, runs: int) -> float:
    took = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([isbatch, "--parse-only", str(script)], check=True,
                       stdout=subprocess.DEVNULL)
        took.append(time.perf_counter() - start)
    return statistics.median(took)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    isbatch = str(Path(sys.executable).parent / "isbatch")
    with tempfile.TemporaryDirectory(prefix="isbatch-directives-") as tmp:
        small = _median_s(isbatch, _script(Path(tmp) / "a.sh", 1_000), args.runs)
        large = _median_s(isbatch, _script(Path(tmp) / "b.sh", 10_000), args.runs)
    print(f"isbatch-directives: 1000 lines {small:.2f} s 10000 lines {large:.2f} s "
          f"ratio {large / small:.1f}")


if __name__ == "__main__":
    main()
