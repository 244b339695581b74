"""Where notices land in tests: a local webhook receiver (Python's http.server) and a local
SMTP server (aiosmtpd), each started for one test (fixtures `receiver` and `mailbox` in
tests/integration/control/conftest.py)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email import message_from_bytes
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from aiosmtpd.controller import Controller


@dataclass
class Receiver:
    """A local webhook receiver: answers 500 to the first `fail_first` calls (all of them
    with `always_fail`), 204 after; keeps what it accepted."""

    fail_first: int = 0
    always_fail: bool = False
    calls: int = 0
    accepted: list[tuple[dict[str, Any], dict[str, str], bytes]] = field(default_factory=list)
    url: str = ""

    def kinds(self) -> list[str]:
        return [body["kind"] for body, _, _ in self.accepted]


@contextmanager
def webhook_receiver() -> Iterator[Receiver]:
    got = Receiver()
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers["Content-Length"]))
            with lock:
                got.calls += 1
                failing = got.always_fail or got.calls <= got.fail_first
                if not failing:
                    got.accepted.append((json.loads(raw), dict(self.headers), raw))
            self.send_response(500 if failing else 204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    got.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/isthmus?token=abc"
    try:
        yield got
    finally:
        server.shutdown()
        server.server_close()


class Mailbox:
    def __init__(self) -> None:
        self.messages: list[Any] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append((envelope.rcpt_tos, message_from_bytes(envelope.content)))
        return "250 OK"

    def kinds(self) -> list[str]:
        texts = [m.get_payload(decode=True).decode() for _, m in self.messages]
        return [json.loads(t[t.index("{"):])["kind"] for t in texts]


@contextmanager
def smtp_mailbox() -> Iterator[tuple[Mailbox, int]]:
    box = Mailbox()
    with socket.socket() as probe:  # aiosmtpd's start-up check cannot use port 0
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    controller = Controller(box, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield box, port
    finally:
        controller.stop()
