"""What the drop-ins share: the broker connection, the job listing, messages in Slurm's style."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping

from broker.client import ApiError, Client, TransportError
from broker.dropins import client_config
from broker.dropins.jobview import JobView, view


class DropInError(Exception):
    pass


def connect(environ: Mapping[str, str]) -> Client:
    try:
        conf = client_config.load(environ)
    except client_config.ClientConfigError as exc:
        raise DropInError(str(exc)) from exc
    return Client(conf.url, conf.token)


def all_jobs(api: Client, states: list[str] | None = None,
             most: int = 10_000) -> Iterator[JobView]:
    """Every job the caller may see (their team's; all for admins), newest first."""
    cursor = None
    seen = 0
    while seen < most:
        page = api.hpc_jobs(states=states, cursor=cursor)
        for item in page["items"]:
            seen += 1
            yield view(item)
        cursor = page.get("next_cursor")
        if not cursor:
            return


def main_guard(prog: str, body: Callable[[], int]) -> int:
    """Run a drop-in; failures become ``prog: error: ...`` and exit 1, as Slurm's tools do."""
    try:
        return body()
    except DropInError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
    except ApiError as exc:
        print(f"{prog}: error: {exc} (HTTP {exc.status})", file=sys.stderr)
    except TransportError as exc:
        print(f"{prog}: error: cannot reach the Isthmus broker: {exc}", file=sys.stderr)
    return 1
