"""When a waiting job's new reason message is news, and when it only moved its figures.

A waiting reason's message carries live figures ("team a uses 18 of 20 nominal h100 GPUs ...;
cohort c has 3 h100 GPUs left to lend, short by 2"), which move nearly every admission cycle
while the job waits for the same thing. Writing each move would rewrite the job's row and
append an event for every waiting job in every cycle (6,400 of them a cycle under Kueue's
scheduler performance test). So a message is news when its reason code changed, or when its
wording did (a different clause, pool, flavor or limit) and the stored message is at least
WORDING_EVERY_S old; when only its figures did, once the stored message is FIGURES_EVERY_S
old. The figures stored are those of the time the message was written.

Why the wording waits: a clause can follow the figures too (a team whose use swings around
its nominal quota flips between "within nominal, but cohort ... has lent out" and "that
borrows ... above nominal"), and under Kueue's test those flips were most of the rewrites.

A figure is a number standing alone (`18`, `0.5`, `(3 left)`), not one inside a name
(`a100-80g`, `pool-2`, `team1`) or a date (`2026-12-05`): names and dates are wording.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

WORDING_EVERY_S = 60.0
"""A message whose wording alone changed is written at most this often per job."""
FIGURES_EVERY_S = 300.0
"""A message whose figures alone moved is written again once the stored one is this old, so
the figures a user reads are never older than this (a waiting job costs one write in five
minutes, not one a cycle)."""

_FIGURE = re.compile(r"(?<![\w.:-])\d+(?:\.\d+)?(?![\w.:-]*\w)")
"""A number not joined to letters, digits, '.', ':' or '-' on the left, nor followed by a
word character after any run of those on the right (so `80g`, `12-05`, `10:00` stay)."""


def wording(message: str) -> str:
    """The message with its figures replaced by `#`."""
    return _FIGURE.sub("#", message)


def is_news(stored_reason: str, stored_message: str, stored_at: datetime, reason: str,
            message: str, now: datetime) -> bool:
    """Whether a waiting job stored with (`stored_reason`, `stored_message`) at `stored_at`
    must be written again to say (`reason`, `message`) at `now`."""
    if stored_reason != reason:
        return True
    if stored_message == message:
        return False
    age = now - stored_at
    if wording(stored_message) == wording(message):
        return age >= timedelta(seconds=FIGURES_EVERY_S)
    return age >= timedelta(seconds=WORDING_EVERY_S)
