"""AWS Batch service jobs with quota shares: the scheduler on its own, then the player through boto3 in moto."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Iterator
from typing import Any, cast

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from localrun.aws.cfn import ACCOUNT, REGION
from localrun.aws.iam import _BATCH_OPERATIONS, LAMBDA, REQUEST_MODEL, Call, LocalIam
from localrun.backends.queue import COMPLETED, LEND, LEND_AND_BORROW, RESERVE, Job, LocalServiceJobs, Share, schedule
from tests.support.iam_reference import actions_matching, resource_matches

P4D = "ml.p4d.24xlarge"


class Queue:
    """The scheduler's view of a queue, played by hand: a fake clock and a runner that does what it is told."""

    def __init__(self, capacity: dict[str, int], *shares: Share) -> None:
        self.capacity, self.shares = capacity, list(shares)
        self.jobs: dict[str, Job] = {}
        self.clock = 0.0

    def submit(self, job_id: str, share: str, count: int, priority: int = 0, instance_type: str = P4D) -> None:
        self.jobs[job_id] = Job(job_id, share, instance_type, count, priority, submitted=len(self.jobs))

    def step(self) -> Any:
        """Schedule once and apply it: started jobs hold their capacity, preempted ones start stopping."""
        self.clock += 1
        decision = schedule(self.capacity, self.shares, self.jobs.values())
        assert decision == schedule(self.capacity, self.shares, self.jobs.values())  # deterministic
        for job_id in decision.start:
            self.jobs[job_id] = dataclasses.replace(self.jobs[job_id], holding=True, started=self.clock)
        for job_id in decision.preempt:
            self.jobs[job_id] = dataclasses.replace(self.jobs[job_id], stopping=True)
        return decision

    def end(self, job_id: str) -> None:
        del self.jobs[job_id]

    def requeue(self, job_id: str) -> None:
        """A preempted job's training job stopped: it is RUNNABLE again."""
        self.jobs[job_id] = dataclasses.replace(self.jobs[job_id], holding=False, stopping=False, started=None)

    def running(self) -> list[str]:
        return sorted(j.job_id for j in self.jobs.values() if j.holding)


# -- the scheduler ----------------------------------------------------------------------------------------
def test_a_full_quota_makes_jobs_wait_with_the_reason_and_their_place_until_the_first_ends() -> None:
    queue = Queue({P4D: 8}, Share("team-a", {P4D: 4}), Share("team-b", {P4D: 4}))
    queue.submit("a1", "team-a", 4)
    queue.submit("a2", "team-a", 4)
    queue.submit("a3", "team-a", 2)
    decision = queue.step()
    assert decision.start == ["a1"]
    assert decision.waiting == {
        "a2": f"waiting for capacity: share team-a uses 4 of 4 {P4D}",
        "a3": f"waiting for capacity: share team-a uses 4 of 4 {P4D}; 1 job ahead",
    }
    assert queue.step().start == []  # team-b's idle capacity is reserved: nothing moves
    queue.end("a1")
    decision = queue.step()
    assert decision.start == ["a2"]
    assert decision.waiting == {"a3": f"waiting for capacity: share team-a uses 4 of 4 {P4D}"}


def test_a_borrower_uses_a_lenders_idle_capacity_and_is_preempted_when_the_lender_submits() -> None:
    queue = Queue({P4D: 8}, Share("team-a", {P4D: 4}, LEND), Share("team-b", {P4D: 4}, LEND_AND_BORROW))
    queue.submit("b1", "team-b", 4)
    queue.submit("b2", "team-b", 4)
    assert queue.step().start == ["b1", "b2"]  # b2 borrows team-a's idle four
    queue.submit("a1", "team-a", 4)
    decision = queue.step()
    assert decision.start == []
    assert decision.preempt == {"b2": "Preempted to return capacity lent by share team-a"}
    assert decision.waiting == {"a1": f"waiting for borrowed {P4D} to be returned to share team-a"}
    assert queue.step().preempt == {}  # a job already stopping is not preempted again, nor another in its place
    queue.requeue("b2")
    decision = queue.step()
    assert decision.start == ["a1"]
    assert decision.waiting == {"b2": f"waiting for capacity: share team-b uses 4 of 4 {P4D}; no idle capacity is lent"}
    assert queue.running() == ["a1", "b1"]


