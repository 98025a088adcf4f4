"""A job's own progress records cannot put more in the goodput ledger than the service billed.

Acted out in the local platform with IAM enforced: the training role (whose trainer writes the records) writes a
record that claims days of productive training in a job SageMaker billed for seconds.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from contract.goodput import PARTS
from contract.layout import run_of, run_progress
from localrun.aws.iam import SAGEMAKER
from localrun.backends.scripted import Poll
from tests.pipeline.conftest import COMPLETED, Pipeline
from tests.pipeline.test_trust_storage import _s3_as

CLAIMED_SECONDS = 9_000_000.0  # 104 days, within what a record may hold (contract/goodput.py _MAX_SECONDS)


def test_a_jobs_records_are_bounded_by_the_billed_time_and_the_ledger_says_so(pipeline_factory: Any) -> None:
    pipeline: Pipeline = pipeline_factory(scripts=[[Poll(), Poll(), COMPLETED]])
    checkpoints = pipeline.local.environment("Cleanup")["CHECKPOINTS_BUCKET"]
    training_role = _s3_as(pipeline, SAGEMAKER)

    def forged(job: str, _request: dict[str, Any], _training: Any) -> None:
        now = datetime.now(UTC).isoformat(timespec="milliseconds")
        record = {
            "job": job,
            "started_at": now,
            "first_step": 0,
            "step": 100,
            "updated_at": now,
            "phases": {"train": CLAIMED_SECONDS, "startup": 1.0},
        }
        key = f"{run_progress(run_of(job))}{job}-{int(datetime.now(UTC).timestamp() * 1000)}.json"
        training_role.put_object(Bucket=checkpoints, Key=key, Body=json.dumps(record).encode())

    pipeline.training.on_create.append(forged)
    arn = pipeline.start(pipeline.input())
    pipeline.run_until(arn, "Approval gate (promotion)")
    (ledger,) = pipeline.lineage()["goodput"]["jobs"]
    billed = ledger["billed_seconds"]
    assert 0 <= billed < 600, ledger  # the scripted job runs for moments
    assert sum(ledger["parts"][part] for part in PARTS) <= billed + 0.01, ledger
    assert ledger["parts"]["productive"] <= billed and ledger["goodput"] <= 1.0, ledger
    # What the records claimed beyond the container time is left out, and the ledger says how much.
    assert ledger["bounded_seconds"] > CLAIMED_SECONDS - billed, ledger
