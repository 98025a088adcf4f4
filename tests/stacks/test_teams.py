"""Teams: the settings, the quota-managed Batch queue and its shares, the grants to submit to it, and each team's
budget stop (the Service Authorization Reference check runs on the variant's teams in test_iam_reference)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Match, Template

from lambdas.queue.waits import BLOCKED
from localrun.aws.cfn import ACCOUNT, REGION
from localrun.aws.iam_policy import Policy, Request, allows, evaluate
from stacks.settings import SettingsError, build_settings
from tests.conftest import APPROVER, SERVICE_ENVIRONMENT, TEAMS, cdk_context
from tests.support.iam import AssemblyIam
from tests.support.templates import get_att, logical_id, resources, template

REPO = Path(__file__).resolve().parents[2]
P4D = "ml.p4d.24xlarge"
TEAM_TYPES = ("AWS::Batch::SchedulingPolicy", "AWS::Batch::ServiceEnvironment", "AWS::Batch::QuotaShare")
SERVICE_JOB_ACTIONS = ("batch:SubmitServiceJob", "batch:DescribeServiceJob", "batch:TerminateServiceJob")


def teams_settings(**changes: Any) -> dict[str, Any]:
    """cdk.json's settings with the variant's teams (p4d allowed), `changes` replacing top-level keys."""
    base = cdk_context()["platform"]
    base["pipeline"] = {"allowed_instance_types": [P4D, "ml.p5.48xlarge"]}
    return {**base, "teams": copy.deepcopy(TEAMS), "service_environment": SERVICE_ENVIRONMENT, **changes}


# -- settings -----------------------------------------------------------------------------------------------
def test_the_shipped_settings_have_no_teams_and_the_variant_two() -> None:
    assert build_settings(cdk_context()["platform"]).teams == []
    settings = build_settings(teams_settings())
    assert [t.name for t in settings.teams] == ["vision", "language"]
    vision = settings.teams[0].quota_share
    assert (vision.sharing, vision.borrow_limit_percent, vision.in_share_preemption) == ("LEND_AND_BORROW", 100, True)
    assert settings.teams[1].quota_share.sharing == "RESERVE"


def test_every_problem_of_a_team_is_listed_at_once() -> None:
    vision, language = copy.deepcopy(TEAMS)
    vision["name"] = "Vision"
    vision["members"] = ["not-an-arn"]
    vision["quota_share"] = {"capacity": {P4D: 1, "ml.p9.huge": 1}, "sharing": "RESERVE", "borrow_limit_percent": 50}
    language.pop("member_tag")
    language["quota_share"] = {
        "capacity": {
            f"ml.{t}": 1 for t in ("p4d.24xlarge", "p5.48xlarge", "g5.xlarge", "g5.2xlarge", "g6.xlarge", "m5.xlarge")
        }
    }
    language["dataset_prefixes"] = ["/language", "language/./web/", "language/%2e%2e/"]
    with pytest.raises(SettingsError) as err:
        build_settings(teams_settings(teams=[vision, language]))
    message = str(err.value)
    for expected in (
        "teams.0.name = 'Vision': must start with a lowercase letter",
        "teams.0.members = ['not-an-arn']: must be IAM role/user ARNs",
        "unknown training instance type 'ml.p9.huge'",
        "teams.0.quota_share.borrow_limit_percent = 50: applies only to sharing LEND_AND_BORROW, not RESERVE",
        "teams.1.quota_share.capacity",
        "must name 1 to 5 instance types; it names 6",
        "must be key prefixes of the datasets bucket in their normal form, ending with '/': '/language' has an "
        "empty segment",
        "'language/./web/' has a '.' segment",
        "'language/%2e%2e/' has '%' in '%2e%2e'",
        "teams.1.member_tag: the team has no members: name IAM role ARNs in `members` or set `member_tag`",
    ):
        assert expected in message, f"{expected!r} missing from:\n{message}"


def test_teams_that_do_not_fit_the_service_environment_are_refused_with_every_reason() -> None:
    vision, language = copy.deepcopy(TEAMS)
    vision["quota_share"]["capacity"] = {P4D: 12, "ml.p5.48xlarge": 1}
    language["name"] = "vision"
    language["dataset_prefixes"] = ["vision/frames/"]
    with pytest.raises(SettingsError) as err:
        build_settings(teams_settings(teams=[vision, language], service_environment={"capacity": {P4D: 8}}))
    message = str(err.value)
    for expected in (
        "the name 'vision' is used 2 times; give each team its own name",
        "teams[0].quota_share.capacity['ml.p4d.24xlarge'] = 12: above the service environment's 8; lower it or "
        "raise service_environment.capacity['ml.p4d.24xlarge']",
        "teams[0].quota_share.capacity['ml.p5.48xlarge'] = 1: the service environment has no ml.p5.48xlarge; add it",
        "teams[0].dataset_prefixes 'vision/' (vision) overlaps teams[1].dataset_prefixes 'vision/frames/' (vision)",
    ):
        assert expected in message, f"{expected!r} missing from:\n{message}"


def test_the_service_environment_needs_teams_capacity_and_allowed_types() -> None:
    with pytest.raises(SettingsError, match=r"service_environment.capacity is empty but teams are set"):
        build_settings(teams_settings(service_environment={"capacity": {}}))
    with pytest.raises(SettingsError, match=r"service_environment.capacity is set but no teams are"):
        build_settings(teams_settings(teams=[]))
    with pytest.raises(SettingsError, match=r"capacity\['ml.g5.xlarge'\] = 2: ml.g5.xlarge is not in pipeline.allowed"):
        build_settings(teams_settings(service_environment={"capacity": {P4D: 8, "ml.g5.xlarge": 2}}))


def test_the_longest_queue_wait_is_within_what_the_queue_enforces() -> None:
    """AWS Batch's jobStateTimeLimitActions take 600 to 86,400 seconds."""
    for minutes in (9, 24 * 60 + 1):
        environment = {**SERVICE_ENVIRONMENT, "max_queue_wait_minutes": minutes}
        with pytest.raises(SettingsError, match=r"service_environment.max_queue_wait_minutes"):
            build_settings(teams_settings(service_environment=environment))
    default = build_settings(teams_settings()).service_environment
    assert default.max_queue_wait_minutes == 24 * 60
    assert (
        build_settings(teams_settings())
        .platform_limits(
            datasets_bucket="d", artifacts_bucket="a", fsx_file_system_id="f", fsx_mount_name="m", tags={}, backends=()
        )
        .max_queue_wait_minutes
        == 24 * 60
    )


