"""jsii (under aws-cdk-lib) runs on the Node.js that package.json pins, however it is started: `cdk`, make, python.

The machine's Node.js may be past its end of life for jsii (Node 20 since 2026-10-30), when jsii prints a banner on
every start, which its Python runtime passes on as the bytes' repr (b'...').
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stacks import PINNED_NODE

REPO = Path(__file__).resolve().parents[2]


def _as_a_user_starts_it() -> dict[str, str]:
    """This environment without make's PATH (node_modules/.bin first) or any of jsii's switches."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JSII_")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if "node_modules" not in p)
    return env


def test_package_json_pins_a_node_js_jsii_supports_and_setup_installs_it() -> None:
    pinned = json.loads((REPO / "package.json").read_text())["devDependencies"]["node"]
    assert pinned.split(".")[0] in ("22", "24"), pinned  # jsii's supported releases that are not past end of life
    shown = subprocess.run([str(PINNED_NODE), "--version"], capture_output=True, text=True, check=True, timeout=60)
    assert shown.stdout.strip() == f"v{pinned}"


@pytest.mark.parametrize(
    "command",
    [
        ["-m", "localrun.demo", "--help"],
        ["-c", "import stacks.app_builder, aws_cdk; aws_cdk.App()"],  # what `cdk synth` starts: app.py's imports
    ],
    ids=["demo-help", "app"],
)
def test_starting_the_cdk_directly_prints_no_end_of_life_banner(command: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, *command],
        cwd=REPO,
        env=_as_a_user_starts_it(),
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "end-of-life" not in result.stderr and "b'" not in result.stderr, result.stderr
