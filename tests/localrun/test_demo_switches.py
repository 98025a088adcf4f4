"""The demo's `--new-data` / `--no-new-data` and `--fault insufficient-capacity` switches, as `make demo` reads them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from localrun.demo import cli
from localrun.demo.new_data import RETRAIN, NewDataError, chosen, trigger_of
from localrun.demo.scenario import ScenarioError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RETRAIN_EXAMPLE = EXAMPLES / "retrain-on-new-data.json"


def test_the_retrain_example_plays_its_new_data_unless_told_not_to() -> None:
    assert trigger_of(RETRAIN_EXAMPLE) == RETRAIN and trigger_of(EXAMPLES / "demo.json") is None
    assert chosen(RETRAIN_EXAMPLE, None) == RETRAIN  # the default for a trigger's input
    assert chosen(RETRAIN_EXAMPLE, True) == RETRAIN
    assert chosen(RETRAIN_EXAMPLE, False) is None
    assert chosen(EXAMPLES / "demo.json", None) is None
    with pytest.raises(NewDataError, match=r"no retrain trigger starts .*demo\.json; .*examples/retrain-on-new-data"):
        chosen(EXAMPLES / "demo.json", True)


def test_the_switches_are_in_the_help_and_a_wrong_one_is_refused_with_the_fix(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.setenv(var, os.environ.get(var, ""))  # main sets the demo's: restored after the test
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--new-data, --no-new-data" in help_text and "insufficient-capacity" in help_text
    assert "RetrainRecord and RetrainSweep start the run" in help_text
    with pytest.raises(SystemExit) as refused:
        cli.main(["--input", str(EXAMPLES / "demo.json"), "--new-data", "--out", "/nonexistent/never-written"])
    assert refused.value.code == 2
    assert "--new-data: no retrain trigger starts" in capsys.readouterr().err
    with pytest.raises(ScenarioError, match="--no-new-data apply to one run only"):
        cli.main(["--input", str(EXAMPLES / "teams.json"), "--no-new-data"])
