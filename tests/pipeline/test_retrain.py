"""Retraining on new data, executed: S3 events through the rule, a quiet period on the Clock, one run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest

from lambdas.retrain.window import execution_name, parse_time, stamp
from localrun.aws.cfn import REGION
from localrun.aws.clock import Clock
from localrun.aws.engine import LocalPlatform
from localrun.backends.scripted import Poll, ScriptedTraining
from tests.conftest import RETRAIN_TRIGGER
from tests.pipeline.conftest import COMPLETED, Pipeline

PREFIX = RETRAIN_TRIGGER["prefix"]
QUIET = timedelta(minutes=RETRAIN_TRIGGER["quiet_minutes"])


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def retraining(pipeline_factory: Any, clock: Clock) -> Pipeline:
    return pipeline_factory(clock=clock)  # type: ignore[no-any-return]


def _put(pipeline: Pipeline, key: str) -> None:
    """Upload a shard as a data team would; S3 emits "Object Created" to EventBridge."""
    boto3.client("s3", region_name=REGION).put_object(Bucket=pipeline.datasets_bucket, Key=key, Body=b"tokens")


def _deliveries(pipeline: Pipeline, function: str) -> list[dict[str, Any]]:
    name = pipeline.local.functions.named(function).name
    return [d for d in pipeline.local.events.deliveries if d["function"] == name]


def _sweep(pipeline: Pipeline) -> list[dict[str, Any]]:
    """EventBridge's five-minute schedule, due now: what the sweep started."""
    before = len(_deliveries(pipeline, "RetrainSweep"))
    pipeline.local.events.schedule_due()
    pipeline.local.events.drain()
    (delivery,) = _deliveries(pipeline, "RetrainSweep")[before:]
    assert delivery["permitted"] and "error" not in delivery, delivery
    return delivery["result"]  # type: ignore[no-any-return]


def _executions(pipeline: Pipeline) -> list[dict[str, Any]]:
    sfn = pipeline.local.sfn
    return sfn.list_executions(stateMachineArn=pipeline.local.state_machine_arn)["executions"]  # type: ignore[no-any-return]


def test_new_objects_under_a_registered_prefix_start_one_run_once_quiet(retraining: Pipeline, clock: Clock) -> None:
    for shard in range(3):
        _put(retraining, f"{PREFIX}shard-{shard:04d}.bin")
        clock.advance(timedelta(minutes=4))
    _put(retraining, "corpus/unrelated.bin")  # outside every registered prefix: no rule matches
    retraining.local.events.drain()
    recorded = _deliveries(retraining, "RetrainRecord")
    assert [d["event"]["detail"]["object"]["key"] for d in recorded] == [f"{PREFIX}shard-{i:04d}.bin" for i in range(3)]
    assert all(d["permitted"] and d["result"] == {"web-text": "recorded"} for d in recorded), recorded

    assert _sweep(retraining) == []  # 4 minutes after the newest shard: not quiet yet
    clock.advance(QUIET)
    (started,) = _sweep(retraining)
    times = [stamp(parse_time(d["event"]["time"])) for d in recorded]
    name = execution_name("web-text", times[0], times[-1])
    assert (started["execution_name"], started["objects"], started["already"]) == (name, 3, False)
    (execution,) = _executions(retraining)
    assert execution["name"] == name

    # The run validates and trains like any other; it names the trigger's role as who started it.
    assert retraining.run_until(execution["executionArn"], "Approval gate (promotion)")["status"] == "RUNNING"
    request = retraining.pending("promotion")
    sweep_role = retraining.local.resolver.resolve(
        retraining.local.functions.named("RetrainSweep").stack,
        retraining.local.functions.named("RetrainSweep").resource["Properties"]["Role"],
    )
    assert request["requested_by"] == sweep_role
    (job,) = retraining.jobs()
    channel = retraining.local.training_requests[job]["InputDataConfig"][0]
    assert channel["DataSource"]["FileSystemDataSource"]["DirectoryPath"].endswith("/datasets/incoming/web-text")
    retraining.decide("promotion", "approve")
    assert retraining.finish(execution["executionArn"])["status"] == "SUCCEEDED"