# -- templates ----------------------------------------------------------------------------------------------
def test_without_teams_nothing_of_them_is_synthesized(platform: Any) -> None:
    for type_ in TEAM_TYPES:
        assert resources(platform, platform.pipeline, type_) == {}
    text = json.dumps(platform.assembly.get_stack_by_name(platform.pipeline.stack_name).template)
    assert not any(action in text for action in SERVICE_JOB_ACTIONS)
    assert "platform-team" not in text


def test_the_teams_queue_is_quota_managed_sagemaker_training(variant: Any) -> None:
    t = template(variant, variant.pipeline)
    t.has_resource_properties(
        "AWS::Batch::SchedulingPolicy", {"QuotaSharePolicy": {"IdleResourceAssignmentStrategy": "FIFO"}}
    )
    t.has_resource_properties(
        "AWS::Batch::ServiceEnvironment",
        {"ServiceEnvironmentType": "SAGEMAKER_TRAINING", "CapacityLimits": [{"CapacityUnit": P4D, "MaxCapacity": 8}]},
    )
    policy = logical_id(variant, variant.pipeline, "AWS::Batch::SchedulingPolicy", "Teams")
    environment = logical_id(variant, variant.pipeline, "AWS::Batch::ServiceEnvironment", "Teams")
    t.has_resource_properties(
        "AWS::Batch::JobQueue",
        {
            "JobQueueType": "SAGEMAKER_TRAINING",
            "SchedulingPolicyArn": get_att(policy, "Arn"),
            "ServiceEnvironmentOrder": [
                {"Order": 1, "ServiceEnvironment": get_att(environment, "ServiceEnvironmentArn")}
            ],
            # A job blocked at the head of the queue is terminated after the settings' longest wait.
            "JobStateTimeLimitActions": [
                {"Action": "TERMINATE", "MaxTimeSeconds": 24 * 3600, "Reason": reason, "State": "RUNNABLE"}
                for reason in BLOCKED
            ],
        },
    )


