"""The AWS Batch backend, executed: submit + poll, nodes that really train on localhost, IAM enforced."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import boto3
import pytest
from botocore.client import BaseClient

from localrun.aws.cfn import REGION
from localrun.aws.clock import Clock
from localrun.aws.engine import LocalPlatform
from localrun.backends.batch import LocalBatch
from localrun.backends.scripted import ScriptedTraining
from localrun.demo.corpus import build_shards
from tests.conftest import hosts_left_running
from tests.pipeline.conftest import Pipeline
from tests.pipeline.test_iam_enforced import _assembly_with, _drop
from tools import run_state
from training import batch_contract

CLUSTER_TYPE = "ml.p5.48xlarge"  # cdk.json's network.largest_cluster: the compute environment's type
LOCAL = {"model": "tiny", "batch_size": "4", "seq_len": "64", "optim.warmup_steps": "2"}


class BatchPipeline(Pipeline):
    def __init__(self, local: LocalPlatform, batch: LocalBatch) -> None:
        super().__init__(local, ScriptedTraining(scripts=[]))
        self.batch = batch

    def batch_input(self, **overrides: Any) -> dict[str, Any]:
        return self.input(
            **{
                "backend": "batch",
                "instance_type": CLUSTER_TYPE,
                "instance_count": 2,
                "hyperparameters": {
                    "max_steps": 12,
                    "optim.warmup_steps": 2,
                    "checkpoint.interval_steps": 4,
                    "eval.interval_steps": 6,
                    "eval.max_sequences": 8,
                    "metrics.log_interval": 2,
                },
                "quality": {"metric": "validation:loss", "max": 20.0},
                **overrides,
            }
        )

    def approve_launch(self, arn: str) -> None:
        self.decide("launch", "approve")

    def last_poll(self) -> dict[str, Any]:
        """What PollBatchJob answered last."""
        name = self.local.functions.named("PollBatchJob").name
        return [c.result for c in self.local.lambda_calls if c.function == name and c.result][-1]  # type: ignore[no-any-return]

    def s3_keys(self, bucket_env: str, prefix: str) -> list[str]:
        bucket = self.local.environment("PollBatchJob")[bucket_env]
        listed = boto3.client("s3", region_name=REGION).list_objects_v2(Bucket=bucket, Prefix=prefix)
        return [o["Key"] for o in listed.get("Contents", [])]


@contextmanager
def called(*operations: str) -> Iterator[list[str]]:
    """The names of the calls of `operations` made meanwhile (by the state machine's SDK tasks), in order."""
    made: list[str] = []
    original = BaseClient._make_api_call

    def record(client: BaseClient, operation: str, params: dict[str, Any]) -> Any:
        if operation in operations:
            made.append(operation)
        return original(client, operation, params)

    with mock.patch.object(BaseClient, "_make_api_call", record):
        yield made


@pytest.fixture
def batch_factory(platform: Any, tmp_path: Path) -> Iterator[Any]:
    opened: list[LocalPlatform] = []
    shards = build_shards(tmp_path / "corpus")

    def make(assembly: Path | None = None, **scenario: Any) -> BatchPipeline:
        batch = LocalBatch(root=tmp_path / "batch", datasets_bucket="", local_hyperparameters=LOCAL, **scenario)
        local = LocalPlatform(
            assembly or Path(platform.assembly.directory),
            training=ScriptedTraining(scripts=[]),
            players={"batch": batch},
            clock=Clock(),
        )
        opened.append(local.__enter__())
        pipeline = BatchPipeline(local, batch)
        batch.datasets_bucket = pipeline.datasets_bucket
        s3 = boto3.client("s3", region_name=REGION)
        for shard in shards:
            s3.upload_file(str(shard), pipeline.datasets_bucket, f"corpus/{shard.name}")
        return pipeline

    yield make
    for local in opened:
        local.__exit__(None, None, None)
    assert hosts_left_running(tmp_path / "batch") == []


def test_happy_path_trains_on_batch_nodes_and_registers(batch_factory: Any) -> None:
    pipeline = batch_factory()
    arn = pipeline.start(pipeline.batch_input())
    pipeline.run_until(arn, "Approval gate (promotion)", timeout=240)
    pipeline.decide("promotion", "approve")
    described = pipeline.finish(arn)
    states = pipeline.local.states_entered(arn)
    assert described["status"] == "SUCCEEDED", (pipeline.error(described), states, pipeline.local.iam.denials())
    assert "Submit Batch job" in states and "Check progress (Batch)" in states
    assert "Create training job" not in states  # the SageMaker path was not taken
    (job,) = pipeline.batch.jobs.values()
    assert job.name.endswith("-1") and job.num_nodes == 2 and len(job.attempts) == 1
    # Two launchers, one torchrun job: node 1 joined node 0's rendezvous.
    assert any("node 1 of 2" in line for line in job.log), "".join(job.log[-20:])
    output = json.loads(described["output"])
    assert output["job"]["status"] == "Completed"
    assert "validation:loss" in output["job"]["final_metrics"]
    assert (
        output["job"]["model_artifacts"]
        == f"s3://{pipeline.local.environment('PollBatchJob')['ARTIFACTS_BUCKET']}/runs/{job.name}/output/model.tar.gz"
    )
    assert output["job"]["cost"]["spot_savings_usd"] == 0.0
    base = job.name.rsplit("-", 1)[0]
    assert any(k.endswith("manifest.json") for k in pipeline.s3_keys("CHECKPOINTS_BUCKET", f"runs/{base}/checkpoints/"))
    (package,) = pipeline.model_packages()
    assert package["InferenceSpecification"]["Containers"][0]["ModelDataUrl"] == output["job"]["model_artifacts"]
    assert pipeline.local.iam.denials() == []
    # `tp logs` finds each node's stream through its child job (<id>#<node>), as the awslogs driver writes them.
    session = boto3.Session(region_name=REGION)
    events = run_state.history(session.client("stepfunctions"), arn)
    streams = run_state.streams(session, events)
    assert sorted(s.host for s in streams) == ["node-0", "node-1"] and {s.job for s in streams} == {job.name}
    lines = [event["message"] for _, event in run_state.events_of(session.client("logs"), streams)]
    assert any("step=12 val_loss=" in line for line in lines), lines[-20:]
    # `tp watch` follows the Batch job: its status, its last logged step of the requested steps, its cost.
    watched = run_state.snapshot(session, arn)
    assert watched["job"] is not None, watched
    assert (watched["job"]["name"], watched["job"]["status"]) == (job.name, "Completed")
    assert (watched["job"]["step"], watched["job"]["max_steps"]) == (12, 12)
    assert watched["cost_so_far_usd"] is not None and watched["cost_so_far_usd"] >= 0


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"spot": True}, "AWS Batch runs multi-node parallel jobs on On-Demand instances only"),
        ({"warm_pool_minutes": 10}, "warm_pool_minutes: warm pools are SageMaker's"),
        ({"distribution": "smddp"}, "distribution 'smddp' needs SageMaker"),
        ({"instance_type": "ml.g5.2xlarge"}, "the AWS Batch compute environment runs ml.p5.48xlarge only"),
        ({"instance_count": 64}, "hold 4 nodes at most"),
    ],
)
def test_a_request_the_batch_path_cannot_run_is_rejected_before_anything_starts(
    batch_factory: Any, overrides: dict[str, Any], problem: str
) -> None:
    pipeline = batch_factory()
    arn = pipeline.start(pipeline.batch_input(**overrides))
    described = pipeline.finish(arn)
    assert pipeline.error(described)[0] == "InvalidRequest"
    assert problem in pipeline.error(described)[1]
    assert pipeline.batch.jobs == {}


