"""`make review`: two revisions of a copy of this repository, synthesized and compared, on real changes."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tools.review import __main__ as review_cli
from tools.review import render, report, synth
from tools.review.__main__ import run_review
from tools.review.state_machine import compare, definition

REPO = Path(__file__).resolve().parents[2]
GIT = ["git", "-c", "user.name=Review Test", "-c", "user.email=review@example.org", "-c", "commit.gpgsign=false"]


def _git(root: Path, *args: str) -> str:
    return subprocess.run([*GIT, *args], cwd=root, check=True, capture_output=True, text=True).stdout.strip()


def _copy_of_this_repository(root: Path) -> Path:
    """This checkout's files (tracked and untracked, not ignored) committed as the first commit of a new repository."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        check=True,
        capture_output=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(source.read_bytes())
    # The shipped cdk.json as it is (no approvers): a review, unlike a deploy, takes it.
    _git(root, "init", "--quiet", "--initial-branch=main")
    # The review runs with this checkout's environment, as a CI job's `make setup` would provide it.
    for env in (".venv", "node_modules"):
        (root / env).symlink_to(REPO / env)
    (root / ".git" / "info" / "exclude").write_text("/.venv\n/node_modules\n")
    _git(root, "add", "--all")
    _git(root, "commit", "--quiet", "--message", "base")
    return root


def _edit(path: Path, anchor: str, replacement: str) -> None:
    text = path.read_text()
    assert text.count(anchor) == 1, f"{path.name} no longer has {anchor!r}: update this test's change"
    path.write_text(text.replace(anchor, replacement))


