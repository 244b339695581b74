"""The `policies:` section: every policy parameter, validated, defaults equal to the policies'
own, passed through the wiring, documented in the README and shown by `config check --show`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from broker.config import ConfigError, Policies, parse_config
from broker.control.plane import ControlParams
from broker.wiring.runtime import control_params
from policies.cycle import AdmissionParams
from policies.preemption import PreemptionParams
from policies.retry import RetryParams

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_defaults_are_the_policies_own() -> None:
    params = control_params(parse_config({}))
    assert params.admission == AdmissionParams()
    assert params.preemption == PreemptionParams()
    assert params.retry == RetryParams()
    assert params.fair_share_half_life_s == ControlParams().fair_share_half_life_s
    assert params.cancel_grace_s is None


def test_every_parameter_reaches_the_policies() -> None:
    cfg = parse_config({"policies": {
        "retry": {"max_preemptions": 3, "orchestration_retries": 2, "unknown_retries": 0,
                  "preemption_delay": 60, "infra_pool_exclude_after": 4},
        "preemption": {"min_runtime": 60, "protect_near_end": 120, "max_victims": 2},
        "placement": {"weights": {"flavor": 2, "wait_per_hour": 3, "foreign_wait": 0.5},
                      "turnover": 600, "max_isthmus_pending": 5, "queue_max_gpus": 16,
                      "hold_queued_by_shape": True},
        "ordering": {"starvation_after": 900, "reservation_min_gpus": 16, "max_reservations": 1,
                     "backfill": False, "backfill_margin": 60, "queue_closed_after": 7200,
                     "queue_exclude": False},
        "fair_share": {"half_life": 7200},
        "admission": {"max_admissions": 50},
        "cancel_grace": 30,
    }})
    p = control_params(cfg)
    assert p.retry == RetryParams(3, 2, 0, 60, 4)
    assert p.preemption == PreemptionParams(60.0, 120.0, 2)
    placement = p.admission.placement
    assert (placement.weights.flavor, placement.weights.wait_per_hour,
            placement.weights.foreign_wait) == (2.0, 3.0, 0.5)
    assert (placement.turnover_seconds, placement.default_max_isthmus_pending,
            placement.queue_max_gpus) == (600.0, 5, 16)
    assert placement.hold_queued_by_shape
    o = p.admission.ordering
    assert (o.starvation_after_s, o.reservation_min_gpus, o.max_reservations) == (900.0, 16, 1)
    assert o.backfill is False
    assert o.backfill_margin_s == 60.0
    assert o.queue_closed_after_s == 7200.0
    assert o.queue_exclude is False
    assert p.admission.max_admissions == 50
    assert (p.fair_share_half_life_s, p.cancel_grace_s) == (7200.0, 30)


@pytest.mark.parametrize(("section", "path"), [
    ({"retry": {"max_preemption": 3}}, "policies.retry.max_preemption: Extra inputs"),
    ({"placement": {"weights": {"flavour": 1}}}, "policies.placement.weights.flavour: Extra"),
    ({"fair_share": {"half_life": 0}}, "policies.fair_share.half_life: Input should be greater"),
    ({"preemption": {"max_victims": 0}}, "policies.preemption.max_victims: Input should be"),
    ({"starvation": 1}, "policies.starvation: Extra inputs"),
], ids=["retry-typo", "weights-typo", "zero-half-life", "no-victims", "unknown-section"])
def test_unknown_or_bad_keys_are_refused_with_their_path(section: dict[str, object],
                                                         path: str) -> None:
    with pytest.raises(ConfigError, match=path.replace(".", r"\.")):
        parse_config({"policies": section})


def _keys(model: type[BaseModel], prefix: str = "") -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    defaults = model()
    for name in model.model_fields:
        value = getattr(defaults, name)
        if isinstance(value, BaseModel):
            out += _keys(type(value), f"{prefix}{name}.")
        else:
            out.append((f"{prefix}{name}", value))
    return out


def test_every_parameter_is_documented_with_its_default() -> None:
    for key, value in _keys(Policies):
        shown = "none" if value is None else (
            str(int(value)) if isinstance(value, float) and value.is_integer() else str(value))
        row = f"| `{key}` | {shown} |"
        assert row in README, row


@pytest.mark.slow
def test_config_check_show_prints_every_parameter(tmp_path: Path) -> None:
    cfg = tmp_path / "isthmus.yaml"
    cfg.write_text("policies:\n  fair_share:\n    half_life: 600\n")
    out = subprocess.run([sys.executable, "-m", "broker.cli.main", "config", "check", "--show",
                          str(cfg)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "half_life: 600.0" in out.stdout and "max_preemptions: 10" in out.stdout
    assert "protect_near_end: 900.0" in out.stdout and "cancel_grace: null" in out.stdout


def test_the_older_control_keys_are_the_policies_values_shown() -> None:
    """`control.preemption_*` (older spelling) becomes `policies.preemption.*` when the file
    is read: what `config check --show` prints (cfg.policies) is what the server uses."""
    cfg = parse_config({"control": {"preemption_min_runtime": 5,
                                    "preemption_protect_near_end": 30}})
    assert (cfg.policies.preemption.min_runtime, cfg.policies.preemption.protect_near_end) \
        == (5, 30)
    used = control_params(cfg).preemption
    assert (used.min_runtime_s, used.protect_near_end_s) == (5, 30)


def test_the_older_and_newer_spellings_may_not_disagree() -> None:
    with pytest.raises(ConfigError, match=r"control\.preemption_min_runtime .* disagree"):
        parse_config({"control": {"preemption_min_runtime": 5},
                      "policies": {"preemption": {"min_runtime": 60}}})
    same = parse_config({"control": {"preemption_min_runtime": 60},
                         "policies": {"preemption": {"min_runtime": 60}}})
    assert same.policies.preemption.min_runtime == 60


@pytest.mark.slow
def test_config_check_refuses_what_the_server_refuses(tmp_path: Path) -> None:
    """config check is the server's own start-up check: a token whose env var is unset fails
    both, with the same message."""
    cfg = tmp_path / "isthmus.yaml"
    cfg.write_text("auth:\n  mode: token\n  tokens:\n"
                   "    - {name: ops, team: vision, token_env: ISTHMUS_TEST_UNSET_TOKEN}\n"
                   "teams: [{name: vision}]\n")
    out = subprocess.run([sys.executable, "-m", "broker.cli.main", "config", "check",
                          str(cfg)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "auth.tokens: the env vars of token(s) ['ops'] are not set" in out.stderr + out.stdout


def test_every_config_error_names_its_place_one_way() -> None:
    """pydantic's own errors and the references checked after it read alike:
    `pools[0].capacity.nodes`, never `pools.0.capacity.nodes` beside `pools[0].backend`."""
    with pytest.raises(ConfigError) as exc:
        parse_config({"teams": [{"name": "a", "wieght": 2}],
                      "pools": [{"name": "p", "backend": "b", "flavor": "f",
                                 "capacity": {"nodes": -1, "gpus_per_node": 8}}]})
    text = str(exc.value)
    assert "teams[0].wieght" in text and "pools[0].capacity.nodes" in text, text
    assert ".0." not in text
    with pytest.raises(ConfigError, match=r"pools\[0\]\.backend: 'b' is not in backends"):
        parse_config({"pools": [{"name": "p", "backend": "b", "flavor": "f"}]})