def test_duplicates_and_later_sweeps_start_nothing_more_but_new_data_does(retraining: Pipeline, clock: Clock) -> None:
    _put(retraining, f"{PREFIX}shard-0000.bin")
    retraining.local.events.drain()
    (first,) = _deliveries(retraining, "RetrainRecord")
    clock.advance(QUIET)
    (started,) = _sweep(retraining)
    # EventBridge delivers the same event again (at-least-once), and the schedule fires again.
    retraining.local.events.put(first["event"])
    retraining.local.events.drain()
    assert _deliveries(retraining, "RetrainRecord")[-1]["result"] == {"web-text": "covered"}
    assert _sweep(retraining) == []
    assert [e["name"] for e in _executions(retraining)] == [started["execution_name"]]

    clock.advance(timedelta(hours=1))
    _put(retraining, f"{PREFIX}shard-0001.bin")  # new data after the run started: a new window
    retraining.local.events.drain()
    clock.advance(QUIET)
    (second,) = _sweep(retraining)
    assert second["execution_name"] != started["execution_name"]
    assert len(_executions(retraining)) == 2
    for execution in _executions(retraining):  # both validate and train
        assert retraining.run_until(execution["executionArn"], "Approval gate (promotion)")["status"] == "RUNNING"


def test_objects_outside_the_registered_prefixes_or_bucket_start_nothing(retraining: Pipeline) -> None:
    _put(retraining, "incoming/web-text-archive/shard.bin")  # a sibling prefix, not under it
    # The same key in a bucket whose events do not go to EventBridge: S3 sends nothing.
    checkpoints = retraining.local.environment("Cleanup")["CHECKPOINTS_BUCKET"]
    boto3.client("s3", region_name=REGION).put_object(Bucket=checkpoints, Key=f"{PREFIX}shard.bin", Body=b"x")
    retraining.local.events.drain()
    assert _deliveries(retraining, "RetrainRecord") == []
    assert [d for d in retraining.local.events.deliveries if d["event"]["source"] == "aws.s3"] == []
    assert _sweep(retraining) == []
    assert _executions(retraining) == []


@pytest.fixture(scope="module")
def guarded_clock() -> Clock:
    return Clock()


@pytest.fixture(scope="module")
def guarded(guarded_assembly: Path, guarded_clock: Clock) -> Iterator[Pipeline]:
    """A platform that refuses runs without a proof of who started them (pipeline.forbid_self_approval)."""
    training = ScriptedTraining(scripts=[[Poll(), COMPLETED]])
    with LocalPlatform(guarded_assembly, training=training, clock=guarded_clock) as local:
        yield Pipeline(local, training)


def test_a_triggered_run_proves_who_started_it_where_self_approval_is_forbidden(
    guarded: Pipeline, guarded_clock: Clock
) -> None:
    template = json.loads((Path(__file__).resolve().parents[2] / RETRAIN_TRIGGER["input"]).read_text())
    unproven = guarded.local.start(template, name="by-hand", requester=None)  # the same template, no proof
    assert guarded.error(guarded.finish(unproven))[0] == "InvalidRequest"

    _put(guarded, f"{PREFIX}shard-0000.bin")
    guarded.local.events.drain()
    guarded_clock.advance(QUIET)
    (started,) = _sweep(guarded)
    (execution,) = [e for e in _executions(guarded) if e["name"] == started["execution_name"]]
    assert guarded.run_until(execution["executionArn"], "Approval gate (promotion)")["status"] == "RUNNING"
    sweep = guarded.local.functions.named("RetrainSweep")
    assert guarded.pending("promotion")["requested_by"] == guarded.local.resolver.resolve(
        sweep.stack, sweep.resource["Properties"]["Role"]
    )
