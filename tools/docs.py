"""The documentation site's reference pages (docs/reference/), generated from the models they describe.

`python -m tools.docs --write` (the first step of `make docs`) writes every page; without `--write` it names the
pages that differ from their models and exits 1. Each table has one home, its model: edit the model, then run
`make docs`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from contract.catalog import instance_type_table
from contract.config import hyperparameters_markdown
from contract.memory import recommendations_markdown
from contract.metrics import METRIC_DEFINITIONS, MODEL_METRIC_NAMES
from lambdas.shared.errors import service_errors_table
from lambdas.shared.metrics import BY_TEAM, MEANING, NAMESPACE, STAGE_OF, TEAM_DIMENSION, UNIT_OF, Metric
from lambdas.validate.inputs import input_table
from stacks.constructs import tasks
from stacks.settings import settings_table

DOCS = Path(__file__).resolve().parents[1] / "docs"


def training_metrics_table() -> str:
    """The MetricDefinitions every training job gets: what SageMaker parses from the training log."""
    rows = ["| Metric | Regex (SageMaker's MetricDefinitions) | Quality gate, tuning objective |"]
    rows.append("| --- | --- | --- |")
    for definition in METRIC_DEFINITIONS:
        # A pipe ends a table cell on GitHub even inside a code span, and MkDocs shows `\|` as typed; inside an HTML
        # code element both read Markdown (`\.`, `*`), so every sign is written as a character reference.
        regex = "".join(c if c.isalnum() or c == " " else f"&#{ord(c)};" for c in definition["Regex"])
        usable = "yes" if definition["Name"] in MODEL_METRIC_NAMES else "-"
        rows.append(f"| `{definition['Name']}` | <code>{regex}</code> | {usable} |")
    return "\n".join(rows)


def platform_metrics_table() -> str:
    """The handlers' own CloudWatch metrics: name, the stage that writes it, unit, dimensions and meaning."""
    rows = ["| Metric | Stage | Unit | Dimensions | Meaning |", "| --- | --- | --- | --- | --- |"]
    for metric in Metric:
        unit = UNIT_OF[metric].value if metric in UNIT_OF else "Count"
        dimensions = ", ".join(f"`{d}`" for d in ("service", "stage", *([TEAM_DIMENSION] if metric in BY_TEAM else ())))
        rows.append(f"| `{metric.value}` | {STAGE_OF[metric].value} | {unit} | {dimensions} | {MEANING[metric]} |")
    return "\n".join(rows)


def metrics_tables() -> str:
    return "\n".join(
        [
            "## Training metrics",
            "",
            "Parsed by SageMaker from the training log's lines (`contract/metrics.py`); the training package's",
            "Metrics section describes the lines. A run's `quality` gate and a tuning `objective` may name the",
            "model's metrics only.",
            "",
            training_metrics_table(),
            "",
            "## Platform metrics",
            "",
            f"Written by the handlers as CloudWatch embedded metrics in the namespace `{NAMESPACE}`",
            "(`lambdas/shared/metrics.py`); the dashboard graphs them.",
            "",
            platform_metrics_table(),
        ]
    )


def errors_tables() -> str:
    """What the state machine retries, by service and by task, and for how long."""
    budgets = [
        "| Task | Errors retried | Retries | Longest wait between tries | At most, in all |",
        "| --- | --- | --- | --- | --- |",
    ]
    for task, errors, budget in (
        ("A progress handler (`Check progress`, every backend)", "`TransientError`, Lambda's", tasks.POLLING),
        ("Every other handler", "`TransientError`, Lambda's", tasks.SHORT),
        ("An SDK task (create, submit, describe, tag)", "the service's, as above; `States.Timeout`", tasks.SDK),
        ("A notification", "`States.TaskFailed`, `States.Timeout`", tasks.SDK),
    ):
        longest = budget.longest_seconds()
        budgets.append(
            f"| {task} | {errors} | {budget.attempts} | {budget.max_delay_seconds} s | {longest / 60:.0f} min |"
        )
    return "\n".join(
        [
            "## By service",
            "",
            "Step Functions names a task's error `<service>.<error>`: an error the service's API model declares by its",
            "code, one it does not (how most services report throttling and their own faults) by the service's",
            "generic exception. What passes is retried within the task's budget; a bad request or a missing resource",
            "ends the run at once with the service's cause (`lambdas/shared/errors.py` `SERVICE_ERRORS`).",
            "",
            service_errors_table(),
            "",
            "## By task",
            "",
            "Each wait is FULL-jittered: a random time up to its cap, which doubles from try to try "
            "(`stacks/constructs/tasks.py`).",
            "",
            "\n".join(budgets),
        ]
    )