def test_the_borrower_preempted_is_the_lowest_priority_then_the_latest_started() -> None:
    queue = Queue({P4D: 6}, Share("team-a", {P4D: 2}, LEND), Share("team-b", {P4D: 4}, LEND_AND_BORROW))
    for name, priority in (("b1", 5), ("b2", 1), ("b3", 1)):
        queue.submit(name, "team-b", 2, priority)
        queue.step()
    assert queue.running() == ["b1", "b2", "b3"]
    queue.submit("a1", "team-a", 2)
    assert queue.step().preempt == {"b3": "Preempted to return capacity lent by share team-a"}


def test_a_reserve_share_never_lends_its_idle_capacity() -> None:
    queue = Queue({P4D: 8}, Share("team-a", {P4D: 4}, RESERVE), Share("team-b", {P4D: 4}, LEND_AND_BORROW))
    queue.submit("b1", "team-b", 4)
    queue.submit("b2", "team-b", 1)
    decision = queue.step()
    assert decision.start == ["b1"]
    assert decision.waiting == {"b2": f"waiting for capacity: share team-b uses 4 of 4 {P4D}; no idle capacity is lent"}


def test_capacity_no_share_covers_can_be_borrowed() -> None:
    queue = Queue({P4D: 10}, Share("team-a", {P4D: 4}, RESERVE), Share("team-b", {P4D: 4}, LEND_AND_BORROW))
    queue.submit("b1", "team-b", 6)
    assert queue.step().start == ["b1"]


def test_the_borrow_limit_caps_borrowing_as_a_percentage_of_the_shares_own_limit() -> None:
    queue = Queue(
        {P4D: 16}, Share("team-a", {P4D: 8}, LEND), Share("team-b", {P4D: 4}, LEND_AND_BORROW, borrow_limit=50)
    )
    queue.submit("b1", "team-b", 4)
    queue.submit("b2", "team-b", 2)  # borrows 2: 50% of 4
    queue.submit("b3", "team-b", 1)
    decision = queue.step()
    assert decision.start == ["b1", "b2"]
    assert decision.waiting == {
        "b3": f"waiting for capacity: share team-b uses 6 of 4 {P4D} and may borrow at most 2 more (borrow limit 50%)"
    }


def test_a_lend_share_does_not_borrow() -> None:
    queue = Queue({P4D: 8}, Share("team-a", {P4D: 4}, LEND), Share("team-b", {P4D: 4}, LEND))
    queue.submit("a1", "team-a", 6)
    assert queue.step().waiting == {"a1": f"waiting for capacity: share team-a uses 0 of 4 {P4D}"}


def test_priorities_order_the_jobs_of_a_share_and_a_job_waits_behind_those_before_it() -> None:
    queue = Queue({P4D: 4}, Share("team-a", {P4D: 4}))
    queue.submit("low", "team-a", 2, priority=1)
    queue.submit("high", "team-a", 4, priority=9)
    decision = queue.step()
    assert decision.start == ["high"]
    queue.end("high")
    queue.submit("higher", "team-a", 4, priority=20)
    queue.submit("small", "team-a", 1, priority=0)
    assert queue.step().start == ["higher"]
    queue.end("higher")
    assert queue.step().start == ["low", "small"]


def test_a_job_of_an_instance_type_without_a_limit_waits_saying_so() -> None:
    queue = Queue({P4D: 4}, Share("team-a", {P4D: 4}))
    queue.submit("g5", "team-a", 1, instance_type="ml.g5.xlarge")
    assert queue.step().waiting == {"g5": "waiting: the service environment has no capacity limit for ml.g5.xlarge"}


@pytest.mark.parametrize("enabled", [False, True])
def test_in_share_preemption_only_when_the_share_enables_it(enabled: bool) -> None:
    queue = Queue({P4D: 4}, Share("team-a", {P4D: 4}, in_share_preemption=enabled))
    queue.submit("low", "team-a", 4, priority=1)
    queue.step()
    queue.submit("high", "team-a", 4, priority=9)
    decision = queue.step()
    assert decision.start == []
    if not enabled:
        assert decision.preempt == {}
        assert decision.waiting == {"high": f"waiting for capacity: share team-a uses 4 of 4 {P4D}"}
        return
    assert decision.preempt == {"low": "Preempted by a higher-priority job of share team-a (high)"}
    assert decision.waiting == {"high": f"waiting for preempted jobs of share team-a to release {P4D}"}
    queue.requeue("low")
    assert queue.step().start == ["high"]


