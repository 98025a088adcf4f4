"""Whole-app checks: cdk-nag, cfn-lint, deterministic synth, pinned stateful IDs, snapshots."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stacks.app_builder import build_platform, platform_revision
from stacks.constructs import nag
from stacks.constructs.nag import PACKS
from stacks.settings import SettingsError
from tests.conftest import cdk_context, platform_context

REPO = Path(__file__).resolve().parents[2]
SNAPSHOTS = Path(__file__).parent / "snapshots"
ACKNOWLEDGEMENTS_DOC = REPO / "docs" / "reviewer" / "cdk-nag-acknowledgements.md"

# Replacing any of these would destroy data or orphan it: refactors must keep the IDs.
STATEFUL = {
    "data": {
        "DataKey17AFBB84": "AWS::KMS::Key",
        "BucketsAccessLogsA5F88218": "AWS::S3::Bucket",
        "BucketsDatasets939DDD85": "AWS::S3::Bucket",
        "BucketsCheckpoints180497C2": "AWS::S3::Bucket",
        "BucketsArtifactsB9EE6400": "AWS::S3::Bucket",
        "LustreFileSystem46590C25": "AWS::FSx::FileSystem",
        "Approvals8537C562": "AWS::DynamoDB::Table",
        "StartProofs7A45704A": "AWS::DynamoDB::Table",
        "RetrainWindows2C8CE6A3": "AWS::DynamoDB::Table",
        "ModelRegistry": "AWS::SageMaker::ModelPackageGroup",
    },
    "image": {"TrainingImageRepositoryA4686A09": "AWS::ECR::Repository"},
    "network": {
        "NetworkFlowLogsKey9F917D90": "AWS::KMS::Key",
        "NetworkFlowLogs2BEC3212": "AWS::Logs::LogGroup",
    },
}


def _templates(assembly: Any) -> dict[str, str]:
    out = Path(assembly.directory)
    return {p.name: p.read_text() for p in sorted(out.glob("*.template.json"))}


def test_cdk_nag_packs_ran_and_nothing_is_unacknowledged(platform: Any) -> None:
    report = Path(platform.assembly.directory) / "validation-report.json"
    if report.exists():  # written only when a plugin reports something
        plugins = json.loads(report.read_text())["pluginReports"]
        assert [p["pluginName"] for p in plugins if p["conclusion"] != "success"] == []
    # The packs really were applied: their acknowledgements are recorded per pack.
    packs = {rule.split("::")[0] for _, rule, _ in _acknowledgements(platform)}
    assert packs == set(PACKS)


def test_an_insecure_resource_fails_synth(tmp_path: Path) -> None:
    from aws_cdk import aws_s3 as s3

    built = build_platform(cdk_context(), outdir=str(tmp_path))
    s3.Bucket(built.data, "Careless")  # no encryption, logging, TLS-only policy or public access block
    with pytest.raises(RuntimeError, match="ValidationFailed") as err:
        built.synth()
    message = str(err.value)
    for rule in (
        "AwsSolutions-S1",
        "NIST.800.53.R5-S3BucketLoggingEnabled",
        "HIPAA.Security-S3BucketVersioningEnabled",
    ):
        assert rule in message
    assert "Careless" in message


def _acknowledgements(platform: Any) -> list[tuple[str, str, str]]:
    rows = []
    for stack in platform.stacks:
        metadata = json.loads((Path(platform.assembly.directory) / f"{stack.stack_name}.metadata.json").read_text())
        for path, entries in metadata.items():
            for entry in entries:
                if entry["type"] == "aws:cdk:acknowledged-rules":
                    # CDK records its own (CloudFormation-Validate::...) acknowledgements here too.
                    rows.extend(
                        (path.lstrip("/"), rule, reason)
                        for rule, reason in entry["data"].items()
                        if rule.split("::")[0] in PACKS
                    )
    return sorted(rows)


def test_every_acknowledgement_names_one_finding_with_a_reason(platform: Any) -> None:
    rows = _acknowledgements(platform)
    assert rows, "cdk-nag acknowledgements should be recorded in the assembly"
    pattern = re.compile(r"^(?P<pack>[\w.]+)::(?P=pack)-[\w.]+(\[[^\]]+\])?$")
    for path, rule, reason in rows:
        assert pattern.match(rule), f"{path}: {rule} is not one finding of one pack"
        assert rule.split("::")[0] in PACKS
        assert len(reason) >= 20, f"{path}: {rule} has no real reason"


def test_every_acknowledgement_matches_a_finding(
    platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With acknowledgements switched off, each one must correspond to a finding the packs report."""
    monkeypatch.setattr(nag, "ENABLED", False)
    unacknowledged = build_platform(platform_context(), outdir=str(tmp_path))
    with pytest.raises(RuntimeError, match="ValidationFailed"):
        unacknowledged.synth()
    report = json.loads((tmp_path / "validation-report.json").read_text())
    findings = {
        (resource["constructPath"], violation["ruleName"])
        for plugin in report["pluginReports"]
        for violation in plugin["violations"]
        for resource in violation["violatingConstructs"]
    }
    stale = [
        (path, rule)
        for path, rule, _ in _acknowledgements(platform)
        if not any(
            name == rule.split("::", 1)[1] and (found == path or found.startswith(f"{path}/"))
            for found, name in findings
        )
    ]
    assert stale == [], f"acknowledgements that match no finding (remove them): {stale}"