def test_each_team_has_its_quota_share(variant: Any) -> None:
    t = template(variant, variant.pipeline)
    queue = logical_id(variant, variant.pipeline, "AWS::Batch::JobQueue", "Teams")
    t.resource_count_is("AWS::Batch::QuotaShare", 2)
    t.has_resource_properties(
        "AWS::Batch::QuotaShare",
        {
            "QuotaShareName": "vision",
            "JobQueue": get_att(queue, "JobQueueArn"),
            "CapacityLimits": [{"CapacityUnit": P4D, "MaxCapacity": 4}],
            "ResourceSharingConfiguration": {"Strategy": "LEND_AND_BORROW", "BorrowLimit": 100},
            "PreemptionConfiguration": {"InSharePreemption": "ENABLED"},
            "Tags": Match.object_like({"platform-team": "vision"}),
        },
    )
    t.has_resource_properties(
        "AWS::Batch::QuotaShare",
        {
            "QuotaShareName": "language",
            "CapacityLimits": [{"CapacityUnit": P4D, "MaxCapacity": 2}],
            "ResourceSharingConfiguration": {"Strategy": "RESERVE", "BorrowLimit": Match.absent()},
            "PreemptionConfiguration": {"InSharePreemption": "DISABLED"},
        },
    )


@pytest.fixture(scope="module")
def variant_iam(variant: Any) -> AssemblyIam:
    return AssemblyIam(Path(variant.assembly.directory))


def queue_arns(variant_iam: AssemblyIam) -> tuple[str, dict[str, str]]:
    """The teams' queue ARN and each team's share ARN, resolved."""
    ((stack, queue, _),) = [r for r in variant_iam.resources("AWS::Batch::JobQueue") if "Teams" in r[1]]
    shares = {
        props["QuotaShareName"]: variant_iam.resolver.get_att(stack, logical, "QuotaShareArn")
        for stack, logical, props in variant_iam.resources("AWS::Batch::QuotaShare")
    }
    return variant_iam.resolver.get_att(stack, queue, "JobQueueArn"), shares


def state_machine_role(variant_iam: AssemblyIam) -> Any:
    ((_, _, props),) = [
        r for r in variant_iam.resources("AWS::StepFunctions::StateMachine") if r[1].startswith("TrainingPipeline")
    ]
    return variant_iam.roles[props["RoleArn"]]


def test_the_state_machine_submits_only_tagged_jobs_to_the_teams_shares(variant: Any, variant_iam: AssemblyIam) -> None:
    role = state_machine_role(variant_iam)
    queue, shares = queue_arns(variant_iam)
    # The variant's stacks name their Region; the resolver's own ARNs (the queue's) are of localrun's.
    job = f"arn:aws:batch:{variant.settings.region}:{ACCOUNT}:service-job/0123abcd"
    tagged = {"aws:RequestTag/platform-team": "vision"}
    for resource in (queue, shares["vision"], shares["language"], job):
        assert role.may("batch:SubmitServiceJob", resource, **tagged), resource
        assert not role.may("batch:SubmitServiceJob", resource), f"{resource} without the team tag"
        assert not role.may("batch:SubmitServiceJob", resource, **{"aws:RequestTag/platform-team": "other"})
    other_queue = f"arn:aws:batch:{REGION}:{ACCOUNT}:job-queue/other"
    assert not role.may("batch:SubmitServiceJob", other_queue, **tagged)
    assert not role.may("batch:SubmitServiceJob", f"{other_queue}/quota-share/vision", **tagged)
    # Following and terminating are the queue step's handlers', not the state machine's.
    assert not role.may("batch:TerminateServiceJob", job, **{"aws:ResourceTag/platform-team": "language"})
    assert not role.may("batch:DescribeServiceJob", "*")


def function_role(variant_iam: AssemblyIam, name: str) -> Any:
    ((_, _, props),) = [
        r for r in variant_iam.resources("AWS::Lambda::Function") if r[1].startswith(name) and "Role" in r[2]
    ]
    return variant_iam.roles[props["Role"]]