def test_in_share_preemption_never_preempts_equal_or_higher_priorities() -> None:
    queue = Queue({P4D: 4}, Share("team-a", {P4D: 4}, in_share_preemption=True))
    queue.submit("first", "team-a", 4, priority=5)
    queue.step()
    queue.submit("same", "team-a", 4, priority=5)
    assert queue.step().preempt == {}


# -- the player, through boto3 in moto ----------------------------------------------------------------------
class FakeTraining:
    """The platform's SageMaker hooks, scripted: a job trains until the test ends it; a stopped job ends Stopped."""

    def __init__(self) -> None:
        self.requests: dict[str, dict[str, Any]] = {}
        self.stopped_names: list[str] = []
        self.done: set[str] = set()

    def created(self, name: str, request: dict[str, Any], _job: Any) -> None:
        self.requests[name] = request

    def described(self, name: str, job: Any) -> None:
        if name in self.stopped_names:
            job.training_job_status = job.secondary_status = "Stopped"
        elif name in self.done:
            job.training_job_status = job.secondary_status = "Completed"
        else:
            job.secondary_status = "Training"

    def stopped(self, name: str, _job: Any) -> None:
        self.stopped_names.append(name)

    def finish(self, job_arn: str) -> None:
        """Complete the training job of that ARN (whose name SageMaker lower-cases)."""
        self.done.update(n for n in self.requests if n.lower() == job_arn.rsplit("/", 1)[1])


def payload(name: str, count: int) -> str:
    return json.dumps(
        {
            "TrainingJobName": name,
            "RoleArn": "arn:aws:iam::123456789012:role/TrainingRole",
            "AlgorithmSpecification": {"TrainingImage": "image:latest", "TrainingInputMode": "File"},
            "OutputDataConfig": {"S3OutputPath": "s3://artifacts/out/"},
            "ResourceConfig": {"InstanceType": P4D, "InstanceCount": count, "VolumeSizeInGB": 100},
            "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
            "CheckpointConfig": {"S3Uri": f"s3://artifacts/checkpoints/{name}/"},
        }
    )


@pytest.fixture
def player() -> Iterator[tuple[Any, LocalServiceJobs, FakeTraining]]:
    training = FakeTraining()
    jobs = LocalServiceJobs(
        queue="teams",
        capacity={P4D: 8},
        shares=[Share("team-a", {P4D: 4}, LEND), Share("team-b", {P4D: 4}, LEND_AND_BORROW)],
        created=training.created,
        described=training.described,
        stopped=training.stopped,
    )
    with mock_aws(), contextlib.ExitStack() as stack:
        for patch in jobs.patches():
            stack.enter_context(patch)
        yield boto3.client("batch", region_name=REGION), jobs, training


def submit(batch: Any, name: str, share: str, count: int, **extra: Any) -> str:
    answer = batch.submit_service_job(
        jobName=name,
        jobQueue="teams",
        serviceJobType="SAGEMAKER_TRAINING",
        serviceRequestPayload=payload(name, count),
        quotaShareName=share,
        **extra,
    )
    assert answer["jobArn"].endswith(f":service-job/{answer['jobId']}")
    return str(answer["jobId"])


