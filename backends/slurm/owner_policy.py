"""Which Unix users the broker may submit a job as (submit_as_owner), checked by both transports.

A job's owner is named by its API user (the OIDC user claim or a static token's name), so the
name is a user's choice: it may never be one of the cluster's own accounts. Refused, like
sudo's and Slurm's own guards would:

- root, ``slurm``, ``nobody``, the cluster's SlurmUser and SlurmdUser (read from ``scontrol show
  config`` over the CLI, from ``slurm_conf`` over REST when it is set) and ``denied_owners``;
- a uid below ``min_owner_uid`` (default 1000, login.defs' UID_MIN) or in the bands that
  Debian and systemd reserve for system accounts (60000-65535: slurm is 64030 on Debian,
  nobody 65534; and 4294967294-4294967295);
- a name the broker's host does not know, unless ``unix_users`` maps an API user to it (the
  admin vouches for it): the cluster's uid is only known once Slurm has queued the job.

Over REST the job's ``user_id`` on the cluster is checked again after submit, by the same rules.
"""

from __future__ import annotations

import pwd
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

DEFAULT_MIN_UID = 1000
MIN_MIN_UID = 1  # uid 0 is never allowed
MAX_MIN_UID = 60000
RESERVED_UIDS = ((60000, 65535), (4294967294, 4294967295))  # Debian policy 9.2.2, systemd
ALWAYS_DENIED = frozenset({"root", "slurm", "nobody"})
UNIX_USER = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")
_CONFIG_USER = re.compile(r"^\s*(SlurmUser|SlurmdUser)\s*=\s*([^\s(#]+)(?:\((\d+)\))?",
                          re.IGNORECASE | re.MULTILINE)


class OwnerRefused(ValueError):
    """The broker may not submit a job as this user; the message says why (never a secret)."""


def local_uid(user: str) -> int | None:
    """The uid of `user` on the broker's host, or None when it is unknown here."""
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return None


def cluster_accounts(config_text: str) -> tuple[set[str], set[int]]:
    """SlurmUser and SlurmdUser (names, and uids when shown) from slurm.conf or
    `scontrol show config` output ("SlurmUser = slurm(64030)")."""
    names: set[str] = set()
    uids: set[int] = set()
    for _key, name, uid in _CONFIG_USER.findall(config_text):
        names.add(name)
        if uid:
            uids.add(int(uid))
    return names, uids


@dataclass(frozen=True, slots=True)
class OwnerPolicy:
    min_uid: int = DEFAULT_MIN_UID
    denied: frozenset[str] = ALWAYS_DENIED
    denied_uids: frozenset[int] = frozenset({0})
    vouched: frozenset[str] = frozenset()  # unix_users' values: names the admin mapped
    lookup: Callable[[str], int | None] = field(default=local_uid, compare=False)

    @classmethod
    def of(cls, min_uid: int = DEFAULT_MIN_UID, denied: Iterable[str] = (),
           vouched: Iterable[str] = ()) -> OwnerPolicy:
        return cls(min_uid=min_uid, denied=ALWAYS_DENIED | frozenset(denied),
                   vouched=frozenset(vouched))

    def with_cluster_accounts(self, names: Iterable[str], uids: Iterable[int]) -> OwnerPolicy:
        return replace(self, denied=self.denied | frozenset(names),
                       denied_uids=self.denied_uids | frozenset(uids))

    def uid_problem(self, user: str, uid: int) -> str | None:
        """Why `user` with `uid` may not own a job, or None."""
        if uid in self.denied_uids:
            return f"owner '{user}' is denied (uid {uid} is root or the cluster's SlurmUser)"
        if uid < self.min_uid:
            return (f"owner '{user}' is a system account "
                    f"(uid {uid} < min_owner_uid {self.min_uid})")
        for low, high in RESERVED_UIDS:
            if low <= uid <= high:
                return (f"owner '{user}' is a system account (uid {uid} is in the range "
                        f"{low}-{high} reserved for system accounts)")
        return None

    def check_name(self, user: str) -> None:
        if not UNIX_USER.match(user):
            raise OwnerRefused(f"'{user}' is not a Unix user name to submit the job as")
        if user in self.denied:
            raise OwnerRefused(f"owner '{user}' is a system account that may not own jobs "
                               "(root, slurm, nobody, the cluster's SlurmUser and SlurmdUser "
                               "and the backend setting denied_owners)")

    def check_local(self, user: str) -> int | None:
        """Before anything is signed or run: refuses a denied name, a system account of this
        host, and a name unknown here that no admin mapped. Returns the local uid if known."""
        self.check_name(user)
        uid = self.lookup(user)
        if uid is None:
            if user in self.vouched:
                return None  # the cluster's uid is checked after submit
            raise OwnerRefused(f"no Unix user '{user}' on the broker's host to submit the job "
                               "as (map it with the backend setting unix_users to allow it)")
        problem = self.uid_problem(user, uid)
        if problem:
            raise OwnerRefused(problem)
        return uid

    def check_cluster(self, user: str, uid: object) -> str | None:
        """Why the job Slurm queued for `user` with `uid` may not stay, or None."""
        if not isinstance(uid, int) or isinstance(uid, bool):
            return f"Slurm did not report the uid of owner '{user}'"
        return self.uid_problem(user, uid)
