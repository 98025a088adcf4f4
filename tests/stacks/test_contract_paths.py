"""Every JSONPath the state machine reads or writes names a field of the typed contract (contract/execution_state.py).

The stacks generate their paths from the contract's models, so a renamed field fails at synth;
this test reads the synthesized definition, so a path typed by hand that the models do not have
fails here too, before any execution reaches the state.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contract import execution_state
from tests.support.iam import AssemblyIam

# Where each part of an execution's state is described; the others are kept whole and read whole.
TYPED = {
    str(p).removeprefix("$."): p
    for p in (
        execution_state.REQUEST,
        execution_state.VALIDATION,
        execution_state.ESTIMATE,
        execution_state.LAUNCH_APPROVAL,
        execution_state.PROMOTION_APPROVAL,
        execution_state.TRAIN,
        execution_state.JOB,
        execution_state.FAILURE,
        execution_state.ERROR,
        execution_state.EVALUATION,
        execution_state.REGISTRATION,
        execution_state.RESUMED,
        execution_state.NEXT_CLUSTER,
        execution_state.RUN,
        execution_state.HANDOVER,
        execution_state.HANDED_TO,
    )
}
WHOLE = {"input", "cleanup", "notify_error", "launch_approval_error", "promotion_approval_error"}
# Fields that hold a state's input path (ResultSelector reads the task's own result instead).
PATH_FIELDS = {
    "Variable",
    "ResultPath",
    "InputPath",
    "OutputPath",
    "ItemsPath",
    "SecondsPath",
    "CausePath",
    "ErrorPath",
}
_PATH = re.compile(r"(?<![$\w])\$\.([A-Za-z_]\w*)((?:\.[A-Za-z_]\w*)*)")


def paths_in(node: Any, *, reads_state: bool = False) -> Iterator[str]:
    """The `$.a.b` paths of a definition that address the execution's state."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "ResultSelector":
                continue
            yield from paths_in(value, reads_state=key.endswith(".$") or key in PATH_FIELDS)
    elif isinstance(node, list):
        for item in node:
            yield from paths_in(item, reads_state=reads_state)
    elif isinstance(node, str) and reads_state:
        yield from (m.group(0) for m in _PATH.finditer(node))


def unknown_path(path: str) -> str | None:
    """Why `path` is not part of the contract, or None when it is."""
    root, *fields = path.removeprefix("$.").split(".")
    if root in WHOLE and not fields:
        return None
    if root not in TYPED:
        return f"{path}: no part of the state is called {root!r}"
    node = TYPED[root]
    try:
        for field in fields:
            node = getattr(node, field)
    except AttributeError as exc:
        return f"{path}: {exc}"
    return None


@pytest.fixture(scope="module")
def definition(platform: Any) -> dict[str, Any]:
    iam = AssemblyIam(Path(platform.assembly.directory))
    ((stack, logical),) = [
        (stack, logical)
        for stack, logical, _ in iam.resources("AWS::StepFunctions::StateMachine")
        if logical.startswith("TrainingPipeline")
    ]
    return iam.definition(stack, logical)


def test_every_path_in_the_definition_is_a_field_of_the_contract(definition: dict[str, Any]) -> None:
    paths = set(paths_in(definition))
    assert {"$.request.instance_type", "$.job.final_metrics", "$.train.job.job_name"} <= paths  # it sees them
    assert [problem for path in sorted(paths) if (problem := unknown_path(path))] == []


def test_a_hand_typed_path_the_models_lack_is_reported() -> None:
    state = {"Type": "Pass", "Parameters": {"a.$": "$.request.instance_typ", "b.$": "States.Format('{}', $.jobs)"}}
    problems = [unknown_path(p) for p in paths_in({"States": {"x": state}})]
    typo, jobs = problems
    assert typo is not None
    assert jobs == "$.jobs: no part of the state is called 'jobs'"
    head, named = typo.split("; it has ")
    assert head == "$.request.instance_typ: TrainingRequest has no field 'instance_typ'"
    request = execution_state.TrainingRequest
    assert named.split(", ") == [*request.model_fields, *request.model_computed_fields]  # every field, in order