def _make_review(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # -o setup: the copy shares this checkout's .venv and node_modules; nothing is to be installed.
    return subprocess.run(
        ["make", "--silent", "-o", "setup", "review", *args],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )


@pytest.mark.slow
def test_a_tree_that_synthesizes_the_same_templates_reports_no_changes_in_one_line(tmp_path: Path) -> None:
    root = _copy_of_this_repository(tmp_path)
    # A commit that changes no template: the app records no revision of its own at synth.
    _edit(root / "README.md", "# Distributed training platform on AWS", "# Distributed training platform (AWS)")
    _git(root, "commit", "--quiet", "--all", "--message", "docs only")

    result = _make_review(root, "BASE=HEAD~1")

    assert result.returncode == 0, result.stdout + result.stderr
    base = _git(root, "rev-parse", "--short=12", "HEAD~1")
    line = f"No changes: the working tree synthesizes the same templates as HEAD~1 ({base})."
    assert result.stdout.strip() == line
    assert (root / "review.md").read_text() == line + "\n"
    assert _git(root, "worktree", "list").count("\n") == 0, "the base revision's worktree was left behind"


def test_an_unknown_base_revision_is_an_error_that_says_what_to_fix(tmp_path: Path) -> None:
    root = _copy_of_this_repository(tmp_path)
    (root / "review.md").write_text("a previous review\n")
    result = _make_review(root, "BASE=origin/no-such-branch")
    assert result.returncode != 0
    assert "review] Error 2" in result.stderr  # the tool's own status: could not review
    assert "BASE=origin/no-such-branch is not a commit of this repository" in result.stderr
    assert "git fetch" in result.stderr
    assert not (root / "review.md").exists()


@pytest.mark.slow
def test_a_base_revision_that_does_not_synthesize_is_an_error_naming_it(tmp_path: Path) -> None:
    root = _copy_of_this_repository(tmp_path)
    cdk_json = root / "cdk.json"
    settings = json.loads(cdk_json.read_text())
    settings["context"]["platform"]["network"]["training_subnet_mask"] = 30
    cdk_json.write_text(json.dumps(settings, indent=2) + "\n")
    _git(root, "commit", "--quiet", "--all", "--message", "a subnet too small for the cluster")
    _git(root, "revert", "--no-edit", "HEAD")

    result = _make_review(root, "BASE=HEAD~1")

    assert result.returncode != 0
    assert "review] Error 2" in result.stderr
    assert "the base revision HEAD~1" in result.stderr
    assert "does not synthesize; review against another BASE" in result.stderr
    assert "training_subnet_mask" in result.stderr  # the app's own message says why


# ---- eight real changes, reviewed together (one synth per side) ---------------------------------------------------

APPROVER = "arn:aws:iam::123456789012:role/approvers/MLLead"


def _change_the_platform(root: Path) -> None:
    # 1. A larger prefix length for the training subnets: new subnets, so a new FSx file system; 6. in another
    # range: a new VPC, and with it everything that reads it; 7. an approver.
    cdk_json = root / "cdk.json"
    settings = json.loads(cdk_json.read_text())
    network = settings["context"]["platform"]["network"]
    assert (network["training_subnet_mask"], network["vpc_cidr"]) == (20, "10.20.0.0/16")
    network.update(training_subnet_mask=21, vpc_cidr="10.30.0.0/16")
    settings["context"]["platform"]["approvers"] = [APPROVER]
    cdk_json.write_text(json.dumps(settings, indent=2) + "\n")
    # 8. The training package changes: the image's source asset moves to a new hash, and the image is rebuilt.
    with (root / "training" / "__init__.py").open("a") as package:
        package.write("# a change to the training package\n")
    # 2. HTTPS to the interface endpoints from anywhere (and 3. its cdk-nag acknowledgement).
    anchor = (
        '            self.endpoint_sg.add_ingress_rule(workload, ec2.Port.tcp(443), "HTTPS from platform workloads")\n'
    )
    _edit(
        root / "stacks" / "constructs" / "network.py",
        anchor,
        anchor
        + '        self.endpoint_sg.add_ingress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "HTTPS from anywhere")\n'
        + '        acknowledge(self.endpoint_sg, "AwsSolutions-EC23", "Test change: endpoints open to any address.")\n',
    )
    # 4. The Evaluate role gains s3:* on everything, acknowledged.
    outcome = root / "stacks" / "pipeline" / "outcome.py"
    _edit(
        outcome,
        "from stacks.constructs.nag import acknowledge_wildcard\n",
        "from stacks.constructs.nag import acknowledge, acknowledge_wildcard\n",
    )
    anchor = '        self.start = invoke(\n            self,\n            "Evaluate model",\n'
    _edit(
        outcome,
        anchor,
        '        self.evaluate.function.add_to_role_policy(iam.PolicyStatement(sid="AnyBucket", actions=["s3:*"], '
        'resources=["*"]))\n'
        "        for finding in (\n"
        '            "AwsSolutions-IAM5[Action::s3:*]",\n'
        '            "NIST.800.53.R5-IAMPolicyNoStatementsWithFullAccess",\n'
        '            "HIPAA.Security-IAMPolicyNoStatementsWithFullAccess",\n'
        "        ):\n"
        '            acknowledge(self.evaluate.role, finding, "Test change: evaluation reads any bucket.")\n' + anchor,
    )
    # 5. A Pass state between receiving the input and validating it.
    _edit(
        root / "stacks" / "pipeline" / "intake.py",
        "self.start.next(validate).next(",
        'self.start.next(sfn.Pass(self, "Record start")).next(validate).next(',
    )


@pytest.fixture(scope="module")
def changed(tmp_path_factory: pytest.TempPathFactory) -> report.Review:
    root = _copy_of_this_repository(tmp_path_factory.mktemp("repo"))
    _change_the_platform(root)  # left in the working tree, as a developer would review it
    return run_review(root, synth.resolve(root, "HEAD"), tmp_path_factory.mktemp("work"))


@pytest.fixture(scope="module")
def markdown(changed: report.Review) -> str:
    return render.render(changed)


def _resource(review: report.Review, logical_prefix: str) -> report.ResourceChange:
    (found,) = [r for r in review.resources if r.logical_id.startswith(logical_prefix)]
    return found


@pytest.mark.slow
def test_a_subnet_mask_change_replaces_the_file_system_and_fails_the_review(
    changed: report.Review, markdown: str
) -> None:
    subnet = _resource(changed, "NetworkVpctrainingSubnet1Subnet")
    assert (subnet.impact, subnet.stack) == ("WILL_REPLACE", "training-platform-dev-network")
    # The data stack's template does not change: the replacement reaches it through the subnet output it reads.
    file_system = _resource(changed, "LustreFileSystem")
    assert (file_system.stack, file_system.impact, file_system.stateful) == (
        "training-platform-dev-data",
        "WILL_REPLACE",
        "file system",
    )
    (subnet_ids,) = [p for p in file_system.properties if p.name == "SubnetIds"]
    assert subnet_ids.old == subnet_ids.new
    assert subnet_ids.replaced_sources == (("training-platform-dev-network", subnet.logical_id),)
    assert [r.logical_id for r in changed.blocking] == [file_system.logical_id]
    assert report.exit_code(changed, allow_stateful=False) == 1
    assert report.exit_code(changed, allow_stateful=True) == 0

    assert "- **Stateful resources replaced or removed**: training-platform-dev-data `Lustre/FileSystem`" in markdown
    assert (
        "| training-platform-dev-data | `Lustre/FileSystem` (LustreFileSystem46590C25) | AWS::FSx::FileSystem |"
        in markdown
    )
    assert (
        "`SubnetIds` (replace) — reads `Network/Vpc/trainingSubnet1/Subnet` of training-platform-dev-network, "
        "which is replaced" in markdown
    )
    assert "`CidrBlock` (replace): 10.20.0.0/20 → 10.30.0.0/21" in markdown
    # Stateful resources that live on are named, not blocked: nothing else in the data stack changes.
    assert {r.logical_id for r in changed.resources if r.stack == "training-platform-dev-data"} == {
        file_system.logical_id,
        _resource(changed, "LustreDatasetsAssociation").logical_id,
    }


@pytest.mark.slow
def test_a_security_group_opened_to_the_internet(changed: report.Review, markdown: str) -> None:
    assert [(r.change, r.direction, r.protocol, r.peer) for r in changed.rules] == [
        ("+", "ingress", "TCP 443", "0.0.0.0/0")
    ]
    assert changed.rules[0].open_to_internet
    assert "| + | `Network/EndpointSg` | ingress | TCP 443 | `0.0.0.0/0` | **open to the internet** |" in markdown
    assert "Security groups: 1 rule added (1 open to the internet), 0 removed." in markdown


@pytest.mark.slow
def test_a_role_gaining_s3_star_reads_as_who_can_now_do_what(changed: report.Review, markdown: str) -> None:
    (statement,) = [s for s in changed.statements if s.kind != "Lambda invoke permissions"]
    assert (statement.change, statement.effect, statement.actions, statement.resources) == (
        "+",
        "Allow",
        ("s3:*",),
        ("*",),
    )
    assert statement.kind == "identity policies"
    assert statement.notes == ["wildcard actions (s3:*)", "any resource"]
    assert (
        "| + | `Evaluate/Role` | Allow | `s3:*` | `*` |  | **wildcard actions (s3:*)**, **any resource** |" in markdown
    )


@pytest.mark.slow
def test_a_replaced_file_system_says_what_becomes_of_the_old_one_and_what_the_new_one_holds(
    changed: report.Review, markdown: str
) -> None:
    fate = (
        "the deployed file system is retained: it stays, outside the stack, and is billed until someone deletes it; "
        "the new file system starts empty; linked to S3: /datasets re-imports the linked S3 objects' metadata on "
        "creation (contents load on first read); files written only to the old file system are not on the new one"
    )
    summary = render.summary(changed)
    assert f"(AWS::FSx::FileSystem, LustreFileSystem46590C25) replaced: {fate}." in summary
    assert f"| **replaced**: {fate} |" in markdown


@pytest.mark.slow
def test_a_training_package_change_is_an_image_rebuild_and_no_new_grant(changed: report.Review, markdown: str) -> None:
    (image,) = [r for r in changed.resources if r.type == "Custom::TrainingImage"]
    assert image.impact == "WILL_UPDATE"  # the engine, without a spec for custom resources, says NO_CHANGE
    rebuilt = "the training image is rebuilt: CodeBuild builds and pushes it, which can take up to an hour"
    assert f"- **Deploy**: {rebuilt}." in render.summary(changed)
    (row,) = [line for line in markdown.splitlines() if f"({image.logical_id})" in line]
    assert "| update |" in row and f"**{rebuilt}**" in row
    (source,) = [line for line in markdown.splitlines() if line.startswith("| `TrainingImage/Build` ")]
    assert "`Source`: only an asset's hash moves (a rebuilt asset)" in source
    # The build's role reads the source asset under its new hash: the same grant, not a wildcard one.
    assert changed.asset_moves and all(report.ASSET_HASH.search(str(s.resources)) for s in changed.asset_moves)
    assert not [s for s in changed.statements if report.ASSET_HASH.search(str(s))]
    assert "wildcard actions (1)" in render.summary(changed)  # the test's own s3:*, and only it
    assert "only follows a rebuilt asset to its new hash: the same grants, not new ones." in render.summary(changed)


@pytest.mark.slow
def test_a_replaced_vpc_carries_its_readers_in_one_line_and_an_approver_is_named_as_a_role(
    changed: report.Review, markdown: str
) -> None:
    vpc = _resource(changed, "NetworkVpc7FB7348F")
    assert vpc.impact == "WILL_REPLACE"
    carried = changed.carried()[(vpc.stack, vpc.logical_id)]
    assert len(carried) > 20
    (line,) = [line for line in markdown.splitlines() if line.startswith("- `Network/Vpc` of ")]
    assert line.startswith("- `Network/Vpc` of training-platform-dev-network is replaced, and with it what reads it")
    assert markdown.count("which is replaced") < 30, markdown  # a row each for the 90 or so that read it, before
    assert "Service:arn" not in markdown
    assert "role `MLLead` (`arn:aws:iam::123456789012:role/approvers/MLLead`)" in markdown


@pytest.mark.slow
def test_new_cdk_nag_acknowledgements_are_listed_with_their_reasons(changed: report.Review, markdown: str) -> None:
    added = {(a.path, a.rule.split("::", 1)[1]): a.reason for a in changed.acknowledgements if a.change == "+"}
    assert added == {
        ("training-platform-dev-network/Network/EndpointSg", "AwsSolutions-EC23"): (
            "Test change: endpoints open to any address."
        ),
        ("training-platform-dev-pipeline/Evaluate/Role", "AwsSolutions-IAM5[Action::s3:*]"): (
            "Test change: evaluation reads any bucket."
        ),
        ("training-platform-dev-pipeline/Evaluate/Role", "NIST.800.53.R5-IAMPolicyNoStatementsWithFullAccess"): (
            "Test change: evaluation reads any bucket."
        ),
        ("training-platform-dev-pipeline/Evaluate/Role", "HIPAA.Security-IAMPolicyNoStatementsWithFullAccess"): (
            "Test change: evaluation reads any bucket."
        ),
    }
    assert [a.change for a in changed.acknowledgements] == ["+"] * 4
    assert (
        "| + | `training-platform-dev-network/Network/EndpointSg` | `AwsSolutions-EC23` | "
        "Test change: endpoints open to any address. |" in markdown
    )


@pytest.mark.slow
def test_a_state_added_to_the_pipeline_reads_as_states_not_one_json_string(
    changed: report.Review, markdown: str
) -> None:
    (machine,) = changed.machines
    assert (machine.stack, machine.path) == ("training-platform-dev-pipeline", "TrainingPipeline")
    assert [(s.change, s.state, s.type, s.details) for s in machine.states] == [
        ("added", "Record start", "Pass", ("Next: Validate request",)),
        ("changed", "Receive input", "Pass", ("Next: Validate request → Record start",)),
    ]
    assert "| + | Record start | Pass | Next: Validate request |" in markdown
    assert "| ~ | Receive input | Pass | Next: Validate request → Record start |" in markdown


@pytest.mark.slow
@pytest.mark.parametrize("allow", [False, True])
def test_the_command_prints_the_summary_and_exits_on_stateful_changes_unless_allowed(
    changed: report.Review,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    allow: bool,
) -> None:
    """The command around run_review (reusing the fixture's review instead of synthesizing again)."""
    fake: Callable[..., report.Review] = lambda *_: changed  # noqa: E731
    monkeypatch.setattr(review_cli, "run_review", fake)
    if allow:
        monkeypatch.setenv("ALLOW_STATEFUL", "1")
    else:
        monkeypatch.delenv("ALLOW_STATEFUL", raising=False)
    output = tmp_path / "review.md"

    assert review_cli.main(["--base", "HEAD", "--output", str(output)]) == (0 if allow else 1)

    printed = capsys.readouterr().out
    assert printed.startswith(render.summary(changed, allow_stateful=allow))
    assert ("Allowed by ALLOW_STATEFUL=1." in printed) == allow
    assert output.read_text() == render.render(changed, allow_stateful=allow)


# ---- the state machine definition, from the template form CDK writes -----------------------------------------------


def test_a_definition_string_of_text_and_tokens_renders_to_states() -> None:
    def machine(states: str) -> dict[str, object]:
        text = '{"StartAt":"A","States":{' + states + "}}"
        head, tail = text.split("FN", 1)
        join = [head, {"Fn::GetAtt": ["Fn1", "Arn"]}, tail]
        return {
            "Type": "AWS::StepFunctions::StateMachine",
            "Properties": {"DefinitionString": {"Fn::Join": ["", join]}},
        }

    old = definition(machine('"A":{"Type":"Task","Resource":"FN","End":true}'))
    new = definition(
        machine(
            '"A":{"Type":"Task","Resource":"FN","Next":"P"},'
            '"P":{"Type":"Parallel","Branches":[{"StartAt":"B","States":{"B":{"Type":"Pass","End":true}}}],"End":true}'
        )
    )
    assert old["States"]["A"]["Resource"] == "${Fn1.Arn}"
    assert [(c.change, c.state, c.details) for c in compare(old, new)] == [
        ("added", "P", ("End",)),
        ("added", "P › branch 1 › B", ("End",)),
        ("changed", "A", ("End removed", "Next added: P")),
    ]


@pytest.mark.parametrize(
    ("type_", "change", "impact", "policy", "blocks"),
    [
        ("AWS::S3::Bucket", "removed", "WILL_ORPHAN", "Retain", True),
        ("AWS::KMS::Key", "updated", "MAY_REPLACE", "Retain", True),
        ("AWS::Logs::LogGroup", "removed", "WILL_DESTROY", None, True),
        ("AWS::SNS::Topic", "updated", "WILL_REPLACE", "Retain", True),  # retained: stateful by declaration
        ("AWS::S3::Bucket", "updated", "WILL_UPDATE", "Retain", False),
        ("AWS::S3::Bucket", "added", "WILL_CREATE", "Retain", False),
        ("AWS::Lambda::Function", "updated", "WILL_REPLACE", None, False),
    ],
)
def test_stateful_resources_block_only_when_the_deployed_one_ends(
    type_: str, change: str, impact: str, policy: str | None, blocks: bool
) -> None:
    resource = report.ResourceChange("s", "Id", None, type_, type_, change, impact, policy, (), ())
    assert resource.blocks is blocks


def test_pins_that_differ_from_the_base_are_named(tmp_path: Path) -> None:
    base, head = tmp_path / "base", tmp_path / "head"
    for tree in (base, head):
        tree.mkdir()
        for name in synth.PINS:
            (tree / name).write_text(f"{name} pins\n")
    (head / "constraints.txt").write_text("aws-cdk-lib==9.9.9\n")
    (base / "package-lock.json").unlink()
    assert synth.differing_pins(base, head) == ["constraints.txt", "package-lock.json"]


def _statement(actions: tuple[str, ...], principals: tuple[str, ...], source: tuple[str, str]) -> report.Statement:
    return report.Statement(
        "+", "s", "Allow", principals, actions, False, ("arn:aws:iam::1:role/x",), False, None, (source,)
    )


def test_passrole_and_trust_are_called_out() -> None:
    passrole = _statement(("iam:PassRole",), ("AWS:${Fn}",), ("FnPolicy", "AWS::IAM::Policy"))
    iam_star = _statement(("iam:*",), ("AWS:${Fn}",), ("FnPolicy", "AWS::IAM::Policy"))
    trust = _statement(("sts:AssumeRole",), ("Service:lambda.amazonaws.com",), ("Role", "AWS::IAM::Role"))
    own_inline = _statement(("s3:GetObject",), ("AWS:${Role}",), ("Role", "AWS::IAM::Role"))
    assert (passrole.kind, passrole.notes) == ("identity policies", ["PassRole"])
    assert iam_star.notes == ["wildcard actions (iam:*)", "PassRole"]
    assert (trust.kind, trust.notes) == (report.TRUST, ["trust"])
    assert (own_inline.kind, own_inline.notes) == ("identity policies", [])


def test_managed_policy_attachments_are_iam_changes() -> None:
    review = report.Review(
        base="main (0123456789ab)",
        stacks={"s": "changed"},
        resources=[],
        statements=[],
        managed_policies=[
            report.ManagedPolicyChange("+", "s", "${Role}", "arn:aws:iam::aws:policy/AdministratorAccess")
        ],
        rules=[],
        acknowledgements=[],
        machines=[],
        paths={("s", "Role"): "Fn/Role"},
    )
    text = render.render(review)
    assert "- IAM: 0 statements added, 0 removed; managed policies: 1 attached, 0 detached." in text
    assert "| + | `Fn/Role` | `arn:aws:iam::aws:policy/AdministratorAccess` |" in text


@pytest.mark.parametrize(
    ("type_", "change", "impact", "policy", "fate"),
    [
        (
            "AWS::S3::Bucket",
            "removed",
            "WILL_ORPHAN",
            "Retain",
            "the deployed bucket is retained: it stays, outside the stack, and is billed until someone deletes it",
        ),
        (
            "AWS::KMS::Key",
            "updated",
            "WILL_REPLACE",
            "Retain",
            "; the new key cannot decrypt what the old one encrypted",
        ),
        (
            "AWS::DynamoDB::Table",
            "updated",
            "WILL_REPLACE",
            None,
            "the deployed table is deleted, and what it holds with it; the new table starts empty",
        ),
    ],
)
def test_what_becomes_of_a_stateful_resources_data_is_said(
    type_: str, change: str, impact: str, policy: str | None, fate: str
) -> None:
    resource = report.ResourceChange("s", "Id", None, type_, type_, change, impact, policy, (), ())
    assert fate in report.data_fate(resource, None)
