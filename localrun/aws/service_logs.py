"""What the services write to CloudWatch Logs for the jobs the local platform runs: each host's (node's) lines in a
stream of its own, as SageMaker (`/aws/sagemaker/TrainingJobs`, `<job>/<host>-<epoch>`) and AWS Batch's awslogs
driver (`/aws/batch/job`, `<definition>/default/<task>`) do, so that `tp logs` and `tp watch` read them through the
Logs API as they would on AWS.

The service writes them, not a principal of the account: the writes sign as the harness (the administrator, whose
calls local IAM does not judge), even from a thread that acts as a platform role.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path
from typing import Any

import boto3

from localrun.aws.cfn import REGION

BATCH_MAX_EVENTS = 10_000
"""PutLogEvents takes at most this many events per call."""


class ServiceLogs:
    """New lines of local log files (or line lists) appended to their streams; each stream created on first use."""

    def __init__(self, group: str) -> None:
        self.group = group
        self._shipped: dict[str, int] = {}
        """Stream -> what of its source is shipped: bytes of a file, or lines of a list."""
        self._lock = threading.Lock()
        self._client: Any = None

    def _logs(self) -> Any:
        if self._client is None:
            # The harness's keys, explicitly: a platform role's thread (acting_as) must not sign the service's writes.
            self._client = boto3.client(
                "logs",
                region_name=REGION,
                aws_access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
                aws_secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
                aws_session_token=os.environ.get("AWS_SESSION_TOKEN"),
            )
            with contextlib.suppress(self._client.exceptions.ResourceAlreadyExistsException):
                self._client.create_log_group(logGroupName=self.group)
        return self._client

    def ship_file(self, stream: str, path: Path) -> None:
        """The file's complete lines written since the last call (a line still being written waits)."""
        with self._lock:
            done = self._shipped.get(stream, 0)
            try:
                data = path.read_bytes()[done:]
            except FileNotFoundError:
                return
            complete = data[: data.rfind(b"\n") + 1]
            if complete:
                self._put(stream, complete.decode(errors="replace").splitlines())
                self._shipped[stream] = done + len(complete)

    def ship_lines(self, stream: str, lines: list[str]) -> None:
        """The lines of `lines` appended since the last call for this stream."""
        with self._lock:
            done = self._shipped.get(stream, 0)
            new = lines[done:]
            if new:
                self._put(stream, [line.rstrip("\n") for line in new])
                self._shipped[stream] = done + len(new)

    def _put(self, stream: str, lines: list[str]) -> None:
        logs = self._logs()
        if stream not in self._shipped:
            with contextlib.suppress(logs.exceptions.ResourceAlreadyExistsException):
                logs.create_log_stream(logGroupName=self.group, logStreamName=stream)
        now = int(time.time() * 1000)
        events = [{"timestamp": now, "message": line or " "} for line in lines]
        for start in range(0, len(events), BATCH_MAX_EVENTS):
            logs.put_log_events(
                logGroupName=self.group, logStreamName=stream, logEvents=events[start : start + BATCH_MAX_EVENTS]
            )
