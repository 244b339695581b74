"""The OpenAPI document tells clients (and the suite's fuzz test) every body and answer: a
route that takes a body documents it and its 400 (malformed JSON) and 422; every /v1 route its
401. POST /v1/hpc/batch had no documented body, so the fuzz test never reached it."""

from __future__ import annotations

from pathlib import Path

from broker.api.app import create_app
from broker.config import load_config
from broker.store import open_database

ROOT = Path(__file__).resolve().parents[2]
BODY_ROUTES = {("post", "/v1/jobs"), ("post", "/v1/plan"), ("post", "/v1/hpc/batch"),
               ("post", "/v1/jobs/{job_id}/progress"), ("post", "/v1/admin/pools/{pool}/drain"),
               ("post", "/v1/hpc/jobs/{job_id}/signal")}


def test_every_body_and_answer_is_documented(tmp_path: Path) -> None:
    db = open_database(f"sqlite:///{tmp_path}/openapi.db")
    try:
        spec = create_app(load_config(ROOT / "examples" / "isthmus.yaml"), db).openapi()
    finally:
        db.dispose()
    missing = []
    with_body = set()
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            codes = set(op.get("responses", {}))
            if "requestBody" in op:
                with_body.add((method, path))
                missing += [f"{method.upper()} {path}: {c}" for c in ("400", "422")
                            if c not in codes]
            if path.startswith("/v1/") and "401" not in codes:
                missing.append(f"{method.upper()} {path}: 401")
    assert missing == []
    assert with_body >= BODY_ROUTES, BODY_ROUTES - with_body
