"""A run's own code through the image's launcher: checked, given SageMaker's environment, and its end classified
(training/user_code.py, training/user_worker.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch.distributed as dist
from own_code import code_tree, first_line, launch, launcher_env
from training_helpers import REPO

from contract.code_archive import pack
from contract.hang import hung_seconds
from contract.user_code import UserCode
from lambdas.sagemaker.monitor import retry_cause
from training.sagemaker_contract import Paths, ResourceConfig
from training.user_code import ExitRecord, script_arguments, script_env, script_tail, verdict
from training.user_worker import run_script

SHA = "ab" * 32
CODE = UserCode.from_hyperparameters(
    {"code.entry_point": "train.py", "code.sha256": SHA, "code.args": '["--fast"]', "code.retry_on_exit_codes": "[75]"}
)
AGENT = [
    "W1202 03:43:54.695000 5107 .venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/"
    "api.py:1028] Sending process 5360 closing signal SIGTERM",
    "Traceback (most recent call last):",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
]


def _reason(paths: Paths) -> str:
    """SageMaker's FailureReason of a job whose failure file this is."""
    return f"AlgorithmError: {paths.failure.read_text().splitlines()[0]}"


def test_the_script_gets_sagemakers_variables_and_its_own_hyperparameters_as_arguments(tmp_path: Path) -> None:
    assert CODE is not None
    paths = Paths(tmp_path)
    for channel in ("train", "validation", "code", "ledger"):
        paths.channel(channel).mkdir(parents=True)
    hps = {**{"code.entry_point": "train.py", "code.sha256": SHA}, "lr": "0.1", "epochs": "3", "hang.minutes": "5"}
    resources = ResourceConfig("algo-2", ("algo-1", "algo-2"), "eth0")
    env = script_env(paths, CODE, tmp_path / "code", resources, hps, gpus=8)
    assert json.loads(env["SM_CHANNELS"]) == ["train", "validation"]  # the platform's own channels are not data
    assert env["SM_CHANNEL_TRAIN"] == str(paths.channel("train"))
    assert json.loads(env["SM_HPS"]) == {"lr": 0.1, "epochs": 3} and env["SM_HP_LR"] == "0.1"
    assert (env["SM_MODEL_DIR"], env["SM_OUTPUT_DATA_DIR"]) == (str(paths.model), str(paths.output / "data"))
    assert (env["SM_CURRENT_HOST"], json.loads(env["SM_HOSTS"]), env["SM_NUM_GPUS"]) == (
        "algo-2",
        ["algo-1", "algo-2"],
        "8",
    )
    assert env["SM_NETWORK_INTERFACE_NAME"] == "eth0" and env["TRAINING_CHECKPOINT_DIR"] == str(paths.checkpoints)
    assert env["PYTHONPATH"].split(":")[:2] == [str(tmp_path / "code"), str(tmp_path / "code" / ".tp/site-packages")]
    assert script_arguments(CODE, hps) == ["--fast", "--epochs", "3", "--lr", "0.1"]
    assert json.loads(env["SM_USER_ARGS"]) == ["--fast", "--epochs", "3", "--lr", "0.1"]


def test_the_scripts_last_words_are_told_from_torchruns_report() -> None:
    banner = ["", "*" * 41, "Setting OMP_NUM_THREADS environment variable for each process to be 1", "*" * 41]
    assert script_tail([*banner, "loading data", "ValueError: no labels", *AGENT]) == [
        "loading data",
        "ValueError: no labels",
    ]


