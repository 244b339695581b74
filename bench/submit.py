"""Durable submissions through the real HTTP API (issue 2 benchmark; not a timed test).

Starts `isthmus server` as its own process on SQLite (synchronous=FULL: each submit is on disk
before the 201) and on PostgreSQL (a throwaway server started here, fsync on), then measures
1) closed-loop throughput with C concurrent keep-alive connections, and
2) latency percentiles at a fixed offered load (open loop, default 500 submits/s).
The client is raw asyncio on keep-alive sockets so it costs the server little CPU.
Side by side in the same run, the limit of this stack: the same server answering the same
requests without storing them (bench/submit_limit.py); both are measured in alternation
(`--rounds`, best round of each kept) so that the busy machine's moods hit both alike.
Prints one line per backend: `submit: <backend> <N> jobs <R> submits/s p99 <L> ms` and
`submit limit: <backend> durable <R> no-store <S> ratio <X>`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
SPEC = json.loads((ROOT / "examples" / "jobs" / "llama-ft.json").read_text())


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_KEYS = itertools.count()


def _requests(port: int, keyed: bool) -> Callable[[], bytes]:
    """The submit request; `keyed`: each with an Idempotency-Key of its own (as a client that
    retries safely sends), so the server looks every key up before it stores."""
    body = json.dumps(SPEC).encode()
    head = (
        f"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
    ).encode()
    if not keyed:
        plain = head + b"\r\n" + body
        return lambda: plain
    return lambda: head + f"Idempotency-Key: bench-{next(_KEYS)}\r\n\r\n".encode() + body


async def _one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, req: bytes) -> int:
    writer.write(req)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    await reader.readexactly(length)
    return status


async def closed_loop(
    port: int, total: int, conns: int, keyed: bool = False
) -> tuple[float, list[float]]:
    req = _requests(port, keyed)
    latencies: list[float] = []
    remaining = total

    async def worker() -> None:
        nonlocal remaining
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while remaining > 0:
            remaining -= 1
            t0 = time.perf_counter()
            status = await _one(reader, writer, req())
            latencies.append(time.perf_counter() - t0)
            if status != 201:
                raise RuntimeError(f"submit answered {status}")
        writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(conns)))
    return total / (time.perf_counter() - t0), latencies


async def open_loop(
    port: int, rate: float, seconds: float, conns: int, keyed: bool = False
) -> list[float]:
    """Send at a fixed rate regardless of answers; latency counts from the scheduled time."""
    req = _requests(port, keyed)
    pool: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()
    for _ in range(conns):
        pool.put_nowait(await asyncio.open_connection("127.0.0.1", port))
    latencies: list[float] = []
    start = time.perf_counter()
    n = int(rate * seconds)

    async def fire(i: int) -> None:
        due = start + i / rate
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        conn = await pool.get()
        try:
            status = await _one(*conn, req())
        finally:
            pool.put_nowait(conn)
        latencies.append(time.perf_counter() - due)
        if status != 201:
            raise RuntimeError(f"submit answered {status}")

    await asyncio.gather(*(fire(i) for i in range(n)))
    return latencies


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * p / 100))] * 1000


def start_server(db_url: str, port: int, limit: bool = False,
                 workers: int = 1) -> subprocess.Popen[bytes]:
    config = str(ROOT / "examples" / "isthmus.yaml")
    cmd = ([sys.executable, "-m", "bench.submit_limit", config, db_url, str(port), str(workers)]
           if limit else
           [sys.executable, "-m", "broker.cli.main", "server", "--config", config,
            "--db", db_url, "--port", str(port), "--no-control", "--workers", str(workers)])
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).raise_for_status()
            if workers > 1:
                # the first worker answers; the others start alike within seconds, and the
                # client's keep-alive connections are spread over the workers that accept
                time.sleep(5)
            return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("server did not start")


class Postgres:
    def __init__(self) -> None:
        bindir = sorted(Path("/usr/lib/postgresql").glob("*/bin"))[-1]
        self.base = Path(tempfile.mkdtemp(prefix="isthmus-bench-pg-"))
        run_as: list[str] = []
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.base, pw.pw_uid, pw.pw_gid)
            runuser = shutil.which("runuser", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
            run_as = [runuser or "runuser", "-u", "postgres", "--"]
        data = self.base / "data"
        subprocess.run([*run_as, str(bindir / "initdb"), "-D", str(data), "-A", "trust",
                        "-U", "isthmus"], check=True, capture_output=True)
        self.port = _port()
        self.proc = subprocess.Popen(
            [*run_as, str(bindir / "postgres"), "-D", str(data), "-h", "127.0.0.1",
             "-p", str(self.port), "-k", str(self.base)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        time.sleep(2)
        subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "isthmus",
                        "-d", "postgres", "-qc", "CREATE DATABASE bench"], check=True)
        self.url = f"postgresql://isthmus@127.0.0.1:{self.port}/bench"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()
        shutil.rmtree(self.base, ignore_errors=True)


@dataclass
class Run:
    rate: float
    closed: list[float]
    opened: list[float]


def _measure(db_url: str, args: argparse.Namespace, limit: bool) -> Run:
    port = _port()
    server = start_server(db_url, port, limit, args.workers)
    try:
        asyncio.run(closed_loop(port, 300, args.conns, args.keys))  # warm-up
        rate, closed = asyncio.run(closed_loop(port, args.jobs, args.conns, args.keys))
        opened = asyncio.run(
            open_loop(port, args.rate, args.seconds, args.conns * 4, args.keys))
    finally:
        server.terminate()
        server.wait()
    return Run(rate, closed, opened)


def _line(label: str, r: Run, args: argparse.Namespace) -> str:
    return (f"  {label}: closed loop {args.conns} conns: {r.rate:.0f} submits/s, "
            f"p50 {pct(r.closed, 50):.1f} ms p99 {pct(r.closed, 99):.1f} ms; "
            f"open loop {args.rate}/s for {args.seconds}s: p50 {pct(r.opened, 50):.1f} ms "
            f"p99 {pct(r.opened, 99):.1f} ms")


def bench(label: str, db_url: str, args: argparse.Namespace) -> None:
    durable: list[Run] = []
    limit: list[Run] = []
    for i in range(args.rounds):
        durable.append(_measure(db_url, args, limit=False))
        print(_line(f"{label} durable (round {i + 1})", durable[-1], args))
        if not args.no_limit:
            limit.append(_measure(db_url, args, limit=True))
            print(_line(f"{label} no-store (round {i + 1})", limit[-1], args))
    best = max(durable, key=lambda r: r.rate)
    print(f"submit: {label} {args.jobs} jobs {best.rate:.0f} submits/s "
          f"p99 {pct(best.opened, 99):.1f} ms")
    if limit:
        top = max(limit, key=lambda r: r.rate)
        print(f"submit limit: {label} durable {best.rate:.0f} no-store {top.rate:.0f} "
              f"ratio {best.rate / top.rate:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--conns", type=int, default=16)
    ap.add_argument("--rate", type=float, default=500)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-limit", action="store_true", help="skip the no-store side")
    ap.add_argument("--keys", action="store_true",
                    help="every submit with an Idempotency-Key of its own")
    ap.add_argument("--workers", type=int, default=1,
                    help="server worker processes, both sides (PostgreSQL only)")
    args = ap.parse_args()
    if args.backend in ("sqlite", "both"):
        tmp = Path(tempfile.mkdtemp(prefix="isthmus-bench-"))
        bench("sqlite", f"sqlite:///{tmp / 'bench.db'}", args)
        shutil.rmtree(tmp, ignore_errors=True)
    if args.backend in ("postgres", "both"):
        pg = Postgres()
        try:
            label = "postgres" if args.workers == 1 else f"postgres-{args.workers}-workers"
            bench(label, pg.url, args)
        finally:
            pg.stop()


if __name__ == "__main__":
    main()
