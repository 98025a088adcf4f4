"""What tells a demo scenario file (localrun/demo/scenario.py: several runs of several teams) from one execution
input, for `make demo`, which plays either, and `tp`, which takes only an execution input."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def is_scenario(document: Any) -> bool:
    """A scenario file, rather than one execution input."""
    return isinstance(document, dict) and "steps" in document


def how_to_play(path: Path) -> str:
    """What to say of a scenario given where an execution input is expected."""
    return (
        f"{path} is a demo scenario (settings and steps: several runs of several teams), not one execution input; "
        f"play it on the local platform with `make demo INPUT={path} ARGS=--auto-approve` (docs/demo.md, "
        '"Teams, in the demo")'
    )