def test_a_borrowers_service_job_is_preempted_requeued_and_resumes_as_a_new_training_job(player: Any) -> None:
    batch, jobs, training = player
    sagemaker = boto3.client("sagemaker", region_name=REGION)
    b1 = submit(batch, "b1", "team-b", 4)
    b2 = submit(batch, "b2", "team-b", 4)
    described = batch.describe_service_job(jobId=b2)
    assert described["status"] == "RUNNING"
    assert described["capacityUsage"] == [{"capacityUnit": P4D, "quantity": 4.0}]
    first = described["latestAttempt"]["serviceResourceId"]
    assert first["name"] == "TrainingJobArn" and "training-job/awsbatchb2" in first["value"]
    (b2_training,) = [n for n in training.requests if n.startswith("AWSBatchb2")]
    assert training.requests[b2_training]["CheckpointConfig"]["S3Uri"] == "s3://artifacts/checkpoints/b2/"
    assert sagemaker.describe_training_job(TrainingJobName=b2_training)["TrainingJobStatus"] == "InProgress"

    a1 = submit(batch, "a1", "team-a", 4)  # team-a wants its lent capacity back
    assert training.stopped_names == [b2_training]  # SIGTERM: the trainer checkpoints
    assert jobs.jobs[a1].status_reason == f"waiting for borrowed {P4D} to be returned to share team-a"
    # b2's training job has stopped: a1 is scheduled (its training job created), then runs; b2 is requeued.
    assert batch.describe_service_job(jobId=a1)["status"] == "SCHEDULED"
    assert batch.describe_service_job(jobId=a1)["status"] == "RUNNING"
    requeued = batch.describe_service_job(jobId=b2)
    assert requeued["status"] == "RUNNABLE"
    assert requeued["statusReason"] == f"waiting for capacity: share team-b uses 4 of 4 {P4D}; no idle capacity is lent"
    assert requeued["preemptionSummary"]["preemptedAttemptCount"] == 1
    (preempted,) = requeued["preemptionSummary"]["recentPreemptedAttempts"]
    assert preempted["statusReason"] == "Preempted to return capacity lent by share team-a"
    assert preempted["serviceResourceId"] == first
    listed = batch.list_service_jobs(jobQueue="teams", jobStatus="RUNNABLE")["jobSummaryList"]
    assert [j["jobName"] for j in listed] == ["b2"]

    training.finish(batch.describe_service_job(jobId=a1)["latestAttempt"]["serviceResourceId"]["value"])
    resumed = batch.describe_service_job(jobId=b2)  # a1 completed: team-a's capacity is idle again, b2 borrows it
    assert batch.describe_service_job(jobId=a1)["status"] == "SUCCEEDED"
    (_, second) = [n for n in training.requests if n.startswith("AWSBatchb2")]
    assert resumed["status"] == "SCHEDULED"
    assert jobs.log[-2:] == [f"a1: SUCCEEDED: {COMPLETED}", f"b2: scheduled as training job {second}"]
    assert len(resumed["attempts"]) == 2 and resumed["latestAttempt"]["serviceResourceId"] != first
    assert training.requests[second]["CheckpointConfig"] == training.requests[b2_training]["CheckpointConfig"]

    batch.terminate_service_job(jobId=b1, reason="no longer needed")
    assert training.stopped_names[-1].startswith("AWSBatchb1")
    ended = batch.describe_service_job(jobId=b1)
    assert (ended["status"], ended["statusReason"], ended["isTerminated"]) == ("FAILED", "no longer needed", True)


def test_preemption_retries_exhausted_fail_the_job(player: Any) -> None:
    batch, _, _ = player
    b1 = submit(batch, "b1", "team-b", 4)
    b2 = submit(batch, "b2", "team-b", 4, preemptionConfiguration={"preemptionRetriesBeforeTermination": 0})
    submit(batch, "a1", "team-a", 4)
    described = batch.describe_service_job(jobId=b2)
    assert described["status"] == "FAILED"
    assert described["statusReason"] == (
        "Preempted to return capacity lent by share team-a; preemption retries exhausted (0)"
    )
    assert batch.describe_service_job(jobId=b1)["status"] == "RUNNING"


def test_a_submit_repeating_a_client_token_and_its_request_is_refused_whoever_sent_the_first(player: Any) -> None:
    """SubmitServiceJob's clientToken (the API reference): two submits of one token and an identical request are the
    same request, and the second is rejected; it never answers the first's job, which may be anyone's."""
    batch, jobs, _ = player
    first = submit(batch, "b1", "team-b", 4, clientToken="b1-token")
    with pytest.raises(ClientError, match="already submitted with client token 'b1-token'"):
        submit(batch, "b1", "team-b", 4, clientToken="b1-token")
    assert submit(batch, "b1", "team-b", 4, clientToken="other") != first
    assert submit(batch, "b1", "team-b", 2, clientToken="b1-token") != first  # another request: a job of its own
    assert len(jobs.jobs) == 3


def test_submits_the_queue_cannot_take_are_refused(player: Any) -> None:
    batch, _, _ = player
    with pytest.raises(ClientError, match="quotaShareName 'team-c' is not a quota share of teams"):
        submit(batch, "c1", "team-c", 1)
    with pytest.raises(ClientError, match="Service job nope does not exist"):
        batch.describe_service_job(jobId="nope")