@dataclass(frozen=True)
class ReferencePage:
    """One generated page: its place under docs/, its title and opening, and the table its model makes."""

    path: str
    title: str
    intro: str
    source: str
    table: Callable[[], str]

    def render(self) -> str:
        return (
            f"# {self.title}\n\n{self.intro}\n\n{self.table()}\n\n"
            f"(Generated from {self.source} by `make docs`; a test fails when this page is stale.)\n"
        )


PAGES = (
    ReferencePage(
        "reference/run-input.md",
        "Run input",
        "The keys of a run's execution input (see [Start a run](../ml-engineer/start.md)); everything else comes\n"
        "from the platform settings.",
        "`lambdas/validate/inputs.py`",
        input_table,
    ),
    ReferencePage(
        "reference/settings.md",
        "Settings",
        "Every platform setting and its default (how to set them: [Settings](../platform-team/settings.md)).",
        "`stacks/settings.py`",
        settings_table,
    ),
    ReferencePage(
        "reference/hyperparameters.md",
        "Hyperparameters",
        "The trainer's hyperparameters: a run's `hyperparameters`, or `--hp KEY=VALUE` locally (how keys and values\n"
        "are written: [Training package](../training.md#hyperparameters)).",
        "`contract/config.py`",
        hyperparameters_markdown,
    ),
    ReferencePage(
        "reference/instance-types.md",
        "Instance types",
        "`instance_type` (and each group's) takes one of these, as far as `pipeline.allowed_instance_types`\n"
        "allows; Validate suggests the closest name for one it does not know (`p4d.24xlarge` -> `ml.p4d.24xlarge`).",
        "`contract/catalog.py`",
        instance_type_table,
    ),
    ReferencePage(
        "reference/errors.md",
        "Errors: what is retried",
        "What the pipeline retries when a call fails, and what ends a run at once (how each way a run ends is told:\n"
        "[Queue waits and how a run ends](../platform-team/queue-waits.md)).",
        "`lambdas/shared/errors.py` and `stacks/constructs/tasks.py`",
        errors_tables,
    ),
    ReferencePage(
        "reference/parallel-layouts.md",
        "Recommended parallel layouts",
        "The fewest hosts of each supported type on which Llama 3.1's shapes train at their context of 8192 tokens,\n"
        "one sequence per process and step, in bf16, and the cheapest layout there (the least model parallelism,\n"
        "then activation checkpointing), by the memory plan Validate holds every run to (`contract/memory.py`;\n"
        "[Parallel layouts](../ml-engineer/parallelism.md)).",
        "`contract/memory.py`",
        recommendations_markdown,
    ),
    ReferencePage(
        "reference/metrics.md",
        "Metrics",
        "What a training job reports and what the platform's handlers record.",
        "`contract/metrics.py` and `lambdas/shared/metrics.py`",
        metrics_tables,
    ),
)


def stale(docs: Path = DOCS) -> list[str]:
    """The pages whose committed text is not what their models make now."""
    return [
        page.path
        for page in PAGES
        if not (docs / page.path).is_file() or (docs / page.path).read_text() != page.render()
    ]


def write(docs: Path = DOCS) -> None:
    """Write every page as its model makes it now."""
    for page in PAGES:
        (docs / page.path).parent.mkdir(parents=True, exist_ok=True)
        (docs / page.path).write_text(page.render())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="write the pages (default: check them)")
    if parser.parse_args(argv).write:
        write()
        return 0
    outdated = stale()
    for path in outdated:
        print(f"docs/{path} is stale: run `make docs`", file=sys.stderr)
    return 1 if outdated else 0


if __name__ == "__main__":
    sys.exit(main())