def test_each_end_of_a_script_is_classified_and_only_platform_faults_are_retried(tmp_path: Path) -> None:
    assert CODE is not None
    cases = [
        ([ExitRecord(1, "algo-1", 3, at=2.0), ExitRecord(0, "algo-1", 1, "DistBackendError: peer", True, 3.0)],
         "UserCodeFailed: the script exited with status 3 on algo-1 (rank 1): bad batch", None),
        ([ExitRecord(0, "algo-1", 75, at=1.0)], "RetryableExit: the script exited with status 75", "RetryableExit"),
        ([ExitRecord(0, "algo-2", 1, "DistNetworkError: Connection reset by peer", True, 1.0)],
         "CommunicationFailed: the script's collective communication failed on algo-2", "CommunicationFailed"),
        ([ExitRecord(0, "algo-1", 1, "KeyError: 'label'", at=1.0)], "UserCodeFailed: the script exited with status 1 on"
         " algo-1 (rank 0): KeyError: 'label'", None),
    ]  # fmt: skip
    for n, (records, line, cause) in enumerate(cases):
        paths = Paths(tmp_path / str(n))
        verdict(paths, CODE, records, ["bad batch", *AGENT], 1)
        assert first_line(paths).startswith(line), first_line(paths)
        assert retry_cause("Failed", _reason(paths)) == cause
        assert paths.failure.read_text().split("\n\n", 1)[1].strip() == "bad batch"  # the script's, not torchrun's
    paths = Paths(tmp_path / "killed")
    verdict(paths, CODE, [], ["NCCL WARN NET/OFI Request error", *AGENT], 1)  # died in NCCL, without a record
    assert retry_cause("Failed", _reason(paths)) == "CommunicationFailed"
    paths = Paths(tmp_path / "oom")
    verdict(paths, CODE, [], ["allocating the batch", *AGENT], 1)
    assert first_line(paths).startswith("UserCodeFailed: the script's workers exited with status 1 without ending")


FAILING = """
import os, sys
import torch.distributed as dist
dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} of {dist.get_world_size()} in {os.getcwd()}", flush=True)
dist.barrier()
if dist.get_rank() == 1:
    print("the labels file has 3 columns, expected 2", file=sys.stderr, flush=True)
    sys.exit(3)
dist.barrier()
"""


