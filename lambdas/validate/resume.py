"""`resume_from`: resume a run that ended, from the newest checkpoint the platform recorded of it.

The input names the earlier run by its execution ARN, or by its run id (`job_name_base`, which
names its jobs and prefixes). Validate finds what that run was asked to do in its execution
history (the request its Validate resolved) and refuses, with the rest of the input's problems:

- an execution of another state machine, one still running, or one that never passed Validate;
- a run started by someone else (`requested_by` differs), when the platform knows who starts runs;
- a run whose settings the new one cannot resume (contract/resume.py);
- a run with no checkpoint it may resume from (contract/ledger.py `resumable`: complete, and as the platform
  recorded it), hence nothing to resume.

The ledger-opening step (lambdas/resume) copies the chosen checkpoint into the new run's prefix once
the run is approved; the new run's lineage records where it came from.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from contract import ledger
from contract.config import ConfigError, from_hyperparameters
from contract.execution_state import REQUEST, TRAIN_ROLE, InstanceGroup, TrainingRequest
from contract.layout import run_checkpoints
from contract.resume import resume_problems
from contract.stored_checkpoints import complete_checkpoints
from lambdas.handover.chain import executions

FIELD = "resume_from"
_EXECUTION = re.compile(r"^arn:(aws[a-z-]*):states:([a-z0-9-]+):(\d{12}):execution:([^:]+):([^:]+)$")
_RUN_ID = re.compile(r"^[a-z0-9][a-z0-9-]*-[0-9a-f]+$")
_REQUEST_KEY = str(REQUEST).removeprefix("$.")


class ResumeError(Exception):
    """`resume_from` names nothing this run can resume; the message says why and what to do."""


@dataclass(frozen=True)
class PreviousRun:
    execution: str
    request: TrainingRequest


def state_machine_of(execution: str) -> str | None:
    """The ARN of the state machine an execution ARN belongs to; None for anything else."""
    match = _EXECUTION.match(execution)
    if match is None:
        return None
    partition, region, account, machine, _name = match.groups()
    return f"arn:{partition}:states:{region}:{account}:stateMachine:{machine}"


def find(
    resume_from: str, *, own_execution: str, sfn: Any, s3: Any, artifacts_bucket: str, checkpoints_bucket: str
) -> PreviousRun:
    """The run `resume_from` names, as its Validate resolved it; ResumeError when there is none to resume."""
    if state_machine_of(resume_from) is not None:
        execution = resume_from
    else:  # a run id: its recorded checkpoints name the execution that wrote them
        records = ledger.records(s3, artifacts_bucket, resume_from) if _RUN_ID.match(resume_from) else []
        if not records:
            raise ResumeError(
                f"{resume_from!r}: no run of that id has a checkpoint the platform recorded; give the execution ARN"
                " of the run to resume (arn:aws:states:<region>:<account>:execution:<state machine>:<name>) or"
                " its run id (<run name>-<16 hex>, as its jobs are named)"
            )
        execution = records[-1].execution
    if state_machine_of(execution) != state_machine_of(own_execution):
        raise ResumeError(f"{resume_from!r}: not a run of this state machine ({state_machine_of(own_execution)})")
    try:
        # A run handed over to new executions is as the last of them is (its Validate ran in the first).
        now, described = executions(sfn, execution)[-1]
    except ClientError as exc:
        if exc.response["Error"]["Code"] in ("ExecutionDoesNotExist", "ResourceNotFound"):
            raise ResumeError(f"{resume_from!r}: no such execution (Step Functions keeps them 90 days)") from None
        raise
    if described["status"] in ("RUNNING", "PENDING_REDRIVE"):
        where = "" if now == execution else f" (in {now}, which it was handed over to)"
        raise ResumeError(
            f"{resume_from!r}: the run is still {described['status']}{where}; stop it first, then resume it"
        )
    request = resolved_request(sfn, execution)
    if request is None:
        raise ResumeError(f"{resume_from!r}: that execution never passed Validate, so it has no checkpoint")
    run = request.job_name_base
    stored = complete_checkpoints(s3, checkpoints_bucket, run_checkpoints(run))
    if not ledger.resumable(stored, ledger.recorded(s3, artifacts_bucket, run), run):
        raise ResumeError(
            f"{resume_from!r}: {run} has no checkpoint that is complete and as the platform recorded it, so there is"
            " nothing to resume; start it afresh"
        )
    return PreviousRun(execution=execution, request=request)


def resolved_request(sfn: Any, execution: str) -> TrainingRequest | None:
    """The request that execution's Validate resolved: the first state output that holds one."""
    for page in sfn.get_paginator("get_execution_history").paginate(executionArn=execution):
        for event in page["events"]:
            details = event.get("stateExitedEventDetails")
            if not details or "output" not in details:
                continue
            output = json.loads(details["output"])
            if isinstance(output, dict) and isinstance(output.get(_REQUEST_KEY), dict):
                return TrainingRequest.parse(output[_REQUEST_KEY])
    return None


def processes(groups: list[InstanceGroup]) -> int:
    """The training processes the launcher starts: one per GPU of every training host, or one per host."""
    return sum(g.instance_count * max(g.gpus, 1) for g in groups if g.role == TRAIN_ROLE)


def resume_check(
    previous: PreviousRun,
    hyperparameters: dict[str, str],
    groups: list[InstanceGroup],
    *,
    requested_by: str | None,
    tuned: bool,
    own_code: bool = False,
) -> list[str]:
    """Why a run of these resolved `hyperparameters` on `groups`, started by `requested_by`, cannot resume it.
    `own_code`: the run runs its own script, which alone knows what its checkpoints hold."""
    found: list[str] = []
    old = previous.request
    if own_code != (old.code is not None):
        ran = "its own code" if old.code is not None else "the platform's trainer"
        found.append(f"{FIELD}: {old.job_name_base} ran {ran}; only code of the same kind resumes it")
        return found
    if tuned:
        found.append(f"{FIELD}: a tuning run starts every trial afresh; resume a run with a single job")
    if old.requested_by != requested_by:
        found.append(
            f"{FIELD}: {old.job_name_base} was started by {old.requested_by or 'someone unproven'}; only the same"
            " requester may resume a run"
        )
    if own_code:
        return found
    try:
        config = from_hyperparameters(hyperparameters)
    except ConfigError:  # reported with the input's hyperparameters
        return found
    try:
        old_config = from_hyperparameters(old.hyperparameters)
    except ConfigError as exc:  # the trainer's rules changed since: the old run's settings no longer parse
        found.append(f"{FIELD}: the settings of {old.job_name_base} no longer parse ({exc}); start afresh")
        return found
    found.extend(resume_problems(old_config, processes(old.instance_groups), config, processes(groups)))
    return found