def test_a_lost_node_is_retried_by_batch_and_resumes_from_the_checkpoints_in_s3(batch_factory: Any) -> None:
    pipeline = batch_factory(kill_node_after_checkpoint=1)
    execution_input = pipeline.batch_input()
    execution_input["hyperparameters"].update({"max_steps": 24, "eval.interval_steps": 12})
    arn = pipeline.start(execution_input)
    pipeline.run_until(arn, "Approval gate (promotion)", timeout=240)
    (job,) = pipeline.batch.jobs.values()
    assert [a.status_reason.split(" (")[0] for a in job.attempts] == ["Host EC2", "Essential container in task exited"]
    # The second attempt's nodes restored the run's checkpoints from S3 and went on from there.
    assert any("resumed from checkpoint step-" in line for line in job.log)
    output = pipeline.local.sfn.describe_execution(executionArn=arn)
    states = pipeline.local.states_entered(arn)
    assert states.count("Submit Batch job") == 1  # Batch retried the job itself: no second job
    job_progress = pipeline.last_poll()
    assert job_progress["interruptions"] == 1 and job_progress["status"] == "Completed"
    assert output["status"] == "RUNNING"


def test_no_capacity_in_time_submits_a_new_attempt_that_trains(batch_factory: Any) -> None:
    pipeline = batch_factory(no_capacity_for=1)
    arn = pipeline.start(pipeline.batch_input())
    pipeline.run_until(arn, "Approval gate (promotion)", timeout=240)
    states = pipeline.local.states_entered(arn)
    assert "Next attempt (Batch)" in states and "Tell the run why it retries (Batch)" in states
    first, second = sorted(pipeline.batch.jobs.values(), key=lambda j: j.name)
    assert (first.name[-2:], second.name[-2:]) == ("-1", "-2")
    # The stuck job was terminated before its replacement was submitted; the replacement trained.
    assert first.status == "FAILED" and first.status_reason.startswith("Stopped by the training platform: no capacity")
    assert second.status == "SUCCEEDED"
    (message,) = [m for m in pipeline.local.messages("TopicsRuns") if "retrying" in m.get("Subject", "")]
    assert json.loads(message["Message"])["error"] == "InsufficientCapacity"


