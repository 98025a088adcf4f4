"""`make demo` end to end: the synthesized state machine driving real local training through the launcher."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from localrun.aws.cfn import Assembly, Resolver
from localrun.aws.construct_paths import Functions
from localrun.backends import netns
from localrun.backends import sagemaker as sagemaker_local
from localrun.demo.cli import run_demo
from localrun.demo.faults import BURST
from localrun.demo.new_data import trigger_of
from tests.conftest import APPROVER, RUN_EMAIL, hosts_left_running

pytestmark = pytest.mark.slow
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _input(**overrides: Any) -> dict[str, Any]:
    hyperparameters = {
        "max_steps": 60,
        "batch_size": 8,
        "seq_len": 128,
        "lr": 0.003,
        "optim.warmup_steps": 10,
        "checkpoint.interval_steps": 20,
        "eval.interval_steps": 30,
        "eval.max_sequences": 64,
        "metrics.log_interval": 5,
    }
    execution_input = {
        "run_name": "demo-test",
        "model": "tiny",
        "dataset": "fsx:///datasets/demo-corpus/",
        "instance_type": "ml.m5.xlarge",
        "instance_count": 2,
        "distribution": "ddp",
        "spot": True,
        "max_runtime_hours": 1,
        "hyperparameters": hyperparameters,
        "quality": {"metric": "validation:loss", "max": 4.0},
        "notify": [RUN_EMAIL],
    }
    for key, value in overrides.items():
        if key == "hyperparameters":
            hyperparameters.update(value)
        else:
            execution_input[key] = value
    return execution_input


def _demo(platform: Any, tmp_path: Path, execution_input: dict[str, Any], **options: Any) -> Any:
    arguments: dict[str, Any] = {
        "auto_approve": True,
        "reject": None,
        "spot_interrupt": False,
        "approver": APPROVER,
        "wait_seconds": 1.0,
    }
    outcome = run_demo(
        execution_input=execution_input,
        out=tmp_path,
        assembly=Path(platform.assembly.directory),
        **(arguments | options),
    )
    assert hosts_left_running(tmp_path) == []
    return outcome


def _model_package_group(platform: Any) -> str:
    """The group Register registers into, as its function's environment in the assembly names it."""
    assembly = Assembly.load(Path(platform.assembly.directory))
    functions = Functions(assembly, Resolver(assembly))
    return functions.environment(functions.named("Register"))["MODEL_PACKAGE_GROUP"]


def _ledgers(lineage: dict[str, Any], *, jobs: int) -> list[dict[str, Any]]:
    """The run's goodput ledgers from its lineage, each checked: the measured parts sum to the billed time within
    1%, and the trainer's phases cover most of the time its container ran (`other` is what they do not)."""
    ledgers = lineage["goodput"]["jobs"]
    assert len(ledgers) == jobs
    for ledger in ledgers:
        billed = ledger["billed_seconds"]
        assert billed > 0 and abs(sum(ledger["parts"].values()) - billed) <= 0.01 * billed, ledger
        assert abs(ledger["unaccounted_seconds"]) <= 0.01 * billed, ledger
        assert ledger["parts"]["other"] <= 0.4 * billed, ledger  # a short local job's exits are seconds
        assert ledger["goodput"] == round(ledger["parts"]["productive"] / billed, 4)
    return ledgers


def _states(outcome: Any) -> list[str]:
    return [name for name, _ in outcome.states]


