"""Delivery of notices: a pass of the leader's control loop (every `notices.interval`).

Steps of a pass:
1. expand: for each notice not yet expanded (oldest first, at most `notices.batch`), resolve
   its targets from the configuration (the team's `teams[].notices`, the job's `notify:`;
   mail only when `notices.smtp` is set; a job's webhook only to a host
   `notices.job_webhook_hosts` allows) and write one pending delivery per target, in one
   transaction with marking the notice expanded (so a notice is expanded once);
2. send: each due pending delivery (at most `notices.batch`), outside any transaction (a slow
   receiver holds no lock), then record its outcome in a transaction of its own: delivered;
   or failed, tried again after `retry_delay`; or dead once `notices.max_attempts` are spent.

Delivery is at least once: a crash between a receiver's answer and the commit that records it
sends that notice again on the next pass. Every body carries `notice_id` (and the header
`X-Isthmus-Notice`) so a receiver can drop a repeat. URLs are logged by scheme and host only,
and the signing secret and SMTP password only ever come from the environment.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import smtplib
from datetime import timedelta
from email.message import EmailMessage
from typing import Any

import httpx

from broker.config import IsthmusConfig, Notices
from broker.control.plane import ControlPlane
from broker.domain.notices import (
    JobNotify,
    NoticeKind,
    failure_category,
    redacted,
    retry_delay,
    webhook_host,
)
from broker.logs import get_logger
from broker.store import notices as store

log = get_logger(__name__)

SIGNATURE_HEADER = "X-Isthmus-Signature"
NOTICE_HEADER = "X-Isthmus-Notice"


class DeliveryError(Exception):
    """A try that failed; its message (bounded, no secrets) is stored as the last error."""


def run_notices(plane: ControlPlane) -> int:
    """One pass: expand new notices, send the due deliveries. Returns deliveries sent."""
    cfg = plane.config.notices
    now = plane.clock()
    with plane.db.read() as s:  # most passes find nothing: no write transaction for them
        new, due = store.has_unexpanded(s), store.due(s, now, cfg.batch)
    if new:
        with plane.db.write() as s:
            for notice in store.unexpanded(s, cfg.batch):
                store.expand(s, notice.id, targets(plane.config, notice), now)
            due = store.due(s, now, cfg.batch)
    if not due:
        return 0
    # One client a pass: building one (its TLS context) cost more than a local delivery.
    with httpx.Client(timeout=cfg.timeout, follow_redirects=False) as http:
        return _send_due(plane, cfg, http, due)


def _send_due(plane: ControlPlane, cfg: Notices, http: httpx.Client,
              due: list[tuple[store.Delivery, store.Notice]]) -> int:
    sent = 0
    for delivery, notice in due:
        try:
            try:
                send(cfg, http, delivery.channel, delivery.target, notice)
            except DeliveryError:
                raise
            except Exception as exc:  # a bug must not stop the deliveries behind this one
                log.exception("notice %s: delivery failed unexpectedly", notice.key)
                raise DeliveryError(f"internal error: {type(exc).__name__}") from None
        except DeliveryError as exc:
            tries = delivery.attempts + 1
            dead = tries >= cfg.max_attempts
            wait = retry_delay(tries, cfg.backoff, cfg.max_backoff)
            log.log(30 if dead else 20, "notice %s (%s) to %s failed (try %d of %d)%s: %s",
                    notice.key, notice.kind, _shown(delivery.channel, delivery.target), tries,
                    cfg.max_attempts, "; dead" if dead else f"; again in {wait:.1f}s", exc)
            with plane.db.write() as s:
                store.record(s, delivery.id, status=store.DEAD if dead else store.PENDING,
                             attempts=tries, next_try_at=plane.clock() + timedelta(seconds=wait),
                             error=str(exc), delivered_at=None)
            continue
        sent += 1
        with plane.db.write() as s:
            store.record(s, delivery.id, status=store.DELIVERED, attempts=delivery.attempts + 1,
                         next_try_at=delivery.next_try_at, error="", delivered_at=plane.clock())
    return sent


def targets(config: IsthmusConfig, notice: store.Notice) -> list[tuple[str, str]]:
    """(channel, target) pairs subscribed to this notice, from the configuration now."""
    try:
        kind = NoticeKind(notice.kind)
    except ValueError:  # written by a newer version: nobody here subscribes to it
        return []
    out: list[tuple[str, str]] = []
    team = config.team(notice.team)
    mail = config.notices.smtp is not None
    if team is not None and team.notices is not None and team.notices.wants(kind):
        out += [(store.WEBHOOK, u) for u in team.notices.webhooks]
        out += [(store.EMAIL, a) for a in team.notices.emails if mail]
    own = _job_notify(notice.spec_json)
    if own is not None and own.wants(kind):
        allowed = {h.lower() for h in config.notices.job_webhook_hosts}
        out += [(store.WEBHOOK, u) for u in own.webhooks if webhook_host(u) in allowed]
        out += [(store.EMAIL, a) for a in own.emails if mail]
    return out


def _job_notify(spec_json: str | None) -> JobNotify | None:
    if not spec_json or '"notify":{' not in spec_json:
        return None
    try:
        data = json.loads(spec_json).get("notify")
        return JobNotify.model_validate(data) if data else None
    except ValueError:  # a stored spec that no longer parses tells nobody
        return None


def body(notice: store.Notice) -> dict[str, Any]:
    """The JSON a webhook receives (and a mail carries)."""
    out: dict[str, Any] = {
        "notice_id": notice.key, "kind": notice.kind, "time": notice.at.isoformat(),
        "team": notice.team, "job_id": notice.job_id, "job_number": notice.job_number,
        "job_name": notice.job_name, "state": notice.state, "reason": notice.reason,
        "message": notice.message, **notice.details,
    }
    if notice.kind == NoticeKind.failed:
        out["failure_category"] = failure_category(notice.failure, notice.reason or "")
    return out


def send(cfg: Notices, http: httpx.Client, channel: str, target: str,
         notice: store.Notice) -> None:
    if channel == store.WEBHOOK:
        _post(cfg, http, target, notice)
    elif channel == store.EMAIL:
        _mail(cfg, target, notice)
    else:
        raise DeliveryError(f"unknown channel '{channel}'")


def signature(secret: bytes, payload: bytes) -> str:
    """The X-Isthmus-Signature value: sha256=<hex HMAC-SHA256 of the body>."""
    return "sha256=" + hmac.new(secret, payload, hashlib.sha256).hexdigest()


def _post(cfg: Notices, http: httpx.Client, url: str, notice: store.Notice) -> None:
    payload = json.dumps(body(notice), sort_keys=True).encode()
    headers = {"Content-Type": "application/json", NOTICE_HEADER: notice.key,
               "User-Agent": "isthmus-notices"}
    if cfg.signing_secret_env is not None:
        secret = os.environ.get(cfg.signing_secret_env)
        if not secret:
            raise DeliveryError(f"notices.signing_secret_env: ${cfg.signing_secret_env} is "
                                "unset or empty; set it or remove the setting")
        headers[SIGNATURE_HEADER] = signature(secret.encode(), payload)
    try:
        answer = http.post(url, content=payload, headers=headers)
    except httpx.HTTPError as exc:
        raise DeliveryError(f"{type(exc).__name__}: {str(exc)[:200]}") from None
    if not 200 <= answer.status_code < 300:
        raise DeliveryError(f"HTTP {answer.status_code}: {answer.text[:200]}")


def _mail(cfg: Notices, address: str, notice: store.Notice) -> None:
    smtp = cfg.smtp
    if smtp is None:
        raise DeliveryError("notices.smtp is not configured")
    data = body(notice)
    msg = EmailMessage()
    msg["From"] = smtp.sender
    msg["To"] = address
    msg["Subject"] = (f"[isthmus] job {data['job_name'] or data['team']}"
                      f"{' (' + str(data['job_number']) + ')' if data['job_number'] else ''}: "
                      f"{notice.kind} {data['state'] or ''} {data['reason'] or ''}").strip()
    msg[NOTICE_HEADER] = notice.key
    msg.set_content(f"{data['message'] or notice.kind}\n\n"
                    + json.dumps(data, indent=2, sort_keys=True) + "\n")
    password = os.environ.get(smtp.password_env) if smtp.password_env else None
    if smtp.password_env and not password:
        raise DeliveryError(f"notices.smtp.password_env: ${smtp.password_env} is unset or "
                            "empty")
    try:
        with smtplib.SMTP(smtp.host, smtp.port, timeout=smtp.timeout) as client:
            if smtp.starttls:
                client.starttls()
            if smtp.username:
                client.login(smtp.username, password or "")
            client.send_message(msg)
    except (OSError, smtplib.SMTPException) as exc:
        raise DeliveryError(f"{type(exc).__name__}: {str(exc)[:200]}") from None


def _shown(channel: str, target: str) -> str:
    return redacted(target) if channel == store.WEBHOOK else target
