"""Validate handler: execution input -> resolved request, or InvalidRequest with every problem."""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from typing import Any

import boto3
from aws_lambda_powertools import Logger

from lambdas.shared.env import env_bool, env_float, env_str
from lambdas.shared.errors import InvalidRequest, Problem, classified
from lambdas.shared.metrics import Metric, Stage, StageMetrics
from lambdas.validate import budget, code, membership, resume, start_proof, teams
from lambdas.validate.limits import PlatformLimits
from lambdas.validate.model_folder import S3Folder
from lambdas.validate.request import resolve

logger = Logger(service="training-platform")
metrics = StageMetrics(Stage.INTAKE)


def requester(event: Any, execution_arn: str, started: str, *, required: bool) -> str | None:
    """Who started the run, from the input's start proof; None when there is none and none is required."""
    proof = event.get(start_proof.FIELD) if isinstance(event, dict) else None
    if proof is None and not required:
        return None
    if proof is None:
        raise InvalidRequest.listing(
            [
                Problem(
                    start_proof.FIELD,
                    None,
                    "this platform refuses approvals by whoever started a run (pipeline.forbid_self_approval), so "
                    "it must know who did; start runs with `tp start`, which adds the proof",
                )
            ]
        )
    table = boto3.resource("dynamodb").Table(env_str("START_PROOFS_TABLE"))
    try:
        return start_proof.prove(
            event, execution_arn=execution_arn, started=started, table=table, now=datetime.now(UTC)
        )
    except start_proof.ProofError as exc:
        raise InvalidRequest.listing([Problem(start_proof.FIELD, proof, str(exc))]) from None


@classified
@logger.inject_lambda_context
@metrics.flushed
def handler(event: dict[str, Any], _context: Any) -> dict[str, Any]:
    """Event: {"input": <execution input>, "execution_name": $$.Execution.Name, "execution": $$.Execution.Id,
    "started": $$.Execution.StartTime}.

    Answers {"input": <the input less its start proof>, "validation": <Validation>}: it becomes the
    execution's state, so the proof goes no further than this function. An invalid input is an
    answer, not a fault: it returns `valid: false` with the message (so
    handler-error alarms mean platform faults only) and the state machine ends the run there. So is
    a spent budget: no run is accepted while the budget stop is in force.
    """
    limits = PlatformLimits.from_environment()
    if (spent := _budget_spent(event["input"], limits)) is not None:
        logger.info("request refused: budget spent")
        metrics.record(Metric.RUNS_REFUSED_OVER_BUDGET)
        return _answer(event, {"valid": False, "message": spent, "request": None})
    problems: list[Problem] = []
    requested_by = None
    if isinstance(event["input"], dict):  # any other input is refused for its shape alone, below
        try:
            requested_by = requester(
                event["input"], event["execution"], event["started"], required=env_bool("FORBID_SELF_APPROVAL")
            )
        except InvalidRequest as exc:
            problems.extend(exc.problems)
    requester_tag = None
    if isinstance(event["input"], dict) and (
        team := teams.tag_to_prove(event["input"].get("team"), requested_by, limits.teams)
    ):
        # Membership by the principal's `platform-team` tag, as IAM judges it; a failed call is a platform fault.
        try:
            if start_proof.prove_membership(
                event["input"],
                execution_arn=event["execution"],
                team=team.name,
                bucket=limits.artifacts_bucket,
                now=datetime.now(UTC),
            ):
                requester_tag = team.member_tag
        except start_proof.ProofError as exc:
            problems.append(Problem(membership.FIELD, event["input"].get(membership.FIELD), str(exc)))
    continues = None
    if isinstance(event["input"], dict) and isinstance(event["input"].get(resume.FIELD), str):
        try:
            continues = resume.find(
                event["input"][resume.FIELD],
                own_execution=event["execution"],
                sfn=boto3.client("stepfunctions"),
                s3=boto3.client("s3"),
                artifacts_bucket=limits.artifacts_bucket,
                checkpoints_bucket=env_str("CHECKPOINTS_BUCKET"),
            )
        except resume.ResumeError as exc:
            problems.append(Problem(resume.FIELD, event["input"][resume.FIELD], str(exc)))
    packed_code = _packed_code(event["input"], limits, problems)
    try:
        request = resolve(
            event["input"],
            execution_name=event["execution_name"],
            limits=limits,
            requested_by=requested_by,
            requester_tag=requester_tag,
            execution=event["execution"],
            started=event["started"],
            continues=continues,
            folder_at=functools.partial(S3Folder, boto3.client("s3")),
            packed_code=packed_code,
        )
    except InvalidRequest as exc:
        problems.extend(exc.problems)
    if problems:  # every problem at once: the proof's and the input's
        message = str(InvalidRequest.listing(problems))
        logger.info("request rejected", extra={"problems": message})
        metrics.record(Metric.RUNS_REJECTED)
        return _answer(event, {"valid": False, "message": message, "request": None})
    logger.info("request resolved", extra={"run_name": request["run_name"], "job": request["job_name_base"]})
    metrics.record(Metric.RUNS_ACCEPTED)
    return _answer(event, {"valid": True, "message": "", "request": request})


def _packed_code(execution_input: Any, limits: PlatformLimits, problems: list[Problem]) -> code.PackedCode | None:
    """What is stored of the run's own code the input names (None: it names none, or not its own)."""
    if not isinstance(execution_input, dict):
        return None
    try:
        return code.find(execution_input, artifacts_bucket=limits.artifacts_bucket, s3=boto3.client("s3"))
    except code.CodeNotFoundError as exc:
        problems.append(Problem("code.source", execution_input[code.FIELD]["source"], str(exc)))
        return None


def _budget_spent(execution_input: Any, limits: PlatformLimits) -> str | None:
    """The refusal, in words, when the platform's budget stop or the input's team's is in force; else None.

    A team's stop denies its jobs on every backend; a run of the team is refused here, before anything is created.
    """
    sagemaker = boto3.client("sagemaker")
    contact = env_str("BUDGET_CONTACT")
    if budget.budget_stopped(sagemaker, env_str("BUDGET_PROBE_JOB")):
        return budget.refusal(limit_usd=env_float("MONTHLY_BUDGET_USD"), contact=contact)
    named = execution_input.get("team") if isinstance(execution_input, dict) else None
    team = teams.named_team(named, limits.teams) if isinstance(named, str) else None
    if team is None or team.monthly_budget_usd is None:
        return None
    if not budget.budget_stopped(sagemaker, budget.probe_job(team.name)):
        return None
    ask = ", ".join(team.notification_emails) or contact
    return budget.refusal(limit_usd=team.monthly_budget_usd, contact=ask, team=team.name)


def _answer(event: dict[str, Any], validation: dict[str, Any]) -> dict[str, Any]:
    execution_input = event["input"]
    carried = start_proof.without_proof(execution_input) if isinstance(execution_input, dict) else execution_input
    return {"input": carried, "validation": validation}
