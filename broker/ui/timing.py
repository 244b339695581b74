"""Server-Timing on dashboard pages: how long the server took, measured in the server.

`Server-Timing: app;dur=<ms>` is the wall time from the request entering the application
(before authentication and every other middleware) to its response's headers; a page is
rendered whole before its headers leave, so that is the page's server time. Browsers show it
in their developer tools; bench/ui.py reports it next to the time its client waited.
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class ServerTiming:
    """ASGI middleware adding Server-Timing to the responses under `prefix`."""

    def __init__(self, app: ASGIApp, prefix: str = "/ui") -> None:
        self.app, self.prefix = app, prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not str(scope.get("path", "")).startswith(self.prefix):
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()

        async def timed(message: Message) -> None:
            if message["type"] == "http.response.start":
                took = (time.perf_counter() - began) * 1000
                headers = [*message.get("headers", []),
                           (b"server-timing", f"app;dur={took:.2f}".encode())]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, timed)
