"""Mapping an sbatch request to a JobSpec through slurm_compat (pure; table-driven)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.config_slurm_compat import SlurmCompat
from broker.domain.notices import NoticeKind
from broker.domain.spec import JobSpec
from broker.sbatch.compat import ANNOTATION, CompatError, to_job_spec
from broker.sbatch.parse import parse

COMPAT = SlurmCompat.model_validate({
    "default_partition": "a100",
    "partitions": {"a100": {"flavors": ["a100-80g"], "backend": "any"},
                   "h100": {"flavors": ["h100-80g"], "backend": "slurm"},
                   "gpu": {"flavors": ["h100-80g", "a100-80g"], "backend": "any"}},
    "accounts": {"vis": "vision", "vis-prod": "vision/prod"},
    "default_accounts": {"carol": "vis"},
    "qos": {"urgent": "high"},
    "gpu_types": {"a100": "a100-80g", "h100": "h100-80g"},
    "constraints": {"h100": "h100-80g"},
    "image": "python:3.12-slim",
})
SCRIPT = "#!/bin/bash\n#SBATCH -t 10\nsrun hostname\n"


def spec_for(argv: list[str], team: str | None = "vision", env: dict[str, str] | None = None
             ) -> dict:
    parsed = parse(argv, env or {}, lambda path: SCRIPT)
    return to_job_spec(parsed.request, parsed.script, COMPAT, caller_team=team,
                       script_path=parsed.command_line.script_path, environ=env or {},
                       submit_dir="/home/u")


def test_torchrun_request_becomes_a_valid_spec() -> None:
    spec = spec_for(["-J", "LLaMA 7B", "-p", "a100", "-N", "2", "--gres=gpu:a100:8",
                     "--cpus-per-task=8", "--mem=64G", "--signal=B:USR1@90", "-q", "urgent",
                     "--export=ALL,DATA=/d", "job.sh"])
    checked = JobSpec.model_validate(spec)
    assert checked.name == "llama-7b"
    assert checked.team == "vision" and checked.priority == "high"
    assert checked.flavors == ["a100-80g"] and checked.backend == "any"
    assert (checked.gang.replicas, checked.gang.gpus_per_replica) == (2, 8)
    assert checked.gang.cpus_per_replica == 8
    assert checked.gang.memory_per_replica == 64 * 2**30
    assert checked.max_runtime == 600 and checked.checkpoint.grace == 90
    assert checked.entrypoint.launcher == "batch" and checked.entrypoint.script == SCRIPT.strip()
    assert checked.env == {"DATA": "/d", "SLURM_SUBMIT_DIR": "/home/u"}
    assert json.loads(checked.annotations[ANNOTATION])["sbatch"]["replicas"] == 2


@pytest.mark.parametrize(
    ("argv", "key", "value"),
    [
        (["--gres=gpu:8", "job.sh"], "flavors", ["a100-80g"]),
        (["-p", "gpu", "--gres=gpu:8", "job.sh"], "flavors", ["h100-80g", "a100-80g"]),
        (["-p", "gpu", "--gres=gpu:a100:8", "job.sh"], "flavors", ["a100-80g"]),
        (["-p", "gpu", "-C", "h100", "--gres=gpu:8", "job.sh"], "flavors", ["h100-80g"]),
        (["-p", "h100,a100", "--gres=gpu:8", "job.sh"], "backend", "any"),
        (["-p", "h100", "--gres=gpu:8", "job.sh"], "backend", "slurm"),
        (["-A", "vis", "--gres=gpu:8", "job.sh"], "team", "vision"),
        (["-A", "vis-prod", "--gres=gpu:8", "job.sh"], "queue", "prod"),
        (["-A", "vis-prod", "--gres=gpu:8", "job.sh"], "team", "vision"),
        (["--gres=gpu:8", "job.sh"], "name", "job-sh"),
        (["--gres=gpu:8", "--wrap", "hostname"], "name", "wrap"),
    ],
    ids=["default-partition", "partition-flavor-order", "gpu-type-narrows", "constraint-narrows",
         "mixed-backends-any", "slurm-only", "account-team", "sub-account-queue",
         "sub-account-team", "name-from-script", "name-wrap"],
)
def test_mapping(argv: list[str], key: str, value: object) -> None:
    assert spec_for(argv)[key] == value


def test_an_account_without_a_queue_leaves_the_jobs_default() -> None:
    assert "queue" not in spec_for(["-A", "vis", "--gres=gpu:8", "job.sh"])


@pytest.mark.parametrize(
    ("argv", "team", "message"),
    [
        (["-p", "v100", "--gres=gpu:8", "job.sh"], "vision", "invalid partition specified: v100"),
        (["--gres=gpu:v100:8", "job.sh"], "vision", "GPU type 'v100' is not mapped"),
        (["-p", "h100", "--gres=gpu:a100:8", "job.sh"], "vision", "is not offered in partition"),
        (["-C", "ib", "--gres=gpu:8", "job.sh"], "vision", "feature 'ib' is not mapped"),
        (["-A", "physics", "--gres=gpu:8", "job.sh"], "vision", "Invalid account"),
        (["--gres=gpu:8", "job.sh"], None, "give -A/--account"),
        (["-q", "scavenger", "--gres=gpu:8", "job.sh"], "vision", "Invalid qos specification"),
        (["job.sh"], "vision", "no GPUs requested"),
        (["--gres=gpu:8", "-t", "UNLIMITED", "job.sh"], "vision", "a time limit is needed"),
        (["--gres=gpu:8", "--reservation=maint", "job.sh"], "vision", "--reservation"),
        (["--gres=gpu:8", "-w", "node1", "job.sh"], "vision", "--nodelist"),
    ],
    ids=["partition", "gpu-type", "type-not-in-partition", "feature", "account", "no-team",
         "qos", "no-gpus", "unlimited", "reservation", "nodelist"],
)
def test_refusals_name_the_option(argv: list[str], team: str | None, message: str) -> None:
    with pytest.raises(CompatError, match=None) as err:
        spec_for(argv, team=team)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("signal", "checkpoint"),
    [
        ("USR2@90", {"grace": 90, "signal": "USR2", "signal_batch_only": False}),
        ("B:USR1@120", {"grace": 120, "signal": "USR1", "signal_batch_only": True}),
        ("R:10@5", {"grace": 5, "signal": "USR1", "signal_batch_only": False}),
        ("B:35@60", {"grace": 60, "signal": "35", "signal_batch_only": True}),
        ("SIGTERM", {"grace": 60, "signal": "TERM", "signal_batch_only": False}),
        ("RB:IOT@7", {"grace": 7, "signal": "ABRT", "signal_batch_only": True}),
    ],
    ids=["usr2-steps", "b-usr1", "r-number", "realtime-number", "default-time", "alias"],
)
def test_every_sbatch_signal_form_becomes_the_checkpoint_signal(
        signal: str, checkpoint: dict[str, object]) -> None:
    spec = spec_for(["--gres=gpu:8", f"--signal={signal}", "job.sh"])
    assert spec["checkpoint"] == checkpoint
    assert JobSpec.model_validate(spec).checkpoint.signal == checkpoint["signal"]


def test_a_user_without_team_gets_the_default_account_or_a_clear_refusal() -> None:
    parsed = parse(["--gres=gpu:8", "job.sh"], {}, lambda path: SCRIPT)
    spec = to_job_spec(parsed.request, parsed.script, COMPAT, caller_team=None,
                       caller_name="carol")
    assert spec["team"] == "vision"  # carol's default account vis
    with pytest.raises(CompatError, match="default_accounts names no account for user dave"):
        to_job_spec(parsed.request, parsed.script, COMPAT, caller_team=None, caller_name="dave")


def test_the_token_is_never_exported() -> None:
    spec = spec_for(["--gres=gpu:8", "--export=ISTHMUS_TOKEN,HOME", "job.sh"],
                    env={"ISTHMUS_TOKEN": "secret", "HOME": "/home/u"})
    assert spec["env"] == {"HOME": "/home/u", "SLURM_SUBMIT_DIR": "/home/u"}


def test_config_refuses_unknown_references(tmp_path: Path) -> None:
    from broker.config import ConfigError, load_config

    text = (Path(__file__).parents[2] / "examples" / "isthmus.yaml").read_text()
    bad = tmp_path / "isthmus.yaml"
    bad.write_text(text.replace("gpu_types: {a100: a100-80g", "gpu_types: {a100: a100-40g"))
    with pytest.raises(ConfigError, match=r"slurm_compat.gpu_types.a100: 'a100-40g' is not in"):
        load_config(bad)


def test_array_becomes_one_spec_per_task_with_the_slurm_variables() -> None:
    from broker.sbatch.compat import array_specs

    parsed = parse(["--array=0-10:5%2", "--gres=gpu:1", "job.sh"], {}, lambda path: SCRIPT)
    base = to_job_spec(parsed.request, parsed.script, COMPAT, caller_team="vision")
    tasks = [JobSpec.model_validate(t) for t in array_specs(base, parsed.request, "arr1")]
    assert [t.scheduling.array.index for t in tasks if t.scheduling and t.scheduling.array] == [
        0, 5, 10]
    assert tasks[1].env["SLURM_ARRAY_TASK_ID"] == "5"
    assert tasks[1].env["SLURM_ARRAY_JOB_ID"] == "arr1"
    assert tasks[1].env["SLURM_ARRAY_TASK_STEP"] == "5"
    assert tasks[1].env["SLURM_ARRAY_TASK_COUNT"] == "3"
    assert {t.scheduling.array.limit for t in tasks if t.scheduling and t.scheduling.array} == {2}


def test_dependencies_and_begin_become_scheduling() -> None:
    from datetime import UTC, datetime

    parsed = parse(["--dependency=afterok:arr1?afternotok:j9", "--begin=now+60",
                    "--gres=gpu:1", "job.sh"], {}, lambda path: SCRIPT)
    table = {"arr1": ["t0", "t1"], "j9": ["j9"]}
    now = datetime(2026, 12, 1, tzinfo=UTC)
    spec = JobSpec.model_validate(to_job_spec(
        parsed.request, parsed.script, COMPAT, caller_team="vision",
        resolve=lambda ref: table.get(ref, []), now=now))
    assert spec.scheduling is not None
    assert spec.scheduling.begin_at == datetime(2026, 12, 1, 0, 1, tzinfo=UTC)
    assert [(d.kind, d.jobs) for d in spec.scheduling.dependencies] == [
        ("afterok", ["t0", "t1"]), ("afternotok", ["j9"])]
    assert spec.scheduling.any_dependency
    bad = parse(["--dependency=afterok:nope", "--gres=gpu:1", "job.sh"], {}, lambda p: SCRIPT)
    with pytest.raises(CompatError, match="Job dependency problem"):
        to_job_spec(bad.request, bad.script, COMPAT, caller_team="vision", resolve=lambda r: [])


def test_output_error_exclusive_become_batch_options() -> None:
    spec = spec_for(["-o", "logs/%x-%j.out", "-e", "/scratch/%j.err", "--exclusive",
                     "--mail-type=END", "--mail-user=ada@example.org", "--gres=gpu:8", "job.sh"])
    checked = JobSpec.model_validate(spec)
    assert checked.entrypoint.batch is not None
    assert checked.entrypoint.batch.output == "/home/u/logs/%x-%j.out"  # the submit dir's
    assert checked.entrypoint.batch.error == "/scratch/%j.err"
    assert checked.entrypoint.batch.exclusive and checked.backend == "slurm"
    options = json.loads(checked.annotations[ANNOTATION])["options"]
    assert (options["mail_type"], options["mail_user"]) == ("END", "ada@example.org")
    assert JobSpec.model_validate(spec_for(["--gres=gpu:8", "job.sh"])).entrypoint.batch is None


def test_exclusive_is_refused_where_only_kubernetes_runs_it() -> None:
    compat = COMPAT.model_copy(update={"partitions": {
        **COMPAT.partitions, "k8s": COMPAT.partitions["a100"].model_copy(
            update={"backend": "k8s"})}})
    parsed = parse(["-p", "k8s", "--exclusive", "--gres=gpu:8", "job.sh"], {}, lambda path: SCRIPT)
    with pytest.raises(CompatError, match="--exclusive: partition k8s runs on Kubernetes"):
        to_job_spec(parsed.request, parsed.script, compat, caller_team="vision")
    parsed = parse(["-p", "k8s", "-o", "o.txt", "--gres=gpu:8", "job.sh"], {}, lambda path: SCRIPT)
    assert to_job_spec(parsed.request, parsed.script, compat, caller_team="vision",
                       submit_dir="/w")["entrypoint"]["batch"] == {"output": "/w/o.txt"}


@pytest.mark.parametrize("path", ["out file.txt", "/tmp/$(id).out", "a\nb"])
def test_unsafe_output_paths_are_refused(path: str) -> None:
    with pytest.raises(CompatError, match="--output"):
        spec_for([f"--output={path}", "--gres=gpu:8", "job.sh"])


@pytest.mark.parametrize("text", ["now+999999999week", "now+" + "9" * 5000, "0-300000000",
                                  "1-" + "9" * 5000])
def test_huge_begin_and_array_values_are_sbatch_errors_not_crashes(text: str) -> None:
    from datetime import UTC, datetime

    from broker.sbatch.values import SbatchError, parse_array, parse_begin

    with pytest.raises(SbatchError):
        if text.startswith("now"):
            parse_begin(text, datetime.now(UTC))
        else:
            parse_array(text)


@pytest.mark.parametrize(("mail_type", "events"), [
    ("END", ["cancelled", "failed", "succeeded"]),
    ("BEGIN,FAIL", ["failed", "started"]),
    ("requeue", ["preempted", "requeued"]),
    ("ALL", sorted(k.value for k in NoticeKind)),
], ids=["end", "begin-fail", "requeue-any-case", "all"])
def test_mail_options_become_the_jobs_notices(mail_type: str, events: list[str]) -> None:
    spec = JobSpec.model_validate(spec_for([f"--mail-type={mail_type}",
                                            "--mail-user=ada@example.org", "--gres=gpu:8",
                                            "job.sh"]))
    assert spec.notify is not None
    assert spec.notify.emails == ["ada@example.org"]
    assert sorted(k.value for k in spec.notify.events) == events


@pytest.mark.parametrize("args", [
    ["--mail-type=END"], ["--mail-user=ada@example.org"],
    ["--mail-type=NONE", "--mail-user=ada@example.org"],
], ids=["type-without-user", "user-without-type", "none"])
def test_mail_options_alone_ask_for_nothing(args: list[str]) -> None:
    assert "notify" not in spec_for([*args, "--gres=gpu:8", "job.sh"])


@pytest.mark.parametrize(("args", "match"), [
    (["--mail-type=SOMETIMES", "--mail-user=ada@example.org"], "--mail-type: unknown type"),
    (["--mail-type=END", "--mail-user=ada"], "--mail-user: 'ada' is not a mail address"),
], ids=["bad-type", "bad-user"])
def test_bad_mail_options_are_refused_by_name(args: list[str], match: str) -> None:
    parsed = parse([*args, "--gres=gpu:8", "job.sh"], {}, lambda path: SCRIPT)
    with pytest.raises(CompatError, match=match):
        to_job_spec(parsed.request, parsed.script, COMPAT, caller_team="vision")


def test_the_options_tools_emit_are_accepted_with_their_meaning_or_kept() -> None:
    """--nice, --gpu-bind, --gres-flags are kept (shown in the request annotation) and
    --mem=0 (a node's whole memory) asks for no fixed amount; --ntasks-per-gpu gives
    that many tasks per GPU on each node, as sbatch starts them."""
    spec = spec_for(["-N", "2", "--gres=gpu:4", "--nice=10", "--gpu-bind=closest",
                     "--gres-flags=enforce-binding", "--mem=0", "--ntasks-per-gpu=2",
                     "job.sh"])
    checked = JobSpec.model_validate(spec)
    assert (checked.gang.replicas, checked.gang.gpus_per_replica) == (2, 4)
    assert checked.gang.tasks_per_replica == 8
    assert checked.gang.memory_per_replica is None
    kept = json.loads(checked.annotations[ANNOTATION])["options"]
    assert (kept["nice"], kept["gpu_bind"], kept["gres_flags"]) == (
        "10", "closest", "enforce-binding")


@pytest.mark.parametrize(
    ("args", "match"),
    [(["--ntasks-per-gpu=0"], "--ntasks-per-gpu=0: give a whole number"),
     (["--ntasks-per-gpu=2", "--ntasks-per-node=3"], "is 8 tasks a node, not "
      "--ntasks-per-node=3")],
    ids=["zero", "disagrees"],
)
def test_ntasks_per_gpu_refusals_name_the_option(args: list[str], match: str) -> None:
    with pytest.raises(CompatError) as err:
        spec_for(["--gres=gpu:4", *args, "job.sh"])
    assert match in str(err.value)


def _vision_may_pass(*options: str) -> Callable[[str], list[str]]:
    """The policy the server gives to_job_spec: team vision's options, nobody else's."""
    return lambda team: list(options) if team == "vision" else []


def native_spec_for(argv: list[str], *options: str) -> dict:
    parsed = parse(argv, {}, lambda path: SCRIPT)
    return to_job_spec(parsed.request, parsed.script, COMPAT, caller_team="vision",
                       native_allowed=_vision_may_pass(*options))


def test_an_option_the_team_may_pass_goes_to_slurm_as_written() -> None:
    """Not translated by Isthmus, allowed by the team's policy: native.slurm.options, and the
    job narrowed to Slurm, where sbatch reads it."""
    spec = native_spec_for(["--gres=gpu:8", "--reservation=maint", "-L", "fluent:2",
                            "--delay-boot=10", "job.sh"],
                           "--reservation", "--licenses", "--delay-boot")
    checked = JobSpec.model_validate(spec)
    assert checked.native is not None and checked.native.slurm is not None
    assert checked.native.slurm.options == ["--delay-boot=10", "--licenses=fluent:2",
                                            "--reservation=maint"]
    assert checked.backend == "slurm"


@pytest.mark.parametrize(
    "option",
    ["--prefer=ib", "--reservation=maint", "--licenses=fluent:2", "--tmp=10G",
     "--network=sn_all", "--mcs-label=cv", "--deadline=now+1hour", "--delay-boot=10",
     "--nice=10", "--gres-flags=enforce-binding", "--wckey=cv", "--acctg-freq=task=30",
     "--profile=task"],
    ids=lambda o: o.split("=")[0].removeprefix("--"),
)
def test_every_option_isbatch_does_not_translate_passes_when_allowed(option: str) -> None:
    name = option.split("=")[0]
    spec = JobSpec.model_validate(native_spec_for(["--gres=gpu:8", option, "job.sh"], name))
    assert spec.native is not None and spec.native.slurm is not None
    assert spec.native.slurm.options == [option] and spec.backend == "slurm"


def test_an_option_kept_without_effect_passes_once_the_team_may_pass_it() -> None:
    assert "native" not in native_spec_for(["--gres=gpu:8", "--nice=10", "job.sh"])
    spec = native_spec_for(["--gres=gpu:8", "--nice=10", "--wckey=cv", "job.sh"], "--nice")
    assert spec["native"] == {"slurm": {"options": ["--nice=10"]}}
    assert spec["backend"] == "slurm"
    kept = json.loads(spec["annotations"][ANNOTATION])["options"]
    assert kept["wckey"] == "cv"  # not allowed: kept in the annotation, as before


def test_an_option_the_team_may_not_pass_is_refused_naming_it_and_the_policy_key() -> None:
    with pytest.raises(CompatError) as err:
        native_spec_for(["--gres=gpu:8", "--reservation=maint", "--tmp=10G", "job.sh"],
                        "--tmp")
    text = str(err.value)
    assert text.startswith("--reservation: not supported by Isthmus, and team vision may not "
                           "pass it to Slurm natively (nothing was submitted)"), text
    assert "isthmus.yaml teams[].native.slurm.options (allowed now: --tmp)" in text


def test_an_option_no_team_may_pass_is_refused_as_before() -> None:
    with pytest.raises(CompatError, match=r"^--nodelist: not supported by Isthmus \(nothing"):
        native_spec_for(["--gres=gpu:8", "-w", "node1", "job.sh"], "--reservation")


def test_translated_options_keep_their_translation_whatever_the_policy() -> None:
    """--qos and --constraint may pass natively through the API, but isbatch maps them."""
    spec = native_spec_for(["-p", "gpu", "--gres=gpu:8", "-q", "urgent", "-C", "h100",
                            "job.sh"], "--qos", "--constraint")
    assert "native" not in spec
    assert (spec["priority"], spec["flavors"], spec["backend"]) == ("high", ["h100-80g"], "any")


def test_a_kubernetes_partition_refuses_an_option_only_slurm_reads() -> None:
    compat = COMPAT.model_copy(update={"partitions": {
        **COMPAT.partitions, "k8s": COMPAT.partitions["a100"].model_copy(
            update={"backend": "k8s"})}})
    parsed = parse(["-p", "k8s", "--gres=gpu:8", "--reservation=maint", "--nice=5", "job.sh"],
                   {}, lambda path: SCRIPT)
    with pytest.raises(CompatError, match=r"^--reservation: partition k8s runs on Kubernetes"):
        to_job_spec(parsed.request, parsed.script, compat, caller_team="vision",
                    native_allowed=_vision_may_pass("--reservation", "--nice"))
    kept = parse(["-p", "k8s", "--gres=gpu:8", "--nice=5", "job.sh"], {}, lambda path: SCRIPT)
    spec = to_job_spec(kept.request, kept.script, compat, caller_team="vision",
                       native_allowed=_vision_may_pass("--nice"))
    assert "native" not in spec and spec["backend"] == "k8s"  # kept without effect, as before


@pytest.mark.parametrize("value", ["maint window", "a;rm -rf /", "$(id)", "x" * 300])
def test_a_value_that_cannot_pass_as_data_is_refused_naming_the_option(value: str) -> None:
    with pytest.raises(CompatError, match=r"^--reservation=.*: cannot pass to Slurm: write"):
        native_spec_for(["--gres=gpu:8", f"--reservation={value}", "job.sh"], "--reservation")
