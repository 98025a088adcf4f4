"""The documentation site's reference pages equal what their models make, and the README's links lead somewhere."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from contract.metrics import METRIC_DEFINITIONS
from lambdas.shared.metrics import MEANING, Metric
from tools import docs

REPO = Path(__file__).resolve().parents[2]


def test_the_committed_reference_pages_are_what_their_models_make(capsys: pytest.CaptureFixture[str]) -> None:
    assert docs.stale() == [], "regenerate the reference pages with `make docs`"
    assert docs.main([]) == 0
    assert capsys.readouterr().err == ""


def test_a_page_that_differs_from_its_model_is_named_until_it_is_written_again(tmp_path: Path) -> None:
    shutil.copytree(REPO / "docs" / "reference", tmp_path / "reference")
    settings = tmp_path / "reference" / "settings.md"
    settings.write_text(settings.read_text().replace("`network.vpc_cidr`", "`network.cidr`"))
    (tmp_path / "reference" / "metrics.md").unlink()

    assert docs.stale(tmp_path) == ["reference/settings.md", "reference/metrics.md"]
    docs.write(tmp_path)
    assert docs.stale(tmp_path) == []
    assert "`network.vpc_cidr`" in settings.read_text()


def test_the_metrics_page_lists_every_metric_with_its_meaning() -> None:
    assert set(MEANING) == set(Metric), "give every Metric a line in MEANING"
    page = (REPO / "docs" / "reference" / "metrics.md").read_text()
    for metric in Metric:
        assert f"| `{metric.value}` |" in page and MEANING[metric] in page
    for definition in METRIC_DEFINITIONS:
        assert f"| `{definition['Name']}` |" in page


def test_the_readme_is_a_front_page_whose_links_lead_to_files() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    assert "docs/ml-engineer/start.md" in targets
    missing = [t for t in targets if not t.startswith("http") and not (REPO / t).is_file()]
    assert missing == []
