"""The allow-list checks of the escape hatch: what a job's `native:` block may hold at all (the
spec model), what a site may let a team pass (isthmus.yaml teams[].native, checked at load)
and what one team's policy lets through (at submit). Every refusal names the field."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from broker.config import ConfigError, parse_config
from broker.config_native import NativePolicy, native_problems
from broker.domain.native import NativeOptions
from broker.domain.spec import JobSpec
from tests.builders import spec
from tests.harness.paths import EXAMPLE_CONFIG

TOL = [{"key": "example.com/spot", "operator": "Exists"}]


def _native(k8s: dict[str, Any] | None = None, slurm: list[str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if k8s is not None:
        out["k8s"] = {"pod_template": k8s}
    if slurm is not None:
        out["slurm"] = {"options": slurm}
    return out


@pytest.mark.parametrize(("native", "named"), [
    (_native({"spec": {"nodeSelector": {"pool": "x"}}}), "spec.nodeSelector: Isthmus sets it"),
    (_native({"spec": {"containers": [{"resources": {}}]}}),
     "spec.containers[*].resources: Isthmus sets it"),
    (_native({"spec": {"securityContext": {}}}), "spec.securityContext: Isthmus sets it"),
    (_native({"spec": {"dnsPolicy": "None"}}), "spec.dnsPolicy: not a field an overlay"),
    (_native({"kind": "Pod"}), "kind: not a field an overlay"),
    (_native({"spec": {"containers": {"env": []}}}), "spec.containers: give a list of one"),
    (_native({"spec": {"tolerations": {"key": "x"}}}), "spec.tolerations: a list of mappings"),
    (_native({"spec": {"priorityClassName": "Not A Name"}}), "spec.priorityClassName: a lower"),
    (_native({"metadata": {"labels": {"isthmus.io/job": "x"}}}), "metadata.labels: label key"),
    (_native({"metadata": {"annotations": {"isthmus.io/pool": "x"}}}),
     "metadata.annotations: key 'isthmus.io/pool'"),
    (_native({"spec": {"containers": [{"env": [{"name": "WORLD_SIZE", "value": "1"}]}]}}),
     "spec.containers[*].env: [0].name: WORLD_SIZE is set by Isthmus"),
    (_native(slurm=["--partition=debug"]), "[0] --partition: Isthmus sets it"),
    (_native(slurm=["--comment=mine"]), "[0] --comment: Isthmus sets it"),
    (_native(slurm=["--qos=high", "--bogus=1"]), "[1] --bogus: not an option Isthmus passes"),
    (_native(slurm=["-q high"]), "[0] -q high: write one long option"),
    (_native(slurm=["--qos=$(reboot)"]), "[0] --qos=$(reboot): write one long option"),
    (_native(slurm=["--qos=a", "--qos=b"]), "[1] --qos is given twice"),
    # review of issue 33: a Secret read through the overlay, a constraint escaping the rack's
    # AND, a line break, a missing value, the platform's variables, the system classes
    (_native({"spec": {"containers": [{"env": [{"name": "T", "valueFrom": {
        "secretKeyRef": {"name": "isthmus-j-1", "key": "token"}}}]}]}}),
     "[0].valueFrom: a Secret is not a source"),
    (_native({"spec": {"containers": [{"envFrom": [{"secretRef": {"name": "x"}}]}]}}),
     "[0].secretRef: a Secret is not a source"),
    (_native(slurm=["--constraint=ib)|(gpu"]), "--constraint: its parentheses"),
    (_native(slurm=["--constraint=[a|b"]), "--constraint: its parentheses"),
    (_native(slurm=["--qos=high\n"]), "write one long option"),
    (_native(slurm=["--qos"]), "--qos: give its value"),
    (_native({"spec": {"containers": [{"env": [{"name": "SLURM_RESTART_COUNT", "value": "0"}]}]}}),
     "SLURM_RESTART_COUNT is set by Isthmus, Slurm or the GPU runtime"),
    (_native({"spec": {"containers": [{"env": [{"name": "NVIDIA_VISIBLE_DEVICES",
                                                "value": "all"}]}]}}),
     "NVIDIA_VISIBLE_DEVICES is set by"),
    (_native({"spec": {"priorityClassName": "system-node-critical"}}),
     "spec.priorityClassName: the cluster's system- classes"),
    (_native({"spec": {"runtimeClassName": "gvisor\n"}}), "spec.runtimeClassName: a lower"),
], ids=["node-selector", "gpus", "security", "unknown-field", "top-level", "containers-shape",
        "tolerations-shape", "class-name", "isthmus-label", "isthmus-annotation", "rank-env",
        "partition", "comment", "unknown-option", "short-option", "shell", "twice",
        "secret-env", "secret-env-from", "constraint-escape", "constraint-bracket", "newline",
        "no-value", "slurm-env", "nvidia-env", "system-class", "class-newline"])
def test_the_spec_refuses_what_can_never_pass_naming_it(native: dict[str, Any],
                                                        named: str) -> None:
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate(spec().dict() | {"native": native})
    (err,) = exc.value.errors()
    assert err["loc"][0] == "native"
    assert named in err["msg"]


def test_a_spec_without_native_keeps_its_hash() -> None:
    """Specs stored before the field existed hash as they did."""
    plain = JobSpec.model_validate(spec().dict())
    assert "native" not in plain.model_dump(exclude_defaults=True)
    with_native = JobSpec.model_validate(spec().dict() | {"native": _native(slurm=["--qos=a"])})
    assert with_native.spec_hash() != plain.spec_hash()


def _config(team_native: dict[str, Any]) -> dict[str, Any]:
    data = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    data["teams"][0]["native"] = team_native
    return dict(data)


@pytest.mark.parametrize(("team_native", "named"), [
    ({"k8s": {"pod_template": ["spec.tolerations", "spec.nodeSelector"]}},
     "teams[0].native.k8s.pod_template[1]: 'spec.nodeSelector': Isthmus enforces it"),
    ({"k8s": {"pod_template": ["spec.containers[*].resources"]}},
     "teams[0].native.k8s.pod_template[0]: 'spec.containers[*].resources': Isthmus enforces"),
    ({"k8s": {"pod_template": ["spec"]}}, "pod_template[0]: 'spec': not a field"),
    ({"slurm": {"options": ["--qos", "--partition"]}},
     "teams[0].native.slurm.options[1]: '--partition': Isthmus sets it"),
    ({"slurm": {"options": ["qos"]}}, "teams[0].native.slurm.options[0]: 'qos': not an option"),
    ({"slurm": {"options": ["--job-name"]}}, "options[0]: '--job-name': Isthmus sets it"),
    ({"docker": {}}, "teams[0].native.docker"),
], ids=["node-selector", "gpus", "whole-spec", "partition", "short-name", "job-name",
        "unknown-kind"])
def test_the_configuration_refuses_a_policy_naming_the_field(team_native: dict[str, Any],
                                                            named: str) -> None:
    with pytest.raises(ConfigError, match=None) as exc:
        parse_config(_config(team_native))
    assert named in str(exc.value)


def test_a_policy_within_the_lists_loads() -> None:
    cfg = parse_config(_config({"k8s": {"pod_template": ["spec.tolerations"]},
                                "slurm": {"options": ["--qos"]}}))
    native = cfg.teams[0].native
    assert native is not None and native.slurm.options == ["--qos"]
    assert cfg.teams[1].native is None  # another team passes nothing


POLICY = NativePolicy.model_validate({
    "k8s": {"pod_template": ["spec.tolerations", "metadata.labels", "spec.containers[*].env"]},
    "slurm": {"options": ["--qos", "--constraint"]},
})
RESERVED = ("isthmus.io/", "kueue.x-k8s.io/")


def _problems(native: dict[str, Any], policy: NativePolicy | None = POLICY,
              env: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    return native_problems(policy, "vision", NativeOptions.model_validate(native), env,
                           RESERVED)


def test_what_the_teams_policy_allows_passes() -> None:
    assert _problems(_native(
        {"spec": {"tolerations": TOL, "containers": [{"env": [{"name": "A", "value": "1"}]}]},
         "metadata": {"labels": {"example.com/x": "y"}}},
        ["--qos=high", "--constraint=ib"])) == []


@pytest.mark.parametrize(("native", "policy", "env", "field", "says"), [
    (_native({"spec": {"priorityClassName": "high"}}), POLICY, (),
     "native.k8s.pod_template.spec.priorityClassName", "may not set spec.priorityClassName"),
    (_native({"spec": {"tolerations": TOL}}), None, (),
     "native.k8s.pod_template.spec.tolerations", "allows: nothing"),
    (_native({"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "other-team"}}}), POLICY, (),
     "native.k8s.pod_template.metadata.labels.kueue.x-k8s.io/queue-name", "reserved prefix"),
    (_native({"spec": {"containers": [{"env": [{"name": "LR", "value": "1"}]}]}}), POLICY,
     ("LR",), "native.k8s.pod_template.spec.containers[*].env[0].name", "set by the job's env"),
    (_native(slurm=["--qos=high", "--reservation=r1"]), POLICY, (),
     "native.slurm.options[1]", "may not pass --reservation"),
    (_native(slurm=["--qos=high"]), None, (), "native.slurm.options[0]", "allows: nothing"),
], ids=["field-not-allowed", "no-policy-k8s", "reserved-label", "env-clash",
        "option-not-allowed", "no-policy-slurm"])
def test_the_teams_policy_refuses_naming_the_field_and_the_fix(
        native: dict[str, Any], policy: NativePolicy | None, env: tuple[str, ...], field: str,
        says: str) -> None:
    ((got_field, message),) = _problems(native, policy, env)
    assert got_field == field
    assert says in message and ("ask an admin" in message or "example.com/" in message
                                or "one place" in message)


def test_a_nested_constraint_and_a_bare_nice_pass() -> None:
    native = NativeOptions.model_validate({"slurm": {"options": [
        "--constraint=(ib|opa)&[rack1*2&rack2*2]", "--nice", "--qos=high"]}})
    assert native.slurm is not None and native.slurm.parsed() == [
        ("constraint", "(ib|opa)&[rack1*2&rack2*2]"), ("nice", None), ("qos", "high")]