def test_happy_path_trains_registers_and_promotes(
    platform: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outcome = _demo(platform, tmp_path, _input())
    assert outcome.described["status"] == "SUCCEEDED", outcome.described
    assert _states(outcome)[-5:] == [
        "Promotion approved?",
        "Verify model bytes",
        "Approve model",
        "Notify success",
        "Model promoted",
    ]
    (job,) = outcome.job_names
    # The execution's own folder, named by the execution: another run of the input writes beside it.
    run = outcome.run_dir
    assert run.parent == tmp_path and run.name == outcome.execution_arn.rsplit(":", 1)[-1] != "demo-test"
    jobs = run / "jobs" / job
    # Two hosts formed one job; rank 0 wrote the model and the loss fell.
    host1 = jobs / "gen-0" / "algo-1"
    assert (host1 / "model" / "model.safetensors").stat().st_size > 0
    assert json.loads((host1 / "model" / "config.json").read_text())
    log = (run / f"{job}.log").read_text()
    losses = [float(m) for m in re.findall(r"\bstep=\d+ loss=(\S+)", log)]
    assert losses[-1] < losses[0] - 1.0
    assert "host algo-1 is node 0 of 2" in log and "rank 0/2 on cpu (backend gloo)" in log
    with tarfile.open(jobs / "model.tar.gz") as tar:  # what SageMaker uploads as ModelArtifacts
        assert {"model.safetensors", "config.json"} <= set(tar.getnames())
    # The report: states with durations, metrics, loss curve, lineage.
    report = outcome.report.read_text()
    assert "Outcome: **SUCCEEDED**" in report and "| Validate request | 1 |" in report
    # The polling loop's states are one row each, with how often each was entered.
    (polled,) = [line for line in report.splitlines() if line.startswith("| Check progress |")]
    assert polled.startswith(f"| Check progress | {_states(outcome).count('Check progress')} | ")
    assert (run / f"{job}-loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lineage = json.loads((run / "lineage.json").read_text())
    assert lineage["training_job"] == job
    assert lineage["metrics"]["validation:loss"] < 4.0
    assert lineage["checkpoints"]["step"] == 60
    assert lineage["model_artifacts"].endswith(f"{job}/output/model.tar.gz")
    # The job's data, checkpoints and model moved as its execution role, under enforced IAM.
    (training_role,) = [line for line in report.splitlines() if line.startswith("| TrainingExecutionRole")]
    assert "s3:PutObject" in training_role and "s3:ListBucket" in training_role
    assert "| TrainingPipelineRole" in report and "sagemaker:CreateTrainingJob" in report
    assert "Denied: 0" in report
    if netns.available():  # the two hosts trained in a loopback-only network, as EnableNetworkIsolation asks
        assert "Note: network isolation: the hosts share a network namespace with loopback only" in report
    # What ran in place of the request, old -> new.
    assert "| instances | 2 x ml.m5.xlarge | 2 CPU processes on this machine (gloo over loopback) |" in report
    assert "| dataset | fsx:///datasets/demo-corpus/ | the generated demo corpus (" in report
    assert "Status: completed\n" in report
    # The terminal: the state trace (a polling loop once), compact progress and a summary; no job internals.
    out = capsys.readouterr().out
    trace = [line.split("> ", 1)[1] for line in out.splitlines() if re.match(r"\[\s*\d+\.\ds\] > ", line)]
    assert trace[:3] == ["Handed over?", "Receive input", "Validate request"] and trace[-1] == "Model promoted"
    assert trace.count("Check progress") == 1 < _states(outcome).count("Check progress")
    progress = re.findall(r"^ +step +(\d+)  loss \d\.\d{3} +[\d,]+ tokens/s$", out, re.MULTILINE)
    assert progress and all(int(b) - int(a) >= 20 for a, b in itertools.pairwise(progress))
    assert "validation loss" in out
    assert "approval needed: promotion gate of demo-test" in out
    assert f"outcome:       SUCCEEDED\nreport:        {outcome.report}\n" in out
    assert re.search(r"^goodput: +\d+\.\d% of [\d.]+ billed instance-seconds \(.*productive", out, re.MULTILINE)
    # Where the job's billed time went: measured parts that add up to it.
    (ledger,) = _ledgers(lineage, jobs=1)
    assert ledger["job"] == job and ledger["starts"] == 1 and ledger["parts"]["productive"] > 0
    assert ledger["parts"]["stalls"] == 0 and ledger["parts"]["rework"] == 0 and ledger["parts"]["upload"] > 0
    assert "## Goodput" in report
    assert re.search(r"^model package: arn:aws:sagemaker:\S+/1 \(approved\)$", out, re.MULTILINE)
    assert re.search(r"^cost estimate: at most \$[\d.]+ on demand, spot ", out, re.MULTILINE)
    # What the run cost: the job's billed seconds at the estimate's list price per hour, in the report and the summary.
    hourly = json.loads(report.split("## Cost estimate\n\n```json\n", 1)[1].split("```", 1)[0])["hourly_usd"]
    billed = lineage["cost"]["billable_seconds"]
    actual = round(hourly * billed / 3600, 4)
    assert 0 < actual < 1 and lineage["cost"]["actual_usd"] == actual
    assert f"\n## Actual cost\n\n${actual:.4f} at list price" in report
    assert f"\n| {job} | {billed} | ${actual:.4f} | ${actual:.4f} | $0.0000 |\n" in report  # spot saves nothing here
    assert f"\nactual cost:   ${actual:.4f} at list price (1 job, {billed} s of billed cluster time)\n" in out
    assert "## States" not in out and "--" not in out and "Traceback" not in out


def test_a_heterogeneous_cluster_trains_on_its_training_group_only(platform: Any, tmp_path: Path) -> None:
    """An auxiliary group first, as the input lists it: the training group's hosts still form the job."""
    execution_input = _input(run_name="demo-hetero", spot=False, hyperparameters={"max_steps": 20})
    del execution_input["instance_type"], execution_input["instance_count"]
    execution_input["instance_groups"] = [
        {"name": "cpu", "instance_type": "ml.c5.2xlarge", "instance_count": 1, "role": "auxiliary"},
        {"name": "train", "instance_type": "ml.m5.xlarge", "instance_count": 2},
    ]
    outcome = _demo(platform, tmp_path, execution_input)
    assert outcome.described["status"] == "SUCCEEDED", outcome.described
    (job,) = outcome.job_names
    jobs = outcome.run_dir / "jobs" / job
    config = json.loads((jobs / "gen-0" / "algo-1" / "input" / "config" / "resourceconfig.json").read_text())
    assert config["current_group_name"] == "cpu" and [g["hosts"] for g in config["instance_groups"]] == [
        ["algo-1"],
        ["algo-2", "algo-3"],
    ]
    auxiliary = (jobs / "logs" / "algo-1-gen0.log").read_text()
    assert "host is auxiliary (group cpu)" in auxiliary and "the training ended" in auxiliary
    trained = (jobs / "logs" / "algo-2-gen0.log").read_text()
    assert "host algo-2 is node 0 of 2" in trained and "step=20 loss=" in trained
    assert (jobs / "gen-0" / "algo-2" / "model" / "model.safetensors").stat().st_size > 0
    lineage = json.loads((outcome.run_dir / "lineage.json").read_text())
    assert [g["name"] for g in lineage["cluster"]["groups"]] == ["cpu", "train"]


def test_the_fine_tuning_example_trains_a_model_folder_and_registers_the_folder_it_exports(
    platform: Any, tmp_path: Path
) -> None:
    """examples/finetune-llama.json: the demo seeds a generated model folder and chat records; Validate reads them,
    two hosts fine-tune with FSDP, the job exports a model folder that transformers loads, and the lineage names the
    base model's digest and the exported folder. A spot interruption on the way resumes from the checkpoint."""
    transformers = pytest.importorskip("transformers")
    execution_input = json.loads((EXAMPLES / "finetune-llama.json").read_text()) | {"notify": [RUN_EMAIL]}
    outcome = _demo(platform, tmp_path, execution_input, spot_interrupt=True)
    assert outcome.described["status"] == "SUCCEEDED", outcome.described
    lineage = json.loads((outcome.run_dir / "lineage.json").read_text())
    assert lineage["base_model"]["uri"] == execution_input["init_from"]
    assert lineage["base_model"]["architecture"] == "LlamaForCausalLM" and lineage["base_model"]["objects"] >= 5
    assert len(lineage["base_model"]["versions_sha256"]) == 64
    assert lineage["fine_tuned_model"].endswith("model.tar.gz (hf/)")
    assert lineage["hyperparameters"]["model.init_from"] == "base_model"
    report = outcome.report.read_text()
    (folder,) = re.findall(r"Fine-tuned model folder: `([^`]+)`", report)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    assert model.config.architectures == ["LlamaForCausalLM"]
    assert "Interrupted after step" in report


def test_a_burst_of_faults_at_the_progress_handler_is_ridden_through(
    platform: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outcome = _demo(platform, tmp_path, _input(spot=False), fault="monitor-throttle")
    assert outcome.described["status"] == "SUCCEEDED", outcome.described
    assert "Record orchestration failure" not in _states(outcome)
    burst = len(BURST)
    assert f"monitor-throttle: handler failures: {burst} TransientError; {burst} retries" in capsys.readouterr().out


def test_spot_interruption_resumes_from_the_checkpoint(
    platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reclaim comes once the platform recorded a checkpoint, with steps still to go, however late the record
    comes: here 20 s after the run starts, by when a fast machine has trained all 60 steps."""
    recorded, started = sagemaker_local.recorded_checkpoints, time.monotonic()

    def recorded_late(*args: Any) -> Any:
        return recorded(*args) if time.monotonic() - started > 20 else []

    monkeypatch.setattr(sagemaker_local, "recorded_checkpoints", recorded_late)
    outcome = _demo(platform, tmp_path, _input(run_name="demo-spot"), spot_interrupt=True)
    assert outcome.described["status"] == "SUCCEEDED", outcome.described
    (job,) = outcome.job_names  # SageMaker's managed spot restarts the same job
    jobs = outcome.run_dir / "jobs" / job
    assert (jobs / "gen-1" / "algo-1" / "model" / "model.safetensors").exists()  # the fresh hosts finished
    resumed = re.search(r"resumed from checkpoint step-(\d+)", (jobs / "logs" / "algo-1-gen1.log").read_text())
    assert resumed is not None and int(resumed.group(1)) >= 20
    steps = [int(s) for s in re.findall(r"\bstep=(\d+) loss=", (jobs / "logs" / "algo-1-gen1.log").read_text())]
    assert steps and min(steps) > int(resumed.group(1))  # no step before the checkpoint is trained again
    lineage = json.loads((outcome.run_dir / "lineage.json").read_text())
    assert lineage["cluster"]["interruptions"] == 1
    report = outcome.report.read_text()
    assert "Training -> Interrupted -> Downloading -> Training -> Uploading -> Completed" in report
    # The report (and the loss plot, from the same pairs) marks the interruption and the step resumed from.
    marked = re.search(r"Interrupted after step (\d+); resumed from the checkpoint of step (\d+)", report)
    assert marked is not None and int(marked.group(1)) > 0 and int(marked.group(2)) == int(resumed.group(1))
    # The ledger: two starts, the reclaim a stall, and the steps taken again after the resume rework.
    (ledger,) = _ledgers(lineage, jobs=1)
    assert ledger["starts"] == 2 and ledger["parts"]["stalls"] > 0 and ledger["parts"]["productive"] > 0
    interrupted, resumed_from = int(marked.group(1)), int(marked.group(2))
    assert (ledger["parts"]["rework"] > 0) == (interrupted > resumed_from)


def test_a_hung_worker_fails_its_job_with_hang_detected_and_a_new_job_resumes_from_the_checkpoint(
    platform: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One host; after the first recorded checkpoint its training worker is stopped mid-run (SIGSTOP). The demo
    # sets the hang check's floor to 6 s. The local SageMaker holds the hosts from the first checkpoint it sees
    # until the Monitor has recorded it. It looks every 0.05 s, but a loaded machine can delay it by seconds:
    # 300 steps (over 10 s on this machine) leave it that long to see one before the run ends.
    hyperparameters = {"checkpoint.interval_steps": 10, "max_steps": 300}
    execution_input = _input(run_name="demo-hang", instance_count=1, spot=False, hyperparameters=hyperparameters)
    outcome = _demo(platform, tmp_path, execution_input, hang=True)
    assert outcome.described["status"] == "SUCCEEDED", outcome.described
    first, second = outcome.job_names
    jobs = outcome.run_dir / "jobs"
    failure = (jobs / first / "gen-0" / "algo-1" / "output" / "failure").read_text().splitlines()[0]
    hung = re.fullmatch(r"HangDetected: no training step for (\d+) s after step (\d+) on algo-1", failure)
    assert hung is not None and 6 <= int(hung.group(1)) <= 20, failure
    # The new job resumed from a checkpoint the first one committed before it hung, and finished.
    log = (jobs / second / "logs" / "algo-1-gen0.log").read_text()
    resumed = re.search(r"resumed from checkpoint step-(\d+)", log)
    assert resumed is not None and 10 <= int(resumed.group(1)) <= int(hung.group(2)), log[-3000:]
    assert (jobs / second / "gen-0" / "algo-1" / "model" / "model.safetensors").exists()
    report = outcome.report.read_text()
    assert "HangDetected" in report
    # The terminal says why the second job was started, once, as the report does.
    told = [line.strip() for line in capsys.readouterr().out.splitlines() if "fresh instances" in line]
    assert len(told) == 1 and told[0].startswith("retrying: attempt 2, a new job on fresh instances, after "), told
    assert told[0].endswith(failure), told
    # What the run cost is both jobs' billed time: the hung one's too.
    charged = report.split("\n## Actual cost\n", 1)[1].split("\n## ", 1)[0]
    assert f"\n| {first} | " in charged and f"\n| {second} | " in charged, charged
    # The lineage records that same total, as the model package does.
    recorded = json.loads((outcome.run_dir / "lineage.json").read_text())["cost"]["actual_usd"]
    assert charged.startswith(f"\n${recorded:.4f} at list price"), (recorded, charged)
    # The hung job's ledger: the time without a step is a stall, not training.
    hung_ledger, resumed_ledger = _ledgers(json.loads((outcome.run_dir / "lineage.json").read_text()), jobs=2)
    stalls, other = hung_ledger["parts"]["stalls"], hung_ledger["parts"]["other"]
    assert hung_ledger["job"] == first and stalls > 0
    assert stalls == pytest.approx(min(int(hung.group(1)), stalls + other), abs=0.01)
    assert resumed_ledger["job"] == second and resumed_ledger["parts"]["productive"] > 0


def test_rejection_ends_the_run_with_who_and_why(platform: Any, tmp_path: Path) -> None:
    """An input over the approval threshold meets both gates; `--reject promotion` lets it launch, then rejects."""
    execution_input = _input(
        run_name="demo-reject",
        instance_type="ml.p5.48xlarge",
        max_runtime_hours=3,  # 2 x ml.p5.48xlarge x 3 h: over the default 500 USD threshold
        hyperparameters={"max_steps": 20},
    )
    outcome = _demo(platform, tmp_path, execution_input, reject="promotion")
    assert outcome.described["status"] == "FAILED"
    assert outcome.described["error"] == "PromotionRejected"
    assert outcome.described["cause"] == f"Rejected by {APPROVER}: rejected in the demo (--reject promotion)"
    assert [d["gate"] for d in outcome.decisions] == ["launch", "promotion"]
    assert [d["decision"] for d in outcome.decisions] == ["approved", "rejected"]
    report = outcome.report.read_text()
    group = re.escape(_model_package_group(platform))
    assert re.search(rf"model-package/{group}/1: \*\*Rejected\*\*", report)


def test_the_launch_gate_can_be_rejected_and_an_example_reaches_it(
    platform: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    execution_input = json.loads((EXAMPLES / "batch-multi-node.json").read_text())
    execution_input["notify"] = [RUN_EMAIL]
    outcome = _demo(platform, tmp_path, execution_input, reject="launch")
    assert outcome.described["status"] == "FAILED" and outcome.described["error"] == "LaunchRejected"
    assert outcome.described["cause"] == f"Rejected by {APPROVER}: rejected in the demo (--reject launch)"
    assert outcome.job_names == [] and "Launch rejected" in _states(outcome)
    out = capsys.readouterr().out
    gate = out.index("approval needed: launch gate of batch-fsdp-2node")
    assert out.index("> Approval gate (pre-launch)\n") < gate < out.index("> Launch rejected\n")
    # moto's Step Functions logs the handled rejection at ERROR; the quiet demo does not show it.
    assert [r for r in caplog.records if r.name.startswith("moto")] == []
    assert "outcome:       FAILED: LaunchRejected: Rejected by" in out and "model package: none registered" in out
    assert re.search(r"cost estimate: at most \$[\d,.]+ on demand \(threshold \$500\.00: launch approval needed\)", out)


def test_the_capacity_fallback_example_falls_back_when_its_first_cluster_has_no_capacity(
    platform: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`make demo INPUT=examples/capacity-fallback.json ARGS='--fault insufficient-capacity'`, at 6 steps, one host."""
    execution_input = json.loads((EXAMPLES / "capacity-fallback.json").read_text()) | {"notify": [RUN_EMAIL]}
    outcome = _demo(platform, tmp_path, execution_input, fault="insufficient-capacity", steps=6, max_hosts=1)
    assert outcome.described["status"] == "SUCCEEDED", outcome.described
    first, second = outcome.job_names
    assert "Choose the next cluster" in _states(outcome)
    report = outcome.report.read_text()
    clusters = "2 x ml.p5.48xlarge: failed (CapacityError); 4 x ml.p4d.24xlarge: completed"
    assert f"Clusters (as requested; the local stand-ins below ran them): {clusters}" in report
    out = capsys.readouterr().out
    assert f"clusters:      {clusters}" in out
    assert f"insufficient-capacity: {first} on 2 x ml.p5.48xlarge: CapacityError: Unable to provision" in out
    assert "; trained on 4 x ml.p4d.24xlarge\n" in out
    # The terminal said so when the next attempt moved: onto the cluster the summary names.
    assert "retrying: attempt 2, a new job on the fallback cluster 4 x ml.p4d.24xlarge, after CapacityError" in out
    # The job without capacity was never billed; the one that trained was.
    charged = report.split("\n## Actual cost\n", 1)[1].split("\n## ", 1)[0]
    assert f"\n| {second} | " in charged and f"\n| {first} | " not in charged, charged


def test_the_retrain_example_is_started_by_the_s3_events_of_its_new_data(
    platform: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`make demo INPUT=examples/retrain-on-new-data.json` (--new-data, its default), at 40 steps on one host."""
    path = EXAMPLES / "retrain-on-new-data.json"
    trigger = trigger_of(path)
    outcome = _demo(platform, tmp_path, json.loads(path.read_text()), retrain=trigger, steps=40, max_hosts=1)
    # The sweep started it, as the trigger's template, under the name its window gives; the demo started nothing.
    assert outcome.described["name"].startswith("retrain-web-text-"), outcome.described["name"]
    started = json.loads(outcome.described["input"])
    assert "notify" not in started and started["run_name"] == "gpt2-124m-web-text"  # the demo's start adds notify
    out = capsys.readouterr().out
    assert re.search(r"new data: \d+ objects under incoming/web-text/, each an S3 event RetrainRecord recorded", out)
    assert "30 quiet minutes later (on the local clock) RetrainSweep started execution retrain-web-text-" in out
    assert "started execution" not in out.replace("RetrainSweep started execution", "")
    # It trained and was evaluated as any run is: 40 steps here leave its validation loss above the example's
    # quality bar (3.3), so the gate ends it there, as it would on AWS.
    (job,) = outcome.job_names
    assert "Status: completed\n" in outcome.report.read_text().split(f"## Training job {job}", 1)[1]
    described = outcome.described
    assert (described["status"], described.get("error")) == ("FAILED", "QualityBelowThreshold"), described


def test_failing_job_reports_the_failure_file(platform: Any, tmp_path: Path) -> None:
    # Passes Validate (a legal vocabulary size) but the corpus holds byte ids above it.
    outcome = _demo(platform, tmp_path, _input(run_name="demo-fail", hyperparameters={"model.vocab_size": 200}))
    assert outcome.described["status"] == "FAILED"
    assert outcome.described["error"] == "TrainingJobFailed"
    (job,) = outcome.job_names
    failure = (outcome.run_dir / "jobs" / job / "gen-0" / "algo-1" / "output" / "failure").read_text()
    assert outcome.described["cause"] == f"AlgorithmError: {failure.splitlines()[0]}"
    assert "vocab" in failure.lower()
    assert "Training failed" in _states(outcome)


def test_local_scale_keeps_tiny_requests_and_shrinks_the_rest() -> None:
    from localrun.demo.cli import local_scale

    assert local_scale({"model": "tiny", "max_steps": "240"}, None) == {}
    scaled = local_scale({"model": "llama-1b", "max_steps": "60000", "optim.warmup_steps": "2000"}, None)
    assert scaled["model"] == "llama-tiny" and scaled["max_steps"] == "300"
    assert int(scaled["optim.warmup_steps"]) <= 30
    assert (
        local_scale({"model": "tiny", "max_steps": "500", "optim.warmup_steps": "100"}, None)["optim.warmup_steps"]
        == "30"
    )
    assert local_scale({"model": "gpt2", "distribution": "smddp"}, 50)["distribution"] == "ddp"


def test_local_stand_ins_name_what_was_scaled_old_to_new() -> None:
    from localrun.demo.cli import local_scale, local_stand_ins

    execution_input = json.loads((EXAMPLES / "multi-node-fsdp-spot.json").read_text())
    requested = {
        k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in execution_input["hyperparameters"].items()
    }
    scaled = local_scale(requested | {"model": execution_input["model"]}, None)
    stand_ins = {
        s.what: (s.requested, s.local)
        for s in local_stand_ins(execution_input, scaled, max_hosts=2, corpus="the corpus")
    }
    assert stand_ins["instances"] == ("4 x ml.p5.48xlarge", "2 CPU processes on this machine (gloo over loopback)")
    assert stand_ins["dataset"] == ("fsx:///datasets/fineweb-edu-100B/", "the corpus")
    assert stand_ins["hyperparameter model"] == ("llama-1b", "llama-tiny")
    assert stand_ins["hyperparameter max_steps"] == ("60000", "300")
    assert stand_ins["hyperparameter seq_len"] == ("2048", "128")
    assert "hyperparameter batch_size" not in stand_ins  # 8 in the input and here: nothing stood in
    hetero = json.loads((EXAMPLES / "heterogeneous-cluster.json").read_text())
    groups = [s for s in local_stand_ins(hetero, {}, max_hosts=2, corpus="c") if s.what.startswith("instances")]
    assert [(s.what, s.requested) for s in groups] == [
        ("instances (group gpu)", "2 x ml.p4d.24xlarge"),
        ("instances (group cpu)", "1 x ml.c5.4xlarge"),
    ]


def test_a_tuning_job_trains_its_trials_for_real_and_registers_the_best(
    platform: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tuning = {
        "ranges": {
            "lr": {"type": "continuous", "min": 0.001, "max": 0.01, "scaling": "Logarithmic"},
            "batch_size": {"type": "categorical", "values": [4, 8]},
        },
        "objective": {"metric": "validation:loss"},
        "max_jobs": 3,
        "max_parallel_jobs": 2,
    }
    hyperparameters = {"max_steps": 30, "eval.interval_steps": 15, "checkpoint.interval_steps": 15}
    execution_input = _input(instance_count=1, hyperparameters=hyperparameters, tuning=tuning)
    del execution_input["hyperparameters"]["lr"], execution_input["hyperparameters"]["batch_size"]
    outcome = _demo(platform, tmp_path, execution_input)

    assert outcome.described["status"] == "SUCCEEDED", outcome.described
    assert "Create tuning job" in _states(outcome) and len(outcome.job_names) == 3
    lineage = json.loads((outcome.run_dir / "lineage.json").read_text())
    record = lineage["tuning"]
    assert record["best_training_job"] == lineage["training_job"] in outcome.job_names
    assert record["trials_completed"] == 3
    # The best is the lowest validation loss the trainers really reported, with the values it ran.
    losses = {}
    for job in outcome.job_names:
        log = (outcome.run_dir / f"{job}.log").read_text()
        losses[job] = float(re.findall(r"\bstep=\d+ val_loss=(\S+)", log)[-1])
        # The trainer accepts what SageMaker adds to a trial's hyperparameters.
        config = json.loads(
            (
                outcome.run_dir / "jobs" / job / "gen-0" / "algo-1" / "input" / "config" / "hyperparameters.json"
            ).read_text()
        )
        assert config["_tuning_objective_metric"] == "validation:loss"
    assert record["best_training_job"] == min(losses, key=lambda j: losses[j])
    assert record["objective_value"] == pytest.approx(losses[record["best_training_job"]])
    assert lineage["hyperparameters"]["lr"] == record["hyperparameters"]["lr"]
    # Every trial has its ledger, its phases from its own checkpoint folder's progress records.
    ledgers = _ledgers(lineage, jobs=3)
    assert sorted(ledger["job"] for ledger in ledgers) == sorted(outcome.job_names)
    assert all(ledger["starts"] == 1 and ledger["parts"]["productive"] > 0 for ledger in ledgers)
    report = outcome.report.read_text()
    assert "Denied: 0" in report
    # A trial table: name, the values it ran, its objective and its status.
    assert "| Trial | Hyperparameters | Objective | Status |" in report
    for job in outcome.job_names:
        assert re.search(
            rf"^\| {job} \| batch_size=\d, lr=\S+ \| {losses[job]:.4f} \| completed \|$", report, re.MULTILINE
        )
    # Every trial's loss on one chart beside the report.
    assert "![loss across the run's jobs](run-loss.png)" in report
    assert (outcome.run_dir / "run-loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The best trial named, with its objective: in the report and in the terminal's summary.
    best = f"{record['best_training_job']} (validation:loss {losses[record['best_training_job']]:.4f})"
    assert f"\nBest trial: {best}\n" in report
    out = capsys.readouterr().out
    assert f"\nbest trial:    {best}, of 3 trials\n" in out
    # What the run cost is every trial's billed time (SageMaker bills whole seconds; the ledgers measure fractions).
    cost = re.search(r"^actual cost:   \$0\.\d{4} at list price \(3 jobs, (\d+) s of billed cluster time\)$", out, re.M)
    assert cost is not None, out[-2000:]
    assert abs(int(cost.group(1)) - sum(ledger["billed_seconds"] / ledger["instances"] for ledger in ledgers)) <= 3


def test_batch_multi_node_example_runs_end_to_end_and_resumes_a_lost_node(platform: Any, tmp_path: Path) -> None:
    execution_input = json.loads((EXAMPLES / "batch-multi-node.json").read_text())
    execution_input["notify"] = [RUN_EMAIL]
    execution_input["hyperparameters"].update({"max_steps": 24, "checkpoint.interval_steps": 8})
    outcome = _demo(platform, tmp_path, execution_input, spot_interrupt=True)
    assert outcome.described["status"] == "SUCCEEDED", outcome.described
    states = _states(outcome)
    assert "Submit Batch job" in states and "Create training job" not in states
    (job,) = outcome.job_names
    report = outcome.report.read_text()
    # Batch retried the attempt whose host was lost; its nodes resumed from the checkpoints in S3.
    assert "AWS Batch attempt 1: Host EC2" in report and "AWS Batch attempt 2: Essential container" in report
    lineage = json.loads((outcome.run_dir / "lineage.json").read_text())
    assert lineage["training_job"] == job and lineage["cluster"]["interruptions"] == 1
    # Batch's statuses read as words, and the lost node's interruption and resume are marked.
    assert "Status: succeeded\n" in report and "(None)" not in report and "Secondary statuses" not in report
    assert re.search(r"Interrupted after step \d+; resumed from the checkpoint of step \d+\n", report)
    assert lineage["model_artifacts"].endswith(f"{job}/output/model.tar.gz")
    assert "| BatchClusterJobRole" in report and "Denied: 0" in report
    # Batch's two attempts are the ledger's two starts, the time between them a stall.
    (ledger,) = _ledgers(lineage, jobs=1)
    assert ledger["starts"] == 2 and ledger["parts"]["productive"] > 0


def test_a_gate_is_decided_with_tp_from_another_terminal(
    platform: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--decide-with-tp`: the demo prints how, and `tp` run as another process decides through the loopback URL."""
    execution_input = _input(run_name="demo-tp", hyperparameters={"max_steps": 20})
    finished: dict[str, Any] = {}
    demo = threading.Thread(
        target=lambda: finished.update(
            outcome=_demo(platform, tmp_path, execution_input, auto_approve=False, decide_with_tp=True)
        )
    )
    demo.start()
    shown = ""
    deadline = time.monotonic() + 240
    while "tp approve" not in shown:
        assert demo.is_alive() and time.monotonic() < deadline, shown
        time.sleep(0.2)
        shown += capsys.readouterr().out
    exported = re.search(r"export (.+)\n", shown)
    assert exported is not None
    terminal = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "TP_"))},
        **dict(pair.split("=", 1) for pair in exported.group(1).split()),
    }
    tp = [str(Path(sys.executable).with_name("tp"))]  # the console script make setup installs
    listed = subprocess.run(
        [*tp, "pending", "--json"], check=False, env=terminal, capture_output=True, text=True, timeout=120
    )
    assert listed.returncode == 0, listed.stderr
    (request,) = json.loads(listed.stdout)["pending"]
    assert request["gate"] == "promotion" and f"tp approve {request['request_id']}" in shown
    decided = subprocess.run(
        [*tp, "approve", request["request_id"], "--reason", "decided from a second terminal"],
        check=False,
        env=terminal,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert decided.returncode == 0, decided.stderr
    demo.join(timeout=240)
    outcome = finished["outcome"]
    assert outcome.described["status"] == "SUCCEEDED"
    ((gate, by, reason),) = [(d["gate"], d["by"], d["reason"]) for d in outcome.decisions]
    assert (gate, by, reason) == ("promotion", APPROVER, "decided from a second terminal")
    assert "-> approved by" in capsys.readouterr().out
