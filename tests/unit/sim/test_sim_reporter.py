"""The simulator's progress reports (backends/sim/progress.py `Reporter`): sent from several
senders at once, as a gang's pods report in parallel (with one sender sending one request at a
time, the soak at 50 jobs/s had 97% of its reports arrive after their attempts had ended:
409), and their answers counted, so that the soak counts a server error answering a job as one
of its 5xx (bench/soak.py `progress_answers`)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from backends.sim.progress import Report, Reporter
from bench.soak import progress_answers
from broker import logs
from tests.harness.wait import wait_until


@contextmanager
def answering(code_of: Callable[[str], int]) -> Iterator[str]:
    """A progress endpoint on a loopback port (its URL) answering each report with
    `code_of(path)`."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(code_of(self.path))
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_two_reports_are_in_flight_at_once() -> None:
    both = threading.Barrier(2, timeout=10)  # a report is answered only once a second arrives

    def code_of(path: str) -> int:
        try:
            both.wait()
            return 200
        except threading.BrokenBarrierError:
            return 503

    with answering(code_of) as url:
        reporter = Reporter(url, timeout=30)
        reporter.send(Report("job-a", "t", 1, None))
        reporter.send(Report("job-b", "t", 1, None))
        wait_until(lambda: reporter.answers.total() == 2, timeout=30)
        assert reporter.answers == Counter({"2xx": 2})


def test_the_soak_counts_each_5xx_answering_a_report(
    tmp_path: Path, restore_logging: None,
) -> None:
    """The broker's log lines of a process running the simulator, read back by the soak: each
    answer class from the tally, a 5xx from its own line (the soak read the HTTP client's
    request lines before, which the broker's logging no longer prints: it counted none)."""
    codes = {"ok": 200, "ended": 409, "broken": 503}
    log = tmp_path / "c.log"
    with open(log, "w") as stream, answering(lambda p: codes[p.split("/")[3]]) as url:
        logs.configure(stream=stream)
        # one reporter per simulated backend, both in this process
        slurm, k8s = Reporter(url, tally_every=0, name="sim-slurm"), Reporter(
            url, tally_every=0, name="sim-k8s")
        for job in ("ok", "ended", "broken", "ok"):
            slurm.send(Report(job, "t", 1, None))
        k8s.send(Report("ok", "t", 1, None))
        wait_until(lambda: slurm.answers.total() + k8s.answers.total() == 5, timeout=30)
        stream.flush()
    assert slurm.answers == Counter({"2xx": 2, "4xx": 1, "5xx": 1})
    assert progress_answers([log]) == slurm.answers + k8s.answers


def test_a_restarted_process_adds_its_tally_and_untallied_5xx_lines_count(
    tmp_path: Path,
) -> None:
    """Each process's last tally (a log is appended to by a restarted process), and a 5xx
    logged after the last tally still counts."""
    tally = Reporter.TALLY.format
    log = tmp_path / "c.log"
    log.write_text("\n".join([
        "t INFO isthmus.x " + tally(pid=7, name="sim-a", counts={"2xx": 5}),
        "t INFO isthmus.x " + tally(pid=7, name="sim-a", counts={"2xx": 9, "4xx": 1}),
        "t INFO isthmus.x " + tally(pid=8, name="sim-a", counts={"2xx": 3}),
        "t WARNING isthmus.x progress of j1 answered 503: down",
        "t WARNING isthmus.x progress of j2 answered 500: boom",
    ]) + "\n")
    assert progress_answers([log]) == Counter({"2xx": 12, "4xx": 1, "5xx": 2})


def test_a_report_whose_attempt_ended_while_it_waited_is_not_sent() -> None:
    posted: list[str] = []

    def code_of(path: str) -> int:
        posted.append(path.split("/")[3])
        return 200

    with answering(code_of) as url:
        reporter = Reporter(url, senders=1)
        reporter.send(Report("ended", "t", 1, None, running=lambda: False))
        reporter.send(Report("runs", "t", 1, None))
        wait_until(lambda: reporter.answers.total() == 2, timeout=30)
    assert posted == ["runs"] and reporter.answers == Counter({"2xx": 1, "ended": 1})


def test_a_process_that_exits_logs_its_final_tally(tmp_path: Path) -> None:
    """The last tally read by the soak is the final count of a process that stopped (SIGTERM,
    the end of a soak), not the one up to 30 s older: it is logged at exit."""
    import subprocess
    import sys

    from tests.harness.server import free_port

    script = (
        "import time\n"
        "from backends.sim.progress import Report, Reporter\n"
        "from broker import logs\n"
        "logs.configure()\n"
        f"r = Reporter('http://127.0.0.1:{free_port()}', name='sim-x')\n"
        "r.send(Report('job-a', 't', 1, None))\n"
        "deadline = time.monotonic() + 30\n"
        "while not r.idle() and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
    )
    log = tmp_path / "x.log"
    with open(log, "w") as out:
        subprocess.run([sys.executable, "-c", script], stdout=out, stderr=out, check=True,
                       timeout=60, cwd=Path(__file__).resolve().parents[3])
    assert progress_answers([log]) == Counter({"unreachable": 1}), log.read_text()


def test_a_report_pushed_out_of_a_full_queue_is_counted_as_dropped() -> None:
    """The answers and the drops add up to the reports the jobs offered, so the soak can say
    how much of its progress load was sent."""
    arrived, release = threading.Event(), threading.Event()

    def code_of(path: str) -> int:
        arrived.set()
        release.wait(timeout=30)
        return 200

    with answering(code_of) as url:
        reporter = Reporter(url, capacity=1, senders=1)
        reporter.send(Report("first", "t", 1, None))
        assert arrived.wait(timeout=30)  # the one sender is busy with it
        reporter.send(Report("pushed-out", "t", 1, None))
        reporter.send(Report("last", "t", 1, None))
        release.set()
        wait_until(reporter.idle, timeout=30)
    assert reporter.answers == Counter({"2xx": 2, "dropped": 1})


def test_a_kept_alive_connection_the_server_closed_is_replaced_and_the_report_sent_once() -> None:
    """A sender keeps its connection between reports; a server that closed it meanwhile (an
    API replica restarted, an idle timeout) costs the next report nothing: it is sent again,
    once, on a new connection, not counted as unreachable."""
    received: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # the client keeps the connection

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            received.append(self.path.split("/")[3])
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
            self.close_connection = True  # without saying so: the client finds out next time

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        reporter = Reporter(f"http://127.0.0.1:{server.server_address[1]}", senders=1)
        reporter.send(Report("first", "t", 1, None))
        wait_until(lambda: reporter.answers.total() == 1, timeout=30)
        reporter.send(Report("second", "t", 2, None))
        wait_until(lambda: reporter.answers.total() == 2, timeout=30)
    finally:
        server.shutdown()
        server.server_close()
    assert reporter.answers == Counter({"2xx": 2}) and received == ["first", "second"]