# -- IAM --------------------------------------------------------------------------------------------------
def test_the_service_job_operations_are_judged_on_the_reference_resources_and_keys() -> None:
    params = {
        "submitservicejob": {
            "jobName": "b1",
            "jobQueue": "teams",
            "serviceJobType": "SAGEMAKER_TRAINING",
            "serviceRequestPayload": "{}",
            "quotaShareName": "team-b",
            "schedulingPriority": 7,
            "tags": {"team": "b"},
        },
        "describeservicejob": {"jobId": "j-1"},
        "terminateservicejob": {"jobId": "j-1", "reason": "x"},
        "listservicejobs": {},
    }
    judged = {}
    for path, operation in (
        (p, o) for p, o in _BATCH_OPERATIONS.items() if p.endswith("servicejob") or p == "listservicejobs"
    ):
        requests = REQUEST_MODEL[("batch", operation)](Call("batch", operation, params[path]))
        judged[operation] = [(r.action, r.resource) for r in requests]
        for request in requests:
            (action,) = actions_matching(request.action)
            if request.resource == "*":
                assert not action.resource_formats, request
            else:
                assert any(resource_matches(request.resource, f) for _, f in action.resource_formats), request
            assert all(k in action.condition_keys for k in request.context if not k.startswith("aws:")), request
    queue = "arn:aws:batch:us-east-1:123456789012:job-queue/teams"
    assert judged == {
        "SubmitServiceJob": [
            ("batch:SubmitServiceJob", queue),
            ("batch:SubmitServiceJob", f"{queue}/quota-share/team-b"),
            ("batch:TagResource", "arn:aws:batch:us-east-1:123456789012:service-job/*"),
        ],
        "DescribeServiceJob": [("batch:DescribeServiceJob", "*")],
        "TerminateServiceJob": [("batch:TerminateServiceJob", "arn:aws:batch:us-east-1:123456789012:service-job/j-1")],
        "ListServiceJobs": [("batch:ListServiceJobs", "*")],
    }


def test_the_local_iam_judges_which_quota_share_a_role_may_submit_to(player: Any) -> None:
    batch, _, _ = player
    iam = boto3.client("iam", region_name=REGION)
    trust = {"Statement": [{"Effect": "Allow", "Principal": {"Service": LAMBDA}, "Action": "sts:AssumeRole"}]}
    iam.create_role(RoleName="TeamB", AssumeRolePolicyDocument=json.dumps(trust))
    queue = f"arn:aws:batch:{REGION}:{ACCOUNT}:job-queue/teams"
    grant = {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": "batch:SubmitServiceJob", "Resource": [queue, f"{queue}/quota-share/team-b"]},
            {"Effect": "Allow", "Action": "batch:DescribeServiceJob", "Resource": "*"},
        ],
    }
    iam.put_role_policy(RoleName="TeamB", PolicyName="submit", PolicyDocument=json.dumps(grant))
    local = LocalIam(cast(Any, None), cast(Any, None), operator_key=os.environ["AWS_ACCESS_KEY_ID"])
    keys = local.credentials(f"arn:aws:iam::{ACCOUNT}:role/TeamB", LAMBDA)
    other = submit(batch, "a0", "team-a", 1)  # as the account's administrator
    with local.enforced():
        team_b = boto3.client(
            "batch",
            region_name=REGION,
            aws_access_key_id=keys.access_key,
            aws_secret_access_key=keys.secret_key,
            aws_session_token=keys.token,
        )
        mine = submit(team_b, "b1", "team-b", 1)
        assert team_b.describe_service_job(jobId=mine)["quotaShareName"] == "team-b"
        with pytest.raises(ClientError, match=f"batch:SubmitServiceJob on resource: {queue}/quota-share/team-a"):
            submit(team_b, "a1", "team-a", 1)
        with pytest.raises(ClientError, match=f"batch:TerminateServiceJob on resource: .*:service-job/{other}"):
            team_b.terminate_service_job(jobId=other, reason="not mine")
    denied = [(j.action, j.resource.rsplit(":", 1)[1]) for j in local.denials()]
    assert denied == [
        ("batch:SubmitServiceJob", "job-queue/teams/quota-share/team-a"),
        ("batch:TerminateServiceJob", f"service-job/{other}"),
    ]
