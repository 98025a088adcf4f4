"""The demo's synth, as `make demo` runs it, in a process of its own: what its terminal shows."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stacks.app_builder import NO_APPROVAL_EMAIL

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
ANOTHER = "a warning the demo does not acknowledge"
# The demo's synth, then a synth of its settings with another warning added: only the demo's own is acknowledged.
SCRIPT = f"""
import sys
from pathlib import Path
from aws_cdk import Annotations
from localrun.demo import cli
from stacks.app_builder import build_platform

out = Path(sys.argv[1])
cli.synthesize(out / "demo")
print("--- another warning", file=sys.stderr, flush=True)
platform = build_platform(cli._context(out), outdir=str(out / "other"))
Annotations.of(platform.network).add_warning_v2("test:another", {ANOTHER!r})
cli.acknowledge_demo_settings(platform)
platform.synth()
"""


def test_the_demo_synth_says_nothing_of_its_own_settings_and_still_shows_other_warnings(tmp_path: Path) -> None:
    ran = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    demo, other = ran.stderr.split("--- another warning\n")
    assert ran.stdout.startswith("synthesized 4 stacks with cdk-nag into "), ran.stdout
    # Neither the warning about the demo's approver without an e-mail nor the report's path that came with it.
    assert NO_APPROVAL_EMAIL not in demo and "approval_emails" not in demo, demo
    assert "A copy of this report" not in demo, demo
    assert ANOTHER in other and "A copy of this report" in other, other
    assert NO_APPROVAL_EMAIL not in other, other