def render_acknowledgements(platform: Any) -> str:
    lines = [
        "# cdk-nag acknowledgements",
        "",
        "Every finding the AwsSolutions, NIST 800-53 R5 and HIPAA Security packs report and the platform",
        "accepts, with its reason. Generated from the cloud assembly by",
        "`UPDATE_SNAPSHOTS=1 make unit` (tests/stacks/test_app.py); a test fails when it is stale.",
        "",
        "| Construct | Finding | Reason |",
        "| --- | --- | --- |",
    ]
    for path, rule, reason in _acknowledgements(platform):
        finding = rule.split("::", 1)[1]
        lines.append(f"| `{path}` | `{finding}` | {reason} |")
    return "\n".join(lines) + "\n"


def test_acknowledgements_document_is_current(platform: Any) -> None:
    text = render_acknowledgements(platform)
    if os.environ.get("UPDATE_SNAPSHOTS"):
        ACKNOWLEDGEMENTS_DOC.write_text(text)
    assert ACKNOWLEDGEMENTS_DOC.read_text() == text, "docs/reviewer/cdk-nag-acknowledgements.md is stale"


def test_cfn_lint_reports_nothing(platform: Any) -> None:
    templates = sorted(Path(platform.assembly.directory).glob("*.template.json"))
    assert len(templates) == len(platform.stacks)
    result = subprocess.run(
        [str(Path(sys.executable).parent / "cfn-lint"), *map(str, templates)],
        cwd=REPO,  # picks up .cfnlintrc.yaml
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""


def test_synth_is_deterministic(platform: Any, tmp_path: Path) -> None:
    again = build_platform(platform_context(), outdir=str(tmp_path))
    assembly = again.synth()
    first, second = _templates(platform.assembly), _templates(assembly)
    assert first.keys() == second.keys()
    for name in first:
        assert first[name] == second[name], f"{name} differs between two synths"
    for manifest in Path(platform.assembly.directory).glob("*.assets.json"):
        assert manifest.read_text() == (tmp_path / manifest.name).read_text()


@pytest.mark.parametrize("stack_name", sorted(STATEFUL))
def test_stateful_logical_ids_are_pinned(platform: Any, stack_name: str) -> None:
    stack = getattr(platform, stack_name)
    resources = platform.assembly.get_stack_by_name(stack.stack_name).template["Resources"]
    for logical, type_ in STATEFUL[stack_name].items():
        assert logical in resources, f"{logical} ({type_}) would be replaced: its logical ID changed"
        assert resources[logical]["Type"] == type_
        assert resources[logical].get("DeletionPolicy") == "Retain"


_HASH = re.compile(r"[0-9a-f]{64}")


@pytest.mark.parametrize("stack_name", ["network", "data", "image", "pipeline"])
def test_snapshot(platform: Any, stack_name: str) -> None:
    """One normalised snapshot per stack: any template change shows up in review as a diff here."""
    stack = getattr(platform, stack_name)
    template = platform.assembly.get_stack_by_name(stack.stack_name).template
    text = _HASH.sub("<asset-hash>", json.dumps(template, indent=1, sort_keys=True)) + "\n"
    text = text.replace(platform.pipeline.revision, "<git-revision>")
    path = SNAPSHOTS / f"{stack_name}.json"
    if os.environ.get("UPDATE_SNAPSHOTS"):
        SNAPSHOTS.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), "no snapshot: run UPDATE_SNAPSHOTS=1 make unit and review the diff"
    assert path.read_text() == text, f"{stack_name} template changed: review, then UPDATE_SNAPSHOTS=1 make unit"


def test_the_revision_comes_from_the_environment_or_a_file_never_from_git(tmp_path: Path) -> None:
    revision_file = tmp_path / "REVISION"
    assert platform_revision({}, revision_file) == "unknown"  # no variable, no file; git is not asked
    revision_file.write_text("v1.4.0\n")
    assert platform_revision({}, revision_file) == "v1.4.0"
    assert platform_revision({"PLATFORM_REVISION": "53df23030c93-dirty"}, revision_file) == "53df23030c93-dirty"
    with pytest.raises(SettingsError, match=r"PLATFORM_REVISION is 'two words': give a revision of 1 to 64"):
        platform_revision({"PLATFORM_REVISION": "two words"}, revision_file)
    revision_file.write_text("\n")
    with pytest.raises(SettingsError, match="REVISION is ''"):
        platform_revision({}, revision_file)


def test_the_register_function_records_the_revision_it_was_given(platform: Any) -> None:
    template = platform.assembly.get_stack_by_name(platform.pipeline.stack_name).template
    revisions = {
        props.get("Environment", {}).get("Variables", {}).get("PLATFORM_REVISION")
        for props in (r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::Lambda::Function")
    } - {None}
    assert revisions == {os.environ["PLATFORM_REVISION"]}


def _warnings(stack: Any) -> list[str]:
    return [str(entry.data) for entry in stack.node.metadata if entry.type == "aws:cdk:warning"]


def test_approvers_without_an_approval_email_warn_at_synth(platform: Any, tmp_path: Path) -> None:
    assert not any("approval_emails" in w for w in _warnings(platform.pipeline))
    built = build_platform(cdk_context(), outdir=str(tmp_path))  # an approver, no approval e-mail
    assert [w for w in _warnings(built.pipeline) if "notifications.approval_emails is empty" in w]