def test_a_submit_whose_answer_was_lost_is_adopted_not_repeated(batch_factory: Any) -> None:
    pipeline = batch_factory(lose_submit_responses=1)
    arn = pipeline.start(pipeline.batch_input())
    pipeline.run_until(arn, "Approval gate (promotion)", timeout=240)
    states = pipeline.local.states_entered(arn)
    assert "Find submitted Batch job" in states and "Adopt the submitted Batch job" in states
    assert "Submit Batch job again" not in states
    assert len(pipeline.batch.jobs) == 1  # one cluster, not two


def test_a_refused_submit_is_neither_looked_for_nor_repeated_and_a_throttled_look_is_retried(
    batch_factory: Any,
) -> None:
    """A fault of the service (ServerException) may have made the job: the run looks for it, and its look, throttled
    (HTTP 429, Batch.AWSBatchException), is retried; a refused request (ClientException) made nothing: the run
    fails at once with Batch's cause."""
    pipeline = batch_factory()
    faults = pipeline.local.faults
    faults.sdk_errors.update(SubmitJob=["ServerException", "ClientException"], ListJobs=["TooManyRequestsException"])
    with called("SubmitJob") as calls:
        arn = pipeline.start(pipeline.batch_input())
        described = pipeline.finish(arn, 60)
    assert described["status"] == "FAILED"
    assert pipeline.error(described)[0] == "TrainingJobNotCreated"
    assert "The quota share does not exist (injected)" in pipeline.error(described)[1]
    states = pipeline.local.states_entered(arn)
    assert states.count("Find submitted Batch job") == 1 and "Submit Batch job again" in states
    assert "Find resubmitted Batch job" not in states
    assert calls.count("SubmitJob") == 2  # (ListJobs is the cleanup's too, looking for the execution's jobs)
    assert len(pipeline.local.clock.retries) == 1  # the throttled look, once
    assert pipeline.batch.jobs == {}


