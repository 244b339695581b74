"""The simulator's progress reports go out from several senders at once, as a gang's pods
report in parallel: with one sender sending one request at a time, the soak at 50 jobs/s had
97% of its reports arrive after their attempts had ended (409)."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from backends.sim.progress import Report, Reporter
from tests.harness.wait import wait_until


def test_two_reports_are_in_flight_at_once() -> None:
    both = threading.Barrier(2, timeout=10)  # a report is answered only once a second arrives

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            try:
                both.wait()
                code = 200
            except threading.BrokenBarrierError:
                code = 503
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        reporter = Reporter(f"http://127.0.0.1:{server.server_address[1]}", timeout=30)
        reporter.send(Report("job-a", "t", 1, None))
        reporter.send(Report("job-b", "t", 1, None))
        wait_until(lambda: reporter.sent + reporter.refused == 2, timeout=30)
        assert (reporter.sent, reporter.refused) == (2, 0)
    finally:
        server.shutdown()
