"""The dashboard in a real browser (Debian's chromium through Playwright) against a real
server on the simulated federation: sign in, walk every page, check what each shows, that no
page logs a console error, and that a team token cannot reach another team's job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.harness.ui import TOKENS, Console, Federation, shot
from tests.harness.wait import wait_until

pytestmark = pytest.mark.ui


def sign_in(page: Any, fed: Federation, token: str, then: str = "/ui") -> None:
    page.goto(f"{fed.url}{then}")
    assert "/ui/signin" in page.url  # not signed in: sent to the sign-in page
    page.fill("#token", token)
    page.click("#signin")
    page.wait_for_url(f"{fed.url}{then}")


def _text(page: Any, selector: str) -> str:
    return str(page.locator(selector).inner_text())


def _free(page: Any, fed: Federation, pool: str) -> str | None:
    """The pool's card once both backends answered their last inventory call in time (on a
    loaded machine a call can miss the control loop's wait and the view says so)."""
    page.goto(f"{fed.url}/ui")
    card = page.locator(f"#pool-{pool}")
    health = page.locator("#backends td.health").all_inner_texts()
    if "of 24 GPUs free" not in card.inner_text() or health != ["reachable"] * 2:
        return None
    return str(card.inner_text())


def test_admin_walks_every_page(federation: Federation, page: Any, tmp_path: Path) -> None:
    fed = federation
    console = Console(page)
    page.goto(f"{fed.url}/ui/queue")
    assert "/ui/signin" in page.url
    shot(page, "signin", tmp_path)
    sign_in(page, fed, TOKENS["root"])
    assert "root (admin)" in _text(page, "#who")

    # Overview: slurm-h100 ran nothing here, so its 3 nodes x 8 GPUs are all free; the
    # card shows it once the control loop has an inventory of the simulated backend.
    card = wait_until(lambda: _free(page, fed, "slurm-h100"), 90, "both backends' inventories")
    assert page.locator("#pool-slurm-h100 .free-gpus").inner_text() == "24"
    assert "Isthmus 0" in card
    # k8s-h100: one node in eight runs foreign work (foreign_load 0.125): 56 of 64 free
    assert "56 of 64 GPUs free" in _text(page, "#pool-k8s-h100")
    assert "foreign 8" in _text(page, "#pool-k8s-h100")
    quotas = _text(page, "#quotas")
    assert "vision" in quotas and "language" in quotas
    assert "vision\t1\t8" in _text(page, "#depth")  # later waits: one job, 8 GPUs
    shot(page, "overview", tmp_path)

    page.click("nav >> text=Queue")
    queue = _text(page, "#queue")
    assert "later" in queue and "BeginTimeNotReached" in queue
    assert "bert-finetune" not in queue and _text(page, "#queue-total") == "1"
    shot(page, "queue", tmp_path)

    page.click("nav >> text=Jobs")
    jobs = _text(page, "#jobs")
    for name in ("bert-finetune", "too-big", "later"):
        assert name in jobs
    shot(page, "jobs", tmp_path)

    page.click("text=too-big")
    assert _text(page, "#job-state") == "REJECTED"
    assert _text(page, "#job-reason") == "ExceedsCapacity"
    assert "short by" in _text(page, "#job-message")

    bert = fed.jobs["bert-finetune"]["id"]
    page.goto(f"{fed.url}/ui/jobs/{bert}")
    assert _text(page, "#job-state") == "SUCCEEDED"
    assert "k8s-a100" in _text(page, "#attempts")
    assert "k8s-a100" in _text(page, "#explain")
    timeline = page.locator("#timeline svg").text_content()
    assert "running" in timeline and "queued" in timeline
    assert "SUCCEEDED" in _text(page, "#events")
    assert '"bert-finetune"' in page.locator("#spec").text_content()
    assert "admitted to k8s-a100" in _text(page, "#decisions")  # the decision log
    shot(page, "job", tmp_path)
    page.click("#logs-link")
    assert "Logs of" in _text(page, "h1")
    shot(page, "logs", tmp_path)

    page.goto(f"{fed.url}/ui/reports?range=hour")
    # bert-finetune's attempt is booked when it ends: team language has GPU-hours and cost
    totals = page.locator("#totals tbody tr", has_text="language").inner_text()
    assert float(totals.split("\t")[1]) > 0
    assert "language" in page.locator("#cost-chart svg").text_content()
    shot(page, "reports", tmp_path)

    page.click("nav >> text=Decisions")
    shot(page, "decisions", tmp_path)
    for _ in range(50):  # the cycle that admitted bert-finetune, paging back from the newest
        if f"{bert}\n→ k8s-a100" in _text(page, "#cycles") or f"{bert} → k8s-a100" in _text(
                page, "#cycles"):
            break
        page.click("a[rel=next]")
    else:
        raise AssertionError("no cycle admitted bert-finetune")

    assert console.errors == []


