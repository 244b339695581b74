"""An ASGI middleware that refuses request bodies above the configured size, chunked or not.

The refused body is read to its end (and thrown away, up to DRAIN_MAX bytes) before the 413 is
sent: a server that answers and closes while the client still sends makes the kernel reset the
connection, and the client sees "connection reset" or "broken pipe" instead of the 413 (isbatch
with a 21 MB script did). Beyond DRAIN_MAX the connection is closed at once.
"""

from __future__ import annotations

import json
from typing import Any

from broker.api.problems import PROBLEM_JSON

Scope = dict[str, Any]
Message = dict[str, Any]


DRAIN_MAX = 64 * 1024 * 1024


class BodyTooLarge(Exception):
    pass


async def _drain(receive: Any, seen: int) -> None:
    """Read the rest of a refused body, so the client finishes sending and reads the 413."""
    while seen <= DRAIN_MAX:
        message = await receive()
        if message["type"] != "http.request":
            return  # the client went away
        seen += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


def problem_413(limit: int) -> bytes:
    return json.dumps(
        {
            "type": "urn:isthmus:problem:body-too-large",
            "title": "Request body too large",
            "status": 413,
            "detail": f"the body is larger than {limit} bytes; send a smaller spec "
            "(large scripts belong in a file the job reads, not in the request)",
            "errors": [{"field": "(body)", "message": f"at most {limit} bytes"}],
        }
    ).encode()


class BodyLimit:
    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            if int(declared) <= DRAIN_MAX:
                await _drain(receive, 0)
            await self._refuse(send)
            return
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message: Message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge
            return message

        try:
            await self.app(scope, limited_receive, send)
        except BodyTooLarge:
            await _drain(receive, seen)
            await self._refuse(send)

    async def _refuse(self, send: Any) -> None:
        body = problem_413(self.max_bytes)
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", PROBLEM_JSON.encode()),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