def test_the_queue_steps_handlers_follow_service_jobs_and_terminate_only_the_teams(
    variant: Any, variant_iam: AssemblyIam
) -> None:
    job = f"arn:aws:batch:{variant.settings.region}:{ACCOUNT}:service-job/0123abcd"
    poll, stop = function_role(variant_iam, "PollServiceJob"), function_role(variant_iam, "StopServiceJobs")
    assert poll.may("batch:DescribeServiceJob", "*") and poll.may("sagemaker:ListTrainingJobs", "*")
    assert poll.may(
        "sagemaker:DescribeTrainingJob", f"arn:aws:sagemaker:{variant.settings.region}:{ACCOUNT}:training-job/x"
    )
    assert not poll.may("batch:TerminateServiceJob", job, **{"aws:ResourceTag/platform-team": "vision"})
    assert stop.may("batch:ListServiceJobs", "*") and stop.may("batch:DescribeServiceJob", "*")
    for team in ("vision", "language"):
        assert stop.may("batch:TerminateServiceJob", job, **{"aws:ResourceTag/platform-team": team})
    assert not stop.may("batch:TerminateServiceJob", job)
    assert not stop.may("batch:TerminateServiceJob", job, **{"aws:ResourceTag/platform-team": "other"})
    assert not stop.may("batch:SubmitServiceJob", job, **{"aws:RequestTag/platform-team": "vision"})


def test_the_execution_role_is_passed_to_sagemaker_only(variant_iam: AssemblyIam) -> None:
    role = state_machine_role(variant_iam)
    (execution,) = [r for r in variant_iam.roles.values() if "TrainingExecutionRole" in r.logical]
    assert role.may("iam:PassRole", execution.arn, **{"iam:PassedToService": "sagemaker.amazonaws.com"})
    assert not role.may("iam:PassRole", execution.arn, **{"iam:PassedToService": "batch.amazonaws.com"})
    other = f"arn:aws:iam::{ACCOUNT}:role/Other"
    assert not role.may("iam:PassRole", other, **{"iam:PassedToService": "sagemaker.amazonaws.com"})


def test_each_teams_budget_stops_only_its_own_submissions(variant: Any, variant_iam: AssemblyIam) -> None:
    t = template(variant, variant.pipeline)
    for team, limit in (("vision", 2000), ("language", 1000)):
        t.has_resource_properties(
            "AWS::Budgets::Budget",
            {
                "Budget": Match.object_like(
                    {
                        "BudgetLimit": {"Amount": limit, "Unit": "USD"},
                        "CostFilters": {"TagKeyValue": [f"user:platform-team${team}"]},
                        "TimeUnit": "MONTHLY",
                    }
                )
            },
        )
    t.has_resource_properties(
        "AWS::Budgets::Budget",
        {
            "NotificationsWithSubscribers": Match.array_with(
                [
                    Match.object_like(
                        {
                            "Subscribers": Match.array_with(
                                [{"Address": "vision@example.org", "SubscriptionType": "EMAIL"}]
                            )
                        }
                    )
                ]
            )
        },
    )
    role = state_machine_role(variant_iam)
    _, shares = queue_arns(variant_iam)
    stops = {
        logical: props
        for _, logical, props in variant_iam.resources("AWS::IAM::ManagedPolicy")
        if logical.startswith("TeamBudget")
    }
    actions = {
        logical: props
        for _, logical, props in variant_iam.resources("AWS::Budgets::BudgetsAction")
        if logical.startswith("TeamBudget")
    }
    assert len(stops) == len(actions) == 2
    for team, other in (("vision", "language"), ("language", "vision")):
        (logical,) = [k for k in stops if k.startswith(f"TeamBudget{team}")]
        deny = Policy.parse(logical, stops[logical]["PolicyDocument"])
        stopped = [*role.policies, deny]
        tagged = {"aws:RequestTag/platform-team": team}
        assert not allows(stopped, "batch:SubmitServiceJob", shares[team], **tagged), team
        assert not allows(stopped, "batch:SubmitServiceJob", shares[team]), f"{team}'s share, untagged"
        theirs = {"aws:RequestTag/platform-team": other}
        assert allows(stopped, "batch:SubmitServiceJob", shares[other], **theirs), f"{team}'s stop blocks {other}"
        # Every backend's job of the team, by its cost tag; no other team's.
        for action in ("sagemaker:CreateTrainingJob", "sagemaker:CreateHyperParameterTuningJob", "batch:SubmitJob"):
            assert deny.statements()[0]["Action"].count(action) == 1, action
            mine, theirs = {"aws:RequestTag/platform-team": team}, {"aws:RequestTag/platform-team": other}
            assert not allows([deny, _everything(action)], action, "*", **mine), (team, action)
            assert allows([deny, _everything(action)], action, "*", **theirs), (team, action)
        (action,) = [a for k, a in actions.items() if k.startswith(f"TeamBudget{team}")]
        definition = action["Definition"]["IamActionDefinition"]
        validate = next(r for r in variant_iam.roles.values() if r.logical.startswith("ValidateRole"))
        assert definition["Roles"] == [role.arn.rsplit("/", 1)[1], validate.arn.rsplit("/", 1)[1]]
        assert action["ActionThreshold"] == {"Type": "PERCENTAGE", "Value": 100}