@pytest.mark.slow
def test_a_scripts_own_error_ends_the_run_with_its_stderr_and_is_not_retried(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text(FAILING)
    paths = code_tree(tmp_path / "ml", tmp_path / "src", {"preflight": "false"})
    result = launch(tmp_path / "ml")
    assert result.returncode == 1, result.stdout[-3000:]
    assert "rank 0 of 2 in " + str(paths.root / "code") in result.stdout
    line = first_line(paths)
    said = "the labels file has 3 columns, expected 2"
    assert line == f"UserCodeFailed: the script exited with status 3 on algo-1 (rank 1): {said}"
    assert retry_cause("Failed", _reason(paths)) is None


@pytest.mark.slow
def test_a_failed_preflight_is_a_platform_fault_retried_on_fresh_nodes(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print('the script ran', flush=True)\n")
    paths = code_tree(tmp_path / "ml", tmp_path / "src", {})
    result = launch(tmp_path / "ml", nproc=1, TRAINING_EXPECTED_GPUS="1")  # this host has none
    assert result.returncode == 4, result.stdout[-3000:]
    assert first_line(paths).startswith("PreflightFailed: GPUs missing")
    assert "the script ran" not in result.stdout
    assert retry_cause("Failed", _reason(paths)) == "PreflightFailed"


@pytest.mark.slow
def test_a_script_that_falls_silent_is_found_hung_without_the_sdk(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("import time\nprint('epoch 1', flush=True)\ntime.sleep(600)\n")
    paths = code_tree(tmp_path / "ml", tmp_path / "src", {"preflight": "false", "hang.minutes": "0.05"})
    result = launch(tmp_path / "ml", nproc=1)
    assert result.returncode == 5, result.stdout[-3000:]
    assert first_line(paths).startswith("HangDetected: no training step and no output for 3 s")
    assert retry_cause("Failed", _reason(paths)) == "HangDetected"
    assert hung_seconds(first_line(paths)) == 3  # the goodput ledger counts the silence as a stall


def test_a_tampered_archive_is_refused_and_nothing_of_it_runs(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("open('ran', 'w').close()\n")
    paths = code_tree(tmp_path / "ml", tmp_path / "src", {})
    (archive,) = paths.channel("code").iterdir()
    (tmp_path / "evil").mkdir()
    (tmp_path / "evil" / "train.py").write_text("import os; os.system('echo pwned')\n")
    forged = pack(tmp_path / "evil", tmp_path / "forged")
    archive.write_bytes(forged.path.read_bytes())  # the name (and the run's digest) stay the packed code's
    result = launch(tmp_path / "ml", nproc=1)
    assert result.returncode == 2, result.stdout[-3000:]
    assert "not the" in first_line(paths) and "it changed after it was packed" in first_line(paths)
    assert not (paths.root / "code").exists() and "pwned" not in result.stdout


def _wheel(folder: Path, name: str, version: str, body: str) -> Path:
    """A pure-Python wheel made by hand: what `tp` puts in the wheelhouse, without a package index."""
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{name}/__init__.py", body)
        wheel.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        wheel.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        wheel.writestr(f"{info}/RECORD", "")
    return path


@pytest.mark.slow
def test_requirements_install_from_the_wheelhouse_alone_with_their_hashes(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "requirements.txt").write_text("tinydep==1.0\n")
    (tmp_path / "src" / "train.py").write_text("import tinydep\nprint('tinydep says', tinydep.VALUE, flush=True)\n")
    (tmp_path / "wheels").mkdir()
    wheel = _wheel(tmp_path / "wheels", "tinydep", "1.0", "VALUE = 42\n")
    hps = {"preflight": "false", "code.requirements": "requirements.txt"}
    paths = code_tree(tmp_path / "ml", tmp_path / "src", hps, requirements="requirements.txt", wheels=[wheel])
    result = launch(tmp_path / "ml", nproc=1)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "tinydep says 42" in result.stdout
    assert (paths.root / "code" / ".tp" / "site-packages" / "tinydep" / "__init__.py").is_file()


def test_the_failing_workers_own_stderr_names_the_failure_not_a_peers_lost_link(tmp_path: Path) -> None:
    assert CODE is not None
    logs = tmp_path / "logs"
    own = logs / "run_x" / "attempt_0" / "1" / "stderr.log"
    own.parent.mkdir(parents=True)
    own.write_text("reading labels\nthe labels file has 3 columns, expected 2\n")
    merged = [
        "[default1]:the labels file has 3 columns, expected 2",
        "[default0]:RuntimeError: Connection closed by peer",
    ]
    paths = Paths(tmp_path / "ml")
    verdict(paths, CODE, [ExitRecord(1, "algo-1", 3, at=1.0, local_rank=1)], merged, 1, logs=logs)
    assert first_line(paths).endswith("(rank 1): the labels file has 3 columns, expected 2")
    assert "Connection closed" not in paths.failure.read_text()


@pytest.mark.parametrize("ending", ["", "raise SystemExit(0)", "dist.destroy_process_group()"])
def test_the_process_group_a_script_that_succeeded_leaves_up_is_destroyed_before_the_interpreter_exits(
    tmp_path: Path, ending: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch's threads of a group left up are torn down in the interpreter's exit, where gloo's can abort (SIGABRT)
    a run that succeeded: the worker ends the group itself."""
    # run_script sets sys.argv and sys.path[0] as Python does for a script of its own process; this one is pytest's.
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    script = tmp_path / "train.py"
    script.write_text(
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
        f"{ending}\n"
    )
    status, error = run_script([str(script)])
    assert not dist.is_initialized()
    assert (status, error) == (0, None)


HEAVY_MODULES = ("torch", "numpy", "boto3", "training.batch_contract", "contract.ledger", "contract.goodput")
"""What the launcher must not have imported when it starts torchrun: each is Python start-up a user waits for
before the first step (torchrun imports torch itself; the rest serve the Batch path alone)."""
_MODULES_AT_START = """
import json, sys
from training import launcher
def run(self):
    print("MODULES " + json.dumps(sorted(sys.modules)), flush=True)
    return 0, False
launcher.Supervisor.run = run
sys.exit(launcher.main(["train"]))
"""


def test_the_launcher_starts_torchrun_without_importing_heavy_modules(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print('step=1')\n")
    code_tree(tmp_path / "ml", tmp_path / "src", {})
    result = subprocess.run(
        [sys.executable, "-c", _MODULES_AT_START],
        env=launcher_env(tmp_path / "ml"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("MODULES ")] or [result.stdout[-2000:]]
    imported = set(json.loads(line.removeprefix("MODULES ")))
    assert {"training.launcher", "training.user_code"} <= imported  # the run's own code was prepared
    assert imported.isdisjoint(HEAVY_MODULES), sorted(imported & set(HEAVY_MODULES))
