"""Retrain handlers: `record` (EventBridge "Object Created" on the datasets bucket) and `sweep` (a schedule).

Both read the triggers from RETRAIN_TRIGGERS (settings `retrain`, validated at synth) and time from
their events: an object's creation time and the schedule's time, so a replayed event is judged by
when it happened.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import Any

import boto3
from aws_lambda_powertools import Logger

from lambdas.retrain.environment import RecordEnvironment, SweepEnvironment
from lambdas.retrain.window import Trigger, matching, parse_time, record, sweep
from lambdas.shared.errors import classified

logger = Logger(service="training-platform")


def _triggers(environment: RecordEnvironment | SweepEnvironment) -> list[Trigger]:
    return [Trigger.parse(t) for t in environment.retrain_triggers]


def _table(environment: RecordEnvironment | SweepEnvironment) -> Any:
    return boto3.resource("dynamodb").Table(environment.table_name)


@classified
@logger.inject_lambda_context
def record_handler(event: dict[str, Any], _context: Any) -> dict[str, str]:
    """Event: S3 "Object Created" through EventBridge; the rule matches the registered prefixes only."""
    environment = RecordEnvironment.from_environ()
    detail = event["detail"]
    key, bucket = detail["object"]["key"], detail["bucket"]["name"]
    if bucket != environment.datasets_bucket:
        raise ValueError(f"object of bucket {bucket!r} delivered; the rule matches the datasets bucket only")
    created = parse_time(event["time"])
    table = _table(environment)
    outcome = {t.name: record(table, t.name, created) for t in matching(_triggers(environment), key)}
    logger.info("new data", extra={"key": key, "object_time": event["time"], "triggers": outcome})
    return outcome


@classified
@logger.inject_lambda_context
def sweep_handler(event: dict[str, Any], _context: Any) -> list[dict[str, Any]]:
    """Event: "Scheduled Event"; starts the run of every trigger whose window has been quiet long enough."""
    environment = SweepEnvironment.from_environ()
    now = parse_time(event["time"])
    table, sfn = _table(environment), boto3.client("stepfunctions")
    session = boto3.session.Session()
    credentials = session.get_credentials()
    if credentials is None:
        raise RuntimeError("no credentials to sign the requester proof with")
    started = []
    for trigger in _triggers(environment):
        run = sweep(
            table,
            sfn,
            trigger,
            state_machine_arn=environment.state_machine_arn,
            datasets_bucket=environment.datasets_bucket,
            now=now,
            credentials=credentials.get_frozen_credentials(),
            region=session.region_name or os.environ["AWS_REGION"],
        )
        if run is not None:
            logger.info("retrain run started", extra=asdict(run))
            started.append(asdict(run))
    return started