def _everything(action: str) -> Policy:
    return Policy.parse("allow", {"Statement": [{"Effect": "Allow", "Action": action, "Resource": "*"}]})


# -- approvals and e-mails -----------------------------------------------------------------------------------
VISION_LEAD = TEAMS[0]["approvers"][0]


def test_a_teams_approvers_decide_its_runs_and_may_call_the_decision_url(variant: Any) -> None:
    functions = resources(variant, variant.pipeline, "AWS::Lambda::Function")
    decide = logical_id(variant, variant.pipeline, "AWS::Lambda::Function", "ApprovalDecide")
    environment = functions[decide]["Properties"]["Environment"]["Variables"]
    # language names no approvers: the platform's decide its runs.
    assert json.loads(environment["TEAM_APPROVERS"]) == {"vision": [VISION_LEAD]}
    assert json.loads(environment["APPROVERS"]) == [APPROVER]
    url_callers = [
        p["Properties"]
        for p in resources(variant, variant.pipeline, "AWS::Lambda::Permission").values()
        if p["Properties"]["Action"] == "lambda:InvokeFunctionUrl"
    ]
    assert sorted(p["Principal"] for p in url_callers) == sorted([APPROVER, VISION_LEAD])
    assert all(p["FunctionName"] == get_att(decide, "Arn") for p in url_callers)


def test_a_teams_addresses_subscribe_once_to_its_runs_and_approval_requests(variant: Any) -> None:
    subscriptions = [
        s["Properties"]
        for s in resources(variant, variant.pipeline, "AWS::SNS::Subscription").values()
        if s["Properties"]["Endpoint"] == "vision@example.org"
    ]
    assert subscriptions == [
        {
            "Endpoint": "vision@example.org",
            "Protocol": "email",
            "TopicArn": {"Ref": logical_id(variant, variant.pipeline, "AWS::SNS::Topic", "TopicsRuns")},
            "FilterPolicy": {
                "$or": [
                    {"kind": ["approval"], "team": ["vision"]},
                    {"kind": ["run"], "recipients": ["vision@example.org"]},
                ]
            },
        }
    ]


def test_an_address_both_a_run_email_and_a_teams_has_one_subscription() -> None:
    from stacks.app_builder import build_platform

    context = cdk_context(**teams_settings())
    context["platform"]["notifications"] = {
        "approval_emails": ["vision@example.org"],
        "run_emails": ["vision@example.org"],
    }
    subscriptions = [
        s["Properties"]
        for s in Template.from_stack(build_platform(context).pipeline).find_resources("AWS::SNS::Subscription").values()
        if s["Properties"]["Endpoint"] == "vision@example.org"
    ]
    # Every approval request (an approver's inbox) covers the team's; runs only when they name it.
    assert [s["FilterPolicy"] for s in subscriptions] == [
        {"$or": [{"kind": ["approval"]}, {"kind": ["run"], "recipients": ["vision@example.org"]}]}
    ]


def test_a_member_who_is_the_teams_only_approver_is_refused_where_self_approval_is() -> None:
    vision, language = copy.deepcopy(TEAMS)
    vision["approvers"] = ["arn:aws:iam::123456789012:role/team-roles/VisionScientist"]  # a path: the same role
    with pytest.raises(SettingsError) as err:
        build_settings(teams_settings(teams=[vision, language]))
    assert (
        "teams[0] (vision): arn:aws:iam::123456789012:role/VisionScientist is both a member and the team's only "
        "approver" in str(err.value)
    )
    allowed = build_settings(teams_settings(teams=[vision, language], pipeline={"forbid_self_approval": False}))
    assert allowed.teams[0].approvers == vision["approvers"]
    vision["approvers"].append(VISION_LEAD)  # another approver decides the member's runs
    assert build_settings(teams_settings(teams=[vision, language])).teams[0].approvers[1] == VISION_LEAD


