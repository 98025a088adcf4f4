"""The Lambda code asset is the handlers and the shared contract, runs without torch, and holds nothing else."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from stacks.constructs.function import ASSET_PACKAGES

ROOT = Path(__file__).resolve().parents[2]

HANDLERS = (
    "lambdas.validate.handler",
    "lambdas.estimate.handler",
    "lambdas.sagemaker.monitor",
    "lambdas.evaluate.handler",
    "lambdas.register.handler",
    "lambdas.register.verify",
    "lambdas.approvals.handler",
    "lambdas.image_build.handler",
)


def _asset_dirs(platform: Any) -> set[Path]:
    out = Path(platform.assembly.directory)
    dirs = set()
    for stack in platform.stacks:
        manifest = json.loads((out / f"{stack.stack_name}.assets.json").read_text())
        for asset in manifest["files"].values():
            path = out / asset["source"]["path"]
            if (path / "lambdas").is_dir():
                dirs.add(path)
    return dirs


def test_one_code_asset_with_only_the_handlers_and_the_contract(platform: Any) -> None:
    (asset,) = _asset_dirs(platform)  # every function shares one asset
    files = {str(p.relative_to(asset)) for p in asset.rglob("*") if p.is_file()}
    shipped = {str(p.relative_to(ROOT)) for package in ASSET_PACKAGES for p in (ROOT / package).rglob("*.py")}
    assert files == shipped
    assert "lambdas/validate/handler.py" in files
    assert not any("__pycache__" in f for f in files)


def _image_only_packages() -> set[str]:
    """What the training image has and the Lambda runtime does not: the DLC's torch and numpy, and the extras
    training/requirements.txt installs."""
    lines = (ROOT / "training" / "requirements.txt").read_text().splitlines()
    extras = {line.split("==")[0].strip() for line in lines if line.strip() and not line.startswith("#")}
    assert {"safetensors", "blake3"} <= extras
    return {"torch", "numpy", *extras}


def test_handlers_import_from_the_asset_alone_without_torch(platform: Any, tmp_path: Path) -> None:
    (asset,) = _asset_dirs(platform)
    # Make importing the training image's packages fail, as it would in the Lambda runtime, and keep the
    # repository off the path.
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    for package in _image_only_packages():
        (blocker / f"{package}.py").write_text(f"raise ImportError('{package} is not in the Lambda runtime')\n")
    code = "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]; print('ok')"
    env = {**os.environ, "PYTHONPATH": f"{blocker}{os.pathsep}{asset}", "PYTHONSAFEPATH": "1"}
    result = subprocess.run(
        [sys.executable, "-c", code, *HANDLERS], cwd=tmp_path, env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
