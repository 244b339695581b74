"""Tokens signed for job owners (submit_as_owner over slurmrestd): what they claim, for whom
they are refused, and how the key file must be kept (pure, no cluster)."""

from __future__ import annotations

from pathlib import Path

import jwt
import pytest

from backends.base import SettingsError
from backends.slurm.owner_policy import OwnerPolicy
from backends.slurm.owner_tokens import OwnerTokenError, OwnerTokens, read_key
from backends.slurm.settings import SlurmSettings

KEY = b"k" * 32


def test_a_token_names_the_owner_and_lives_only_its_lifespan() -> None:
    tokens = OwnerTokens(KEY, 60, clock=lambda: 1_000_000.0,
                         policy=OwnerPolicy(lookup=lambda user: 1001))
    headers = tokens.headers("alice")
    assert headers["X-SLURM-USER-NAME"] == "alice"
    claims = jwt.decode(headers["X-SLURM-USER-TOKEN"], KEY, algorithms=["HS256"],
                        options={"verify_exp": False})
    assert claims == {"sun": "alice", "iat": 1_000_000, "exp": 1_000_060}


@pytest.mark.parametrize("user", ["root", "Alice; rm -rf /", "", "a" * 40])
def test_no_token_for_root_or_for_what_is_not_a_unix_user_name(user: str) -> None:
    with pytest.raises(OwnerTokenError):
        OwnerTokens(KEY, 60).headers(user)


def test_the_key_never_shows() -> None:
    assert "k" * 8 not in repr(OwnerTokens(KEY, 60))


def test_the_key_file_must_be_private_and_of_a_sane_size(tmp_path: Path) -> None:
    path = tmp_path / "jwt.key"
    path.write_bytes(KEY)
    path.chmod(0o644)
    with pytest.raises(OwnerTokenError, match="only its owner may read it"):
        read_key(str(path))
    path.chmod(0o600)
    assert read_key(str(path)) == KEY
    path.write_bytes(b"short")
    with pytest.raises(OwnerTokenError, match="5 bytes"):
        read_key(str(path))
    with pytest.raises(OwnerTokenError, match="cannot open"):
        read_key(str(tmp_path / "missing"))


def test_settings_rest_as_owner_needs_a_key_file_and_a_short_lifespan() -> None:
    base = {"transport": "rest", "rest_url": "http://slurmrestd:6820", "submit_as_owner": True}
    with pytest.raises(SettingsError, match="rest_jwt_key_file"):
        SlurmSettings.from_dict(base)
    with pytest.raises(SettingsError, match="owner_token_lifespan_s"):
        SlurmSettings.from_dict({**base, "rest_jwt_key_file": "/etc/slurm/jwt.key",
                                 "owner_token_lifespan_s": 86400})
    with pytest.raises(SettingsError, match="absolute"):
        SlurmSettings.from_dict({**base, "rest_jwt_key_file": "jwt.key"})
    ok = SlurmSettings.from_dict({**base, "rest_jwt_key_file": "/etc/slurm/jwt.key"})
    assert ok.owner_token_lifespan_s == 60