def test_team_token_sees_only_its_team(federation: Federation, page: Any) -> None:
    fed = federation
    console = Console(page)
    sign_in(page, fed, TOKENS["alice"], "/ui/jobs")
    assert "team vision" in _text(page, "#who")
    jobs = _text(page, "#jobs")
    assert "too-big" in jobs and "bert-finetune" not in jobs
    page.goto(f"{fed.url}/ui/jobs?team=language")  # asking for another team shows its own
    assert "bert-finetune" not in _text(page, "#jobs")

    bert = fed.jobs["bert-finetune"]["id"]
    for path in (f"/ui/jobs/{bert}", f"/ui/jobs/{bert}/logs"):
        response = page.goto(f"{fed.url}{path}")
        assert response.status == 404
        assert "Not found" in _text(page, "h1")
        assert "bert-finetune" not in page.content()

    page.goto(f"{fed.url}/ui/queue?team=language")
    assert "later" in _text(page, "#queue")
    page.goto(f"{fed.url}/ui")
    teams = {row.split("\t")[0] for row in page.locator("#quotas tbody tr").all_inner_texts()}
    assert teams == {"vision"}
    page.goto(f"{fed.url}/ui/reports?range=hour")
    assert "language" not in _text(page, "#totals")
    response = page.goto(f"{fed.url}/ui/decisions")  # cycles span every team: admins only
    assert response.status == 403 and page.locator("#cycles").count() == 0
    # the 404 and 403 answers log "Failed to load resource"; nothing else may be logged
    assert [e for e in console.errors
            if "status of 404" not in e and "status of 403" not in e] == []


def test_session_cookie_and_sign_out(federation: Federation, page: Any) -> None:
    fed = federation
    page.goto(f"{fed.url}/ui")
    page.fill("#token", "not-a-token")
    page.click("#signin")
    assert "not known" in _text(page, "#signin-error")  # answered 401, no cookie set
    assert page.context.cookies() == []
    sign_in(page, fed, TOKENS["bob"])
    cookies = page.context.cookies()
    assert [(c["name"], c["httpOnly"], c["sameSite"], c["path"]) for c in cookies] == [
        ("isthmus_ui", True, "Strict", "/ui")]
    assert page.evaluate("document.cookie") == ""  # out of reach of scripts
    page.click("text=Sign out")
    page.wait_for_url("**/ui/signin")
    page.goto(f"{fed.url}/ui/jobs")
    assert "/ui/signin" in page.url


def test_a_team_member_submits_from_a_template(federation: Federation, page: Any) -> None:
    """The submit form in a browser: pick the template, name the job, change an allowed
    field; the browser lands on the new job's page, and a refused override is named."""
    fed = federation
    console = Console(page)
    sign_in(page, fed, TOKENS["alice"], "/ui/submit")
    page.select_option("#template", "bert-ft")
    page.click("#choose")
    page.wait_for_selector("#submit-form")
    page.fill("#job-name", "form-run")
    page.fill("input[data-path='max_runtime']", "30m")
    page.fill("#extra", "flavors=[\"h100-80g\"]")
    page.click("#submit")
    assert "set.flavors" in _text(page, "#submit-error")  # refused, named, nothing stored
    page.fill("#extra", "")
    page.click("#submit")
    page.wait_for_url(f"{fed.url}/ui/jobs/*")
    job_id = page.url.rsplit("/", 1)[-1]
    job = fed.api(f"/v1/jobs/{job_id}", TOKENS["alice"])
    assert (job["name"], job["team"], job["spec"]["max_runtime"]) == ("form-run", "vision", "30m")
    assert [e for e in console.errors if "status of 422" not in e] == []  # no CSP refusal