def test_an_aborted_execution_terminates_its_batch_jobs(batch_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    pipeline = batch_factory()
    prepare = batch_contract.prepare

    def last_node_prepares_until_terminated(paths: Any, node: Any, env: Any, s3: Any) -> None:
        # ECS signals a container that is still preparing: its node starts its launcher after the TerminateJob.
        if node.index == node.num_nodes - 1:
            deadline = time.monotonic() + 60
            while not any(job.terminating for job in pipeline.batch.jobs.values()) and time.monotonic() < deadline:
                time.sleep(0.05)
        prepare(paths, node, env, s3)

    monkeypatch.setattr(batch_contract, "prepare", last_node_prepares_until_terminated)
    execution_input = pipeline.batch_input()
    execution_input["hyperparameters"].update({"max_steps": 100000, "checkpoint.interval_steps": 1000})
    arn = pipeline.start(execution_input)
    pipeline.local.wait(
        arn, 60, until=lambda: any(j.status == "RUNNING" and j.attempts for j in pipeline.batch.jobs.values())
    )
    pipeline.local.sfn.stop_execution(executionArn=arn, error="Cancelled", cause="an engineer stopped the run")
    pipeline.local.wait(
        arn, 30, until=lambda: any(d["function"].startswith("StopBatchJobs") for d in pipeline.local.events.deliveries)
    )
    pipeline.local.events.drain()
    (delivery,) = [d for d in pipeline.local.events.deliveries if d["function"].startswith("StopBatchJobs")]
    (job,) = pipeline.batch.jobs.values()
    assert delivery["permitted"] and delivery["result"]["stopped"] == [job.name]
    assert job.terminating is not None and "ended" in job.terminating
    # The execution has ended; the job ends once its nodes have stopped (SIGTERM, then SIGKILL after 30 s).
    nodes = job.attempts[-1].nodes
    deadline = time.monotonic() + 60
    while pipeline.batch.describe([job.job_id])[0]["status"] != "FAILED" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pipeline.batch.describe([job.job_id])[0]["status"] == "FAILED"
    assert all(n.process is None or n.process.poll() is not None for n in nodes)
    # SIGTERM stopped every node, also one that was still preparing when the job was terminated: none waited
    # out the stop timeout for its SIGKILL.
    assert all(n.exit_code is not None and n.exit_code != -signal.SIGKILL for n in nodes), [n.exit_code for n in nodes]
    assert pipeline.local.iam.denials() == []


def test_the_job_role_is_enforced_on_the_nodes_s3_calls(batch_factory: Any, platform: Any, tmp_path: Path) -> None:
    # Without its one statement on the artifacts bucket, no node can record its result, nor the model.
    pipeline = batch_factory(_assembly_with(platform, tmp_path, _drop("BatchClusterJobRole", "WriteOutputs")))
    arn = pipeline.start(pipeline.batch_input())
    described = pipeline.finish(arn, timeout=240)
    assert pipeline.error(described)[0] == "TrainingJobFailed"
    denied = {(d.action, d.resource.split("/runs/")[0]) for d in pipeline.local.iam.denials()}
    artifacts = pipeline.local.environment("PollBatchJob")["ARTIFACTS_BUCKET"]
    assert denied == {("s3:PutObject", f"arn:aws:s3:::{artifacts}")}
    assert all("BatchClusterJobRole" in d.principal for d in pipeline.local.iam.denials())


def test_the_state_machine_submits_only_what_its_role_allows(batch_factory: Any, platform: Any, tmp_path: Path) -> None:
    pipeline = batch_factory(
        _assembly_with(platform, tmp_path, _drop("TrainingPipelineRole", "SubmitBatchTrainingJobs"))
    )
    arn = pipeline.start(pipeline.batch_input())
    described = pipeline.finish(arn, timeout=120)
    error, cause = pipeline.error(described)
    assert error == "TrainingJobNotCreated"
    assert "batch:SubmitJob on resource: arn:aws:batch:us-east-1:123456789012:job-queue/" in cause
    # Refused twice, and found nothing in between: no job, and the run says why.
    states = pipeline.local.states_entered(arn)
    assert states.count("Find submitted Batch job") == 1 and "Submit Batch job again" in states
    assert pipeline.batch.jobs == {}


def test_a_batch_run_handed_over_to_new_executions_ends_with_its_one_job(
    batch_factory: Any, handing_assembly: Path
) -> None:
    """The loop every backend shares hands over (stacks/pipeline/handover.py): an execution makes 3 polls."""
    pipeline = batch_factory(handing_assembly)
    first = pipeline.start(pipeline.batch_input(), name="long-batch-run")
    arn, executions = first, [first]

    def gate_or_end() -> bool:
        ended = pipeline.local.sfn.describe_execution(executionArn=arn)["status"] != "RUNNING"
        return ended or "Approval gate (promotion)" in pipeline.local.states_entered(arn)

    while (described := pipeline.local.wait(arn, 240, until=gate_or_end))["status"] != "RUNNING":
        output = json.loads(described.get("output") or "{}")
        assert "continues_in" in output, pipeline.error(described)
        assert output["run"]["execution"] == first
        arn = output["continues_in"]
        executions.append(arn)
    pipeline.decide("promotion", "approve")
    described = pipeline.finish(arn)
    assert described["status"] == "SUCCEEDED", pipeline.error(described)
    assert len(executions) >= 2
    assert "Check progress (Batch)" in pipeline.local.states_entered(executions[1])
    (job,) = pipeline.batch.jobs.values()  # one job, followed by every execution
    assert len(job.attempts) == 1
    assert json.loads(described["output"])["job"]["status"] == "Completed"
