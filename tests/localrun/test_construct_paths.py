"""Resources found by construct path, whatever their logical IDs and order in the manifest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localrun.aws.cfn import Assembly, Resolver
from localrun.aws.construct_paths import Functions, state_machine
from localrun.aws.services import Faults


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
FN = "AWS::Lambda::Function"


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


def _functions(tmp_path: Path) -> Functions:
    assembly = _assembly(
        tmp_path,
        {
            "p-pipeline": {
                "Validate/Function/Resource": FN,
                "TrainingStep/Monitor/Function/Resource": FN,  # moved into a construct: a new logical ID
                "TrainingStep/Cleanup/Function/Resource": FN,
                "Approval/Decide/Function/Resource": FN,
                "Approval/Request/Function/Resource": FN,
            },
            "p-image": {"Provider/framework-onEvent/Resource": FN},
        },
    )
    return Functions(assembly, Resolver(assembly))


def test_functions_are_named_by_the_end_of_their_construct_path(tmp_path: Path) -> None:
    functions = _functions(tmp_path)
    assert functions.named("Monitor").path == "/p-pipeline/TrainingStep/Monitor/Function/Resource"
    assert functions.named("TrainingStepMonitor") == functions.named("Monitor")
    assert functions.named("ApprovalDecide").path == "/p-pipeline/Approval/Decide/Function/Resource"
    assert functions.named("Decide") == functions.named("ApprovalDecide")
    assert functions[functions.named("Validate").name].logical.startswith("ValidateFunctionResource")


def test_a_name_matching_no_function_or_several_is_an_error_listing_them(tmp_path: Path) -> None:
    functions = _functions(tmp_path)
    with pytest.raises(KeyError, match=r"ends with 'Evaluate'; the functions are \['/p-pipeline/Approval/Decide/"):
        functions.named("Evaluate")
    with pytest.raises(KeyError, match="ends with 'Approval'"):
        functions.named("Approval")  # the middle of a construct path names nothing
    with pytest.raises(KeyError, match=r"'e' names more than one function: \[.*Approval/Decide.*, .*/Validate/"):
        functions.named("e")
    with pytest.raises(KeyError, match="ends with 'onEvent'"):
        functions.named("onEvent")  # a CDK provider's handler, not a platform function


def test_throttles_name_functions_as_lookups_do(tmp_path: Path) -> None:
    functions = _functions(tmp_path)
    faults = Faults(function_named=lambda name: functions.named(name).name)
    faults.throttle["Monitor"] = 2
    monitor, cleanup = functions.named("Monitor").name, functions.named("Cleanup").name
    assert [faults.throttled(monitor), faults.throttled(cleanup), faults.throttled(monitor)] == [True, False, True]
    assert not faults.throttled(monitor)
    with pytest.raises(KeyError, match="ends with 'Monitr'"):
        faults.throttle["Monitr"] = 1
