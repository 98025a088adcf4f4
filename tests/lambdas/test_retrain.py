"""Retrain windows: one run per quiet period of new data, never two for the same data."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from botocore.credentials import Credentials
from moto import mock_aws

from lambdas.approvals import identity
from lambdas.retrain import handler
from lambdas.retrain.window import Trigger, execution_input, execution_name, matching, record, stamp, sweep
from lambdas.validate import start_proof

REGION = "us-east-1"
BUCKET = "tp-dev-datasets-123456789012-us-east-1"
T0 = datetime(2026, 11, 23, 5, 0, tzinfo=UTC)
KEYS = Credentials("ASIAEXAMPLE", "secret", "token")
TEMPLATE = {"run_name": "web-text", "instance_type": "ml.g5.2xlarge", "max_runtime_hours": 2}
TRIGGER = Trigger(name="web-text", prefix="incoming/web-text/", quiet_minutes=30, input=TEMPLATE)


class Aws:
    def __init__(self) -> None:
        dynamodb = boto3.resource("dynamodb", region_name=REGION)
        self.table = dynamodb.create_table(
            TableName="windows",
            KeySchema=[{"AttributeName": "trigger", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "trigger", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        self.sfn = boto3.client("stepfunctions", region_name=REGION)
        definition = {"StartAt": "Done", "States": {"Done": {"Type": "Succeed"}}}
        self.machine = self.sfn.create_state_machine(
            name="pipeline", definition=json.dumps(definition), roleArn="arn:aws:iam::123456789012:role/sfn"
        )["stateMachineArn"]

    def sweep(self, at: datetime, trigger: Trigger = TRIGGER) -> Any:
        return sweep(
            self.table,
            self.sfn,
            trigger,
            state_machine_arn=self.machine,
            datasets_bucket=BUCKET,
            now=at,
            credentials=KEYS,
            region=REGION,
        )

    def executions(self) -> list[dict[str, Any]]:
        listed = self.sfn.list_executions(stateMachineArn=self.machine)["executions"]
        return [self.sfn.describe_execution(executionArn=e["executionArn"]) for e in listed]


@pytest.fixture
def aws() -> Iterator[Aws]:
    with mock_aws():
        yield Aws()


def test_several_objects_in_one_window_start_one_run_once_quiet(aws: Aws) -> None:
    for minute in (0, 3, 7):
        assert record(aws.table, TRIGGER.name, T0 + timedelta(minutes=minute)) == "recorded"
    assert aws.sweep(T0 + timedelta(minutes=30)) is None  # 23 minutes after the newest object
    assert aws.executions() == []

    started = aws.sweep(T0 + timedelta(minutes=37))
    assert started is not None and started.objects == 3 and not started.already
    expected = execution_name(TRIGGER.name, stamp(T0), stamp(T0 + timedelta(minutes=7)))
    assert started.execution_name == expected and expected.startswith("retrain-web-text-")
    (execution,) = aws.executions()
    assert execution["name"] == expected
    run_input = json.loads(execution["input"])
    proof = run_input.pop("requester_proof")
    assert run_input == {**TEMPLATE, "dataset": f"s3://{BUCKET}/incoming/web-text/"}
    # The proof is bound to this state machine, execution name and input, as Validate checks it.
    bound_to = start_proof.binding(run_input, state_machine=aws.machine, execution_name=expected)
    identity.check(proof, bound_to=bound_to, region=REGION, now=datetime.now(UTC))
    assert aws.sweep(T0 + timedelta(hours=5)) is None  # the window is closed: nothing more to start


def test_a_duplicate_event_starts_no_second_run(aws: Aws) -> None:
    created = T0 + timedelta(minutes=1)
    assert record(aws.table, TRIGGER.name, created) == "recorded"
    assert record(aws.table, TRIGGER.name, created) == "recorded"  # redelivered before the run
    first = aws.sweep(T0 + timedelta(minutes=40))
    assert first is not None
    # Redelivered after the run started: the run covers that object; no window opens.
    assert record(aws.table, TRIGGER.name, created) == "covered"
    assert aws.sweep(T0 + timedelta(hours=2)) is None
    assert [e["name"] for e in aws.executions()] == [first.execution_name]


def test_a_retried_sweep_asks_for_the_same_name_and_starts_nothing_new(aws: Aws) -> None:
    record(aws.table, TRIGGER.name, T0)
    name = execution_name(TRIGGER.name, stamp(T0), stamp(T0))
    # An earlier sweep started the run, then failed before it closed the window.
    aws.sfn.start_execution(stateMachineArn=aws.machine, name=name, input="{}")
    retried = aws.sweep(T0 + timedelta(minutes=31))
    assert retried is not None and retried.already and retried.execution_name == name
    assert len(aws.executions()) == 1
    assert aws.sweep(T0 + timedelta(minutes=36)) is None


def test_new_data_after_a_run_started_opens_a_new_window(aws: Aws) -> None:
    record(aws.table, TRIGGER.name, T0)
    first = aws.sweep(T0 + timedelta(minutes=31))
    later = T0 + timedelta(hours=1)
    assert record(aws.table, TRIGGER.name, later) == "recorded"
    assert aws.sweep(later + timedelta(minutes=29)) is None
    second = aws.sweep(later + timedelta(minutes=30))
    assert first is not None and second is not None
    assert second.execution_name == execution_name(TRIGGER.name, stamp(later), stamp(later)) != first.execution_name
    assert len(aws.executions()) == 2


def test_data_arriving_while_the_run_starts_keeps_its_window_for_a_run_of_its_own(aws: Aws) -> None:
    record(aws.table, TRIGGER.name, T0)
    arrived = T0 + timedelta(minutes=31)

    class ObjectArrivesMeanwhile:
        """The table, with one more object recorded just before the sweep closes the window."""

        def __getattr__(self, name: str) -> Any:
            return getattr(aws.table, name)

        def update_item(self, **kwargs: Any) -> Any:
            record(aws.table, TRIGGER.name, arrived)
            return aws.table.update_item(**kwargs)

    first = sweep(
        ObjectArrivesMeanwhile(),
        aws.sfn,
        TRIGGER,
        state_machine_arn=aws.machine,
        datasets_bucket=BUCKET,
        now=T0 + timedelta(minutes=31),
        credentials=KEYS,
        region=REGION,
    )
    assert first is not None
    second = aws.sweep(arrived + timedelta(minutes=30))
    assert second is not None and second.execution_name != first.execution_name
    assert len(aws.executions()) == 2


def test_an_object_older_than_the_open_window_joins_it(aws: Aws) -> None:
    record(aws.table, TRIGGER.name, T0 + timedelta(minutes=10))
    assert record(aws.table, TRIGGER.name, T0) == "recorded"  # delivered late
    started = aws.sweep(T0 + timedelta(minutes=40))
    assert started is not None and started.objects == 2


def test_only_the_registered_prefixes_match() -> None:
    other = Trigger(name="images", prefix="incoming/images/")
    assert matching([TRIGGER, other], "incoming/web-text/part-0001.bin") == [TRIGGER]
    assert matching([TRIGGER, other], "incoming/web-text-old/part.bin") == []
    assert matching([TRIGGER, other], "corpus/part.bin") == []


def test_a_template_naming_the_prefix_on_fsx_keeps_it() -> None:
    fsx = Trigger(name="web-text", prefix="incoming/web-text/", input={"dataset": "fsx:///datasets/incoming/web-text/"})
    assert execution_input(fsx, BUCKET)["dataset"] == "fsx:///datasets/incoming/web-text/"


def _object_created(key: str, time: str, bucket: str = BUCKET) -> dict[str, Any]:
    return {
        "version": "0",
        "id": "6a7e8feb-b491-4cf7-a9f1-bf3703467718",
        "detail-type": "Object Created",
        "source": "aws.s3",
        "account": "123456789012",
        "time": time,
        "region": REGION,
        "resources": [f"arn:aws:s3:::{bucket}"],
        "detail": {
            "version": "0",
            "bucket": {"name": bucket},
            "object": {"key": key, "size": 5, "etag": "b1946ac92492d2347c6235b4d2611184", "sequencer": "00617F0"},
            "request-id": "N4N7GDK58NMKJ12R",
            "requester": "123456789012",
            "reason": "PutObject",
        },
    }


class _Context:
    function_name = "RetrainRecord"
    memory_limit_in_mb = 256
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:RetrainRecord"
    aws_request_id = "req-1"


def test_the_handlers_read_time_from_their_events(aws: Aws, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TABLE_NAME", "windows")
    monkeypatch.setenv("DATASETS_BUCKET", BUCKET)
    monkeypatch.setenv("STATE_MACHINE_ARN", aws.machine)
    monkeypatch.setenv(
        "RETRAIN_TRIGGERS", json.dumps([{"name": "web-text", "prefix": "incoming/web-text/", "input": TEMPLATE}])
    )
    event = _object_created("incoming/web-text/part-0001.bin", "2026-11-23T05:00:00Z")
    assert handler.record_handler(event, _Context()) == {"web-text": "recorded"}
    assert handler.record_handler(_object_created("corpus/x.bin", "2026-11-23T05:01:00Z"), _Context()) == {}
    with pytest.raises(ValueError, match="datasets bucket only"):
        handler.record_handler(
            _object_created("incoming/web-text/a", "2026-11-23T05:02:00Z", bucket="other"), _Context()
        )
    scheduled = {"detail-type": "Scheduled Event", "source": "aws.events", "time": "2026-11-23T05:20:00Z", "detail": {}}
    assert handler.sweep_handler(scheduled, _Context()) == []
    (started,) = handler.sweep_handler({**scheduled, "time": "2026-11-23T05:30:00Z"}, _Context())
    assert started["execution_name"] == execution_name("web-text", stamp(T0), stamp(T0))
