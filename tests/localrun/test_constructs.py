"""Resources found by construct path, whatever their logical IDs and order in the manifest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localrun.cfn import Assembly
from localrun.constructs import state_machine


def _assembly(directory: Path, stacks: dict[str, dict[str, str]]) -> Assembly:
    """An assembly of `stacks`: stack name -> {construct path below the stack: resource type}."""
    artifacts = {}
    for stack, resources in stacks.items():
        template = {"Resources": {}}
        metadata = {}
        for index, (path, type_) in enumerate(resources.items()):
            logical = f"{path.replace('/', '')}{index:08X}"
            template["Resources"][logical] = {"Type": type_, "Properties": {}}
            metadata[f"/{stack}/{path}"] = [{"type": "aws:cdk:logicalId", "data": logical}]
        (directory / f"{stack}.template.json").write_text(json.dumps(template))
        (directory / f"{stack}.metadata.json").write_text(json.dumps(metadata))
        artifacts[stack] = {
            "type": "aws:cloudformation:stack",
            "displayName": stack,
            "properties": {"templateFile": f"{stack}.template.json"},
            "additionalMetadataFile": f"{stack}.metadata.json",
        }
    (directory / "manifest.json").write_text(json.dumps({"artifacts": artifacts}))
    return Assembly.load(directory)


SFN = "AWS::StepFunctions::StateMachine"


def test_the_pipeline_stacks_training_pipeline_is_chosen_wherever_the_manifest_puts_it(tmp_path: Path) -> None:
    assembly = _assembly(
        tmp_path,
        {
            "p-pipeline": {"TrainingPipeline/Resource": SFN, "Sweeps/Resource": SFN},
            "p-image": {"Provider/waiter-state-machine/Resource": SFN},  # last in the manifest
        },
    )
    chosen = state_machine(assembly)
    assert (chosen.stack, chosen.path) == ("p-pipeline", "p-pipeline/TrainingPipeline")
    assert chosen.logical.startswith("TrainingPipelineResource")


def test_another_state_machine_is_named_by_its_construct_path(tmp_path: Path) -> None:
    assembly = _assembly(tmp_path, {"p-pipeline": {"TrainingPipeline/Resource": SFN, "Sweeps/Resource": SFN}})
    assert state_machine(assembly, "p-pipeline/Sweeps").logical.startswith("SweepsResource")
    assert state_machine(assembly, "/p-pipeline/Sweeps/Resource").path == "p-pipeline/Sweeps"


def test_a_missing_state_machine_names_those_that_exist(tmp_path: Path) -> None:
    assembly = _assembly(tmp_path, {"p-pipeline": {"Sweeps/Resource": SFN}})
    with pytest.raises(KeyError, match=r"no state machine at construct path 'p-pipeline/TrainingPipeline'.*Sweeps"):
        state_machine(assembly)


def test_two_pipeline_stacks_are_ambiguous(tmp_path: Path) -> None:
    assembly = _assembly(
        tmp_path, {"a-pipeline": {"TrainingPipeline/Resource": SFN}, "b-pipeline": {"TrainingPipeline/Resource": SFN}}
    )
    with pytest.raises(
        KeyError, match=r"expected one stack ending in '-pipeline', found \['a-pipeline', 'b-pipeline'\]"
    ):
        state_machine(assembly)
