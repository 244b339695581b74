"""The Kubernetes backend's watch caches with a week of finished gangs (not a timed test).

No cluster: the Job and pod reflectors are listed from a fake list API holding N finished
gangs (one rank each, finished an hour ago, as most soak jobs) and M running gangs of two ranks,
all as the API server returns them (tests/harness/k8s_gangs.py: the rendered Job with a 3 KB
launcher script, its pods, statuses, managedFields). The broker asks about the M running ones
(`observe(names)`), as the reconciler does for its live attempts. For each N it reports:

- cache: memory of the filled caches (tracemalloc, after the list);
- kept: memory the caches still hold after one observe(names);
- first: the time of that first observe (the branch forgets here);
- steady: the median of the next `--repeat` observes (without tracemalloc).

Base and branch in one run, alternated per N: the base is `--base` (a git ref, default main)
exported to a temporary directory with this file and the harness module copied in, each side
run in a child process of its own. Prints one line per side and N, last:
`k8s_cache: <side> N=<n> cache <MB> MB kept <MB> MB first <ms> ms steady <ms> ms`.

    .venv/bin/python -m bench.k8s_cache [--sizes 0,1000,10000] [--active 50] [--base main]
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HARNESS = "tests/harness/k8s_gangs.py"


def world(finished: int, active: int) -> tuple[list[Any], list[Any], list[str], datetime]:
    from tests.harness.k8s_gangs import gang

    now = datetime.now(UTC).replace(microsecond=0)
    jobs: list[Any] = []
    pods: list[Any] = []
    names: list[str] = []
    for i in range(finished + active):
        running = i >= finished
        job, ps = gang(f"0t{i:014d}", namespace="isthmus", started=now - timedelta(hours=2),
                       finished=None if running else now - timedelta(hours=1),
                       replicas=2 if running else 1)
        jobs.append(job)
        pods.extend(ps)
        if running:
            names.append(job["metadata"]["name"])
    return jobs, pods, names, now


def backend(jobs: list[Any], pods: list[Any], now: datetime) -> Any:
    from backends.k8s import K8sBackend, K8sSettings
    from tests.harness.k8s_gangs import POOL, filled
    from tests.harness.kube_objects import gpu_node

    b = K8sBackend("k8s", [POOL], K8sSettings(), clock=lambda: now)
    b.reflectors = {"jobs": filled("jobs", jobs), "pods": filled("pods", pods),
                    "nodes": filled("nodes", [gpu_node(f"h100-node-{i}", "h100", "r0")
                                              for i in range(2)])}
    return b


def one(finished: int, active: int, repeat: int) -> dict[str, float]:
    """One side, one N: memory (traced) then times (untraced), each on fresh caches."""
    jobs, pods, names, now = world(finished, active)
    backend([], [], now).observe([])  # imports and first-use caches: not the caches' memory
    gc.collect()
    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    b = backend(jobs, pods, now)
    gc.collect()
    cache = tracemalloc.get_traced_memory()[0] - start
    facts = b.observe(names)
    del facts
    gc.collect()
    kept = tracemalloc.get_traced_memory()[0] - start
    tracemalloc.stop()
    del b
    gc.collect()
    b = backend(jobs, pods, now)
    t0 = time.perf_counter()
    facts = b.observe(names)
    first = time.perf_counter() - t0
    assert sum(f.backend_name in set(names) for f in facts) == active, "asked gangs unjudged"
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        b.observe(names)
        times.append(time.perf_counter() - t0)
    return {"cache_mb": cache / 1e6, "kept_mb": kept / 1e6, "first_ms": first * 1e3,
            "steady_ms": statistics.median(times) * 1e3, "facts": len(facts)}


def base_tree(ref: str) -> Path:
    """`ref` exported with this bench and its harness module copied in."""
    tmp = Path(tempfile.mkdtemp(prefix="isthmus-k8s-cache-base-"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
    for rel in ("bench/k8s_cache.py", HARNESS):
        shutil.copy(ROOT / rel, tmp / rel)
    return tmp


def side(tree: Path, finished: int, active: int, repeat: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "bench.k8s_cache", "--child", f"{finished},{active},{repeat}"],
        cwd=tree, check=True, capture_output=True, text=True).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    assert str(result["src"]).startswith(str(tree)), result["src"]  # that side's code
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="0,1000,10000")
    ap.add_argument("--active", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--base", default="main")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        finished, active, repeat = (int(x) for x in args.child.split(","))
        import backends.k8s.adapter as adapter

        print(json.dumps({**one(finished, active, repeat), "src": adapter.__file__}))
        return
    base = base_tree(args.base)
    try:
        lines = []
        for n in (int(x) for x in args.sizes.split(",")):
            for name, tree in (("base", base), ("branch", ROOT)):
                r = side(tree, n, args.active, args.repeat)
                lines.append(f"k8s_cache: {name} N={n} cache {r['cache_mb']:.1f} MB "
                             f"kept {r['kept_mb']:.1f} MB first {r['first_ms']:.0f} ms "
                             f"steady {r['steady_ms']:.1f} ms facts {r['facts']:.0f}")
                print(lines[-1], flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
