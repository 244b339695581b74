"""Job ids: 16 lowercase characters, sortable by creation time, safe in any backend name."""

from __future__ import annotations

import secrets
import time

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, in ASCII order


def new_job_id(now: float | None = None) -> str:
    millis = int((time.time() if now is None else now) * 1000) & ((1 << 48) - 1)
    value = (millis << 32) | secrets.randbits(32)
    chars = []
    for _ in range(16):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def is_job_id(text: str) -> bool:
    return len(text) == 16 and all(c in _ALPHABET for c in text)
