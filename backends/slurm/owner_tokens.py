"""Short-lived slurmrestd tokens for job owners (submit_as_owner over the REST transport).

slurmrestd with auth/jwt accepts a token per request (``X-SLURM-USER-NAME`` /
``X-SLURM-USER-TOKEN``). A holder of the cluster's HS256 key (slurm.conf ``AuthAltParameters
jwt_key=``) can sign one for any user, which is what ``scontrol token username=U`` does for
SlurmUser and root: claims ``sun`` (the user name), ``iat`` and ``exp``. The broker signs one per
request, for the job's owner only, valid for ``lifespan_s`` seconds.

The key lets its holder act as any Slurm user: it is read from a file that only its owner may
read, kept in memory, and never logged or shown (``repr`` hides it). Tokens are signed only for
users the OwnerPolicy allows (never root, SlurmUser or another system account: see
owner_policy).
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable

import jwt

from backends.slurm.owner_policy import OwnerPolicy, OwnerRefused

MIN_KEY_BYTES = 32  # HS256 wants a key at least as long as its hash
MAX_KEY_BYTES = 4096
MIN_LIFESPAN_S = 10
MAX_LIFESPAN_S = 900


class OwnerTokenError(ValueError):
    """No token can be signed: an unusable key file, or a user name that may not get one."""


def read_key(path: str) -> bytes:
    """The key file's bytes; refused when others may read it, or when its size is unlikely."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise OwnerTokenError(f"rest_jwt_key_file: cannot open {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OwnerTokenError(f"rest_jwt_key_file: {path} is not a regular file")
        if st.st_mode & 0o077:
            raise OwnerTokenError(
                f"rest_jwt_key_file: {path} is mode {stat.S_IMODE(st.st_mode):o}; the key lets "
                "its holder act as any Slurm user, so only its owner may read it (chmod 600)")
        key = os.read(fd, MAX_KEY_BYTES + 1)
    finally:
        os.close(fd)
    if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
        raise OwnerTokenError(f"rest_jwt_key_file: {path} holds {len(key)} bytes; expected "
                              f"{MIN_KEY_BYTES} to {MAX_KEY_BYTES}")
    return key


class OwnerTokens:
    """Signs per-owner slurmrestd headers with the cluster's JWT key."""

    __slots__ = ("_clock", "_key", "lifespan_s", "policy")

    def __init__(self, key: bytes, lifespan_s: int,
                 clock: Callable[[], float] = time.time,
                 policy: OwnerPolicy | None = None) -> None:
        if not MIN_LIFESPAN_S <= lifespan_s <= MAX_LIFESPAN_S:
            raise OwnerTokenError(f"owner token lifespan {lifespan_s} s is outside "
                                  f"{MIN_LIFESPAN_S}-{MAX_LIFESPAN_S} s")
        self._key = key
        self.lifespan_s = lifespan_s
        self._clock = clock
        self.policy = policy or OwnerPolicy()

    @classmethod
    def from_file(cls, path: str, lifespan_s: int,
                  policy: OwnerPolicy | None = None) -> OwnerTokens:
        return cls(read_key(path), lifespan_s, policy=policy)

    def __repr__(self) -> str:
        return f"OwnerTokens(key=<hidden>, lifespan_s={self.lifespan_s})"

    def headers(self, user: str) -> dict[str, str]:
        """Request headers that act as `user` for the next `lifespan_s` seconds."""
        try:
            self.policy.check_local(user)
        except OwnerRefused as exc:
            raise OwnerTokenError(str(exc)) from None
        now = int(self._clock())
        token = jwt.encode({"sun": user, "iat": now, "exp": now + self.lifespan_s},
                           self._key, algorithm="HS256")
        return {"X-SLURM-USER-NAME": user, "X-SLURM-USER-TOKEN": token}
