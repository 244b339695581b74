"""Where the drop-ins find the broker and the user's token.

``ISTHMUS_URL`` and ``ISTHMUS_TOKEN`` first; otherwise ``~/.config/isthmus/client.yaml``
(``$XDG_CONFIG_HOME`` honoured) with ``url:`` and ``token:``. A file holding a token must be
readable by its owner only, as ssh insists for keys.
"""

from __future__ import annotations

import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_URL = "http://127.0.0.1:8080"


class ClientConfigError(Exception):
    pass


@dataclass(frozen=True)
class ClientConfig:
    url: str
    token: str | None


def config_path(environ: Mapping[str, str]) -> Path:
    base = environ.get("XDG_CONFIG_HOME") or str(Path(environ.get("HOME", "~")) / ".config")
    return Path(base).expanduser() / "isthmus" / "client.yaml"


def load(environ: Mapping[str, str]) -> ClientConfig:
    url = environ.get("ISTHMUS_URL")
    token = environ.get("ISTHMUS_TOKEN")
    path = config_path(environ)
    if (url is None or token is None) and path.is_file():
        import yaml  # only here: isbatch's start-up is part of every submission's latency

        try:
            data = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ClientConfigError(f"{path}: cannot read it ({exc})") from exc
        if not isinstance(data, dict) or set(data) - {"url", "token"}:
            raise ClientConfigError(f"{path}: expected a mapping with 'url' and 'token' only")
        if data.get("token") and path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ClientConfigError(
                f"{path} holds a token and others may read it: chmod 600 {path}"
            )
        url = url or data.get("url")
        token = token or data.get("token")
    return ClientConfig(url=str(url or DEFAULT_URL), token=token)