def test_cfn_lint_reports_nothing_on_the_teams_templates(variant: Any) -> None:
    pipeline = Path(variant.assembly.directory) / f"{variant.pipeline.stack_name}.template.json"
    result = subprocess.run(
        [str(Path(sys.executable).parent / "cfn-lint"), str(pipeline)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0 and result.stdout.strip() == "", result.stdout + result.stderr


def _validate_role(built_iam: AssemblyIam) -> Any:
    (function,) = [
        props
        for _, _, props in built_iam.resources("AWS::Lambda::Function")
        if props["Handler"] == "lambdas.validate.handler.handler"
    ]
    return built_iam.roles[function["Role"]]


ARTIFACTS_ARN = "arn:aws:s3:::artifacts"
S3_ENDPOINT = "vpce-s3"
# S3's "meaning of public": a bucket policy's Allow to every principal is public unless a condition fixes one of these.
NON_PUBLIC_KEYS = {
    "aws:sourceip",
    "aws:sourcearn",
    "aws:sourcevpc",
    "aws:sourcevpce",
    "aws:sourceowner",
    "aws:sourceaccount",
    "s3:x-amz-server-side-encryption-aws-kms-key-id",
    "aws:userid",
}


def _resolved_bucket_arns(value: Any) -> Any:
    """A bucket policy with the bucket's ARN (GetAtt Arn, and joined into object ARNs) as ARTIFACTS_ARN."""
    if isinstance(value, dict) and set(value) == {"Fn::GetAtt"}:
        return ARTIFACTS_ARN
    if isinstance(value, dict) and set(value) & {"Fn::ImportValue", "Fn::GetStackOutput"}:  # the S3 endpoint
        return S3_ENDPOINT
    if isinstance(value, dict) and set(value) == {"Fn::Join"}:
        return "".join(_resolved_bucket_arns(part) for part in value["Fn::Join"][1])
    if isinstance(value, dict):
        return {k: _resolved_bucket_arns(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolved_bucket_arns(v) for v in value]
    return value


def test_validate_reads_no_principals_tags_iam_judges_the_tag_on_the_artifacts_bucket(variant: Any) -> None:
    # Validate has no route to IAM and cannot see session tags: it holds no IAM read at all.
    role = _validate_role(AssemblyIam(Path(variant.assembly.directory)))
    for action in ("iam:ListRoleTags", "iam:ListUserTags", "iam:GetRole"):
        assert not role.may(action, f"arn:aws:iam::{ACCOUNT}:role/Linguist"), action
    # The artifacts bucket's policy decides the listing of a team's membership prefix by the principal tag alone.
    (policy,) = [
        p["Properties"]
        for p in resources(variant, variant.data, "AWS::S3::BucketPolicy").values()
        if p["Properties"]["Bucket"] == {"Ref": logical_id(variant, variant.data, "AWS::S3::Bucket", "Artifacts")}
    ]
    document = json.loads(json.dumps(policy["PolicyDocument"]).replace('{"Ref": "AWS::AccountId"}', f'"{ACCOUNT}"'))
    bucket = Policy("artifacts bucket policy", _resolved_bucket_arns(document), resource_policy=True)
    everything = Policy("the caller's own", {"Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]})

    def may_list(
        prefix: str, tags: dict[str, str], own: list[Policy], account: str = ACCOUNT, vpce: str | None = S3_ENDPOINT
    ) -> bool:
        context = {"s3:prefix": prefix, "aws:PrincipalAccount": account, "aws:SecureTransport": True}
        context |= {"aws:SourceVpce": vpce} if vpce else {}
        context |= {f"aws:PrincipalTag/{k}": v for k, v in tags.items()}
        request = Request("s3:ListBucket", ARTIFACTS_ARN, context, known_keys=None, principal="arn:aws:sts::x")
        return evaluate([*own, bucket], request).allowed

    language = "team-membership/language/"
    assert may_list(language, {"platform-team": "language"}, own=[])
    assert not may_list(language, {"platform-team": "language"}, own=[], account="210987654321")
    assert not may_list(language, {"platform-team": "language"}, own=[], vpce=None)  # only through the VPC's endpoint
    for tags in ({}, {"platform-team": "vision"}, {"platform-team": "Language"}, {"team": "language"}):
        assert not may_list(language, tags, own=[everything]), tags
    # vision has no member_tag: its prefix is not a proof of anything, and nothing else is denied.
    assert not may_list("team-membership/vision/", {"platform-team": "vision"}, own=[])
    assert may_list("runs/", {}, own=[everything])


def test_no_bucket_policy_is_public_so_block_public_access_accepts_it(variant: Any) -> None:
    """With BlockPublicPolicy on, S3 refuses a policy it deems public, and the retained data stack fails to deploy."""
    public = []
    for built in (variant,):
        for stack in built.stacks:
            for logical, policy in resources(built, stack, "AWS::S3::BucketPolicy").items():
                for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
                    everyone = statement.get("Principal") in ("*", {"AWS": "*"})
                    fixed = {key.lower() for key in statement.get("Condition", {}).get("StringEquals", {})}
                    if statement["Effect"] == "Allow" and everyone and not fixed & NON_PUBLIC_KEYS:
                        public.append((logical, statement.get("Sid")))
    assert public == []


def test_a_teams_code_prefix_is_written_once_by_its_listed_or_tagged_members_only() -> None:
    from aws_cdk import App, Environment

    from stacks.data_stack import DataStack
    from stacks.network_stack import NetworkStack

    context = cdk_context()
    teams = copy.deepcopy(TEAMS)
    teams[0]["member_tag"] = "vision"  # listed members, and a tag: either makes a member
    settings = build_settings({**context["platform"], "teams": teams, "service_environment": SERVICE_ENVIRONMENT})
    # The data stack alone, in an app of cdk.json's feature flags.
    app, env = (
        App(context={k: v for k, v in context.items() if k != "platform"}),
        Environment(account=ACCOUNT, region=REGION),
    )
    network = NetworkStack(app, "network", settings=settings, env=env)
    data = DataStack(app, "data", settings=settings, network=network.network, env=env)
    (policy,) = [
        p
        for p in Template.from_stack(data).find_resources("AWS::S3::BucketPolicy").values()
        if p["Properties"]["Bucket"]["Ref"].startswith("BucketsArtifacts")
    ]
    document = json.loads(
        json.dumps(policy["Properties"]["PolicyDocument"]).replace('{"Ref": "AWS::AccountId"}', f'"{ACCOUNT}"')
    )
    bucket = Policy("artifacts bucket policy", _resolved_bucket_arns(document), resource_policy=True)
    writer = Policy("the caller's own", {"Statement": [{"Effect": "Allow", "Action": "s3:PutObject", "Resource": "*"}]})

    def may_put(key: str, principal: str, tags: dict[str, str], *, once: bool = True) -> bool:
        context: dict[str, Any] = {"aws:PrincipalArn": principal, "aws:SecureTransport": True}
        context |= {"s3:if-none-match": "*"} if once else {}
        context |= {f"aws:PrincipalTag/{k}": v for k, v in tags.items()}
        request = Request("s3:PutObject", f"{ARTIFACTS_ARN}/{key}", context, known_keys=None, principal=principal)
        return evaluate([writer, bucket], request).allowed

    listed, other = f"arn:aws:iam::{ACCOUNT}:role/VisionScientist", f"arn:aws:iam::{ACCOUNT}:role/Linguist"
    vision = f"code/teams/vision/run/{'a' * 64}.tar.gz"
    assert may_put(vision, listed, {})
    assert may_put(vision, other, {"platform-team": "vision"})
    assert not may_put(vision, other, {"platform-team": "language"})
    assert not may_put(vision, listed, {}, once=False)  # never without If-None-Match: no archive is replaced
    assert may_put(f"code/teams/language/run/{'a' * 64}.tar.gz", other, {"platform-team": "language"})
    assert not may_put(f"code/teams/language/run/{'a' * 64}.tar.gz", listed, {})
    assert may_put("runs/run-1/output/model.tar.gz", other, {}, once=False)  # nothing else is judged
