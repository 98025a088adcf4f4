"""The launcher on AWS Batch: Batch's multi-node variables in, the /opt/ml tree and S3 by hand out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from contract import layout, ledger
from contract.config import from_hyperparameters
from tests.stored import put_checkpoint
from training import batch_contract
from training.launcher import plan_launch
from training.sagemaker_contract import ContractError, Paths, read_resource_config

BUCKET = "tp-dev-checkpoints-123456789012-us-east-1"


def _env(index: int, nodes: int = 2, **extra: str) -> dict[str, str]:
    env = {layout.NODE_INDEX_ENV: str(index), layout.NUM_NODES_ENV: str(nodes), layout.MAIN_NODE_INDEX_ENV: "0"}
    if index != 0:
        env[layout.MAIN_NODE_ADDRESS_ENV] = "10.20.0.17"
    return {**env, **extra}


def test_batch_variables_give_the_node_its_rank_and_the_main_nodes_address() -> None:
    assert batch_contract.batch_node({}) is None  # SageMaker (or a plain container): not on Batch
    main, child = batch_contract.batch_node(_env(0)), batch_contract.batch_node(_env(1, AWS_BATCH_JOB_ATTEMPT="2"))
    assert main is not None and child is not None
    assert (main.is_main, main.master_addr, main.attempt) == (True, "127.0.0.1", 1)
    assert (child.is_main, child.master_addr, child.attempt) == (False, "10.20.0.17", 2)
    resources = child.resource_config()
    assert (resources.hosts, resources.current_host, resources.node_rank) == (("node-0", "node-1"), "node-1", 1)


def test_the_main_node_is_rank_0_whatever_its_index() -> None:
    node = batch_contract.batch_node(
        {**_env(0, nodes=3), layout.MAIN_NODE_INDEX_ENV: "2", layout.MAIN_NODE_ADDRESS_ENV: "10.0.0.5"}
    )
    assert node is not None and not node.is_main
    assert node.resource_config().hosts == ("node-2", "node-0", "node-1")
    assert node.resource_config().node_rank == 1


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({layout.NODE_INDEX_ENV: "x", layout.NUM_NODES_ENV: "2"}, "must be an integer"),
        (_env(2, nodes=2), "inconsistent"),
        ({layout.NODE_INDEX_ENV: "1", layout.NUM_NODES_ENV: "2"}, "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"),
    ],
)
def test_inconsistent_batch_variables_are_contract_errors(env: dict[str, str], message: str) -> None:
    with pytest.raises(ContractError, match=message):
        batch_contract.batch_node(env)


@mock_aws
def test_prepare_writes_the_launchers_inputs_links_fsx_and_restores_checkpoints(tmp_path: Path) -> None:
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    put_checkpoint(s3, BUCKET, "runs/r-1/checkpoints/", 4)
    fsx = tmp_path / "fsx"
    (fsx / "datasets" / "corpus").mkdir(parents=True)
    channels = [
        {
            "ChannelName": "train",
            "DataSource": {"FileSystemDataSource": {"DirectoryPath": "/abcd1234/datasets/corpus/"}},
        }
    ]
    env = _env(
        1,
        TRAINING_HYPERPARAMETERS=json.dumps({"model": "tiny", "max_steps": "500"}),
        TRAINING_CHANNELS=json.dumps(channels),
        TRAINING_CHECKPOINTS_S3=f"s3://{BUCKET}/runs/r-1/checkpoints/",
        TRAINING_FSX_ROOT=str(fsx),
        OPT_ML_ROOT=str(tmp_path / "opt-ml"),
    )
    node = batch_contract.batch_node(env)
    assert node is not None
    paths = Paths.from_env(env)
    batch_contract.prepare(paths, node, env, s3)
    # The launcher reads what it reads on SageMaker: the same files, the same plan.
    resources = read_resource_config(paths, {})
    plan = plan_launch(
        from_hyperparameters(json.loads(paths.hyperparameters.read_text())),
        resources,
        {"TRAINING_MASTER_ADDR": node.master_addr},
    )
    assert (plan.nnodes, plan.node_rank, plan.master_addr) == (2, 1, "10.20.0.17")
    assert paths.channel("train").resolve() == (fsx / "datasets" / "corpus").resolve()
    assert (paths.checkpoints / "step-4" / "manifest.json").is_file()


@mock_aws
def test_prepare_restores_only_complete_checkpoints_the_runs_ledger_records(tmp_path: Path) -> None:
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    run = layout.run_checkpoints("r-1")
    recorded = put_checkpoint(s3, BUCKET, run, 4)
    ledger.open_ledger(s3, BUCKET, "r-1", execution="arn:execution", continues=None)
    ledger.record(s3, BUCKET, "r-1", checkpoint="step-4/", step=4, manifest_sha256=recorded, job="r-1-1", execution="e")
    # Complete, self-consistent and newer, but written where the platform never saw the run write it.
    put_checkpoint(s3, BUCKET, run, 8, files={".metadata": b"planted", "__0_0.distcp": b"planted"})
    # Recorded, but a listed file never arrived.
    partial = put_checkpoint(s3, BUCKET, run, 6, omit=("__0_0.distcp",))
    ledger.record(s3, BUCKET, "r-1", checkpoint="step-6/", step=6, manifest_sha256=partial, job="r-1-1", execution="e")
    channels = [
        {"ChannelName": "train", "DataSource": {"FileSystemDataSource": {"DirectoryPath": "/abcd1234/datasets/c/"}}},
        {
            "ChannelName": layout.LEDGER_CHANNEL,
            "DataSource": {"S3DataSource": {"S3Uri": f"s3://{BUCKET}/{layout.run_ledger('r-1')}"}},
        },
    ]
    (tmp_path / "fsx" / "datasets" / "c").mkdir(parents=True)
    env = _env(
        0,
        TRAINING_CHANNELS=json.dumps(channels),
        TRAINING_CHECKPOINTS_S3=f"s3://{BUCKET}/{run}",
        TRAINING_FSX_ROOT=str(tmp_path / "fsx"),
        OPT_ML_ROOT=str(tmp_path / "opt-ml"),
    )
    node = batch_contract.batch_node(env)
    assert node is not None
    paths = Paths.from_env(env)
    batch_contract.prepare(paths, node, env, s3)
    assert sorted(p.name for p in paths.checkpoints.iterdir()) == ["step-4"]
    delivered = ledger.delivered(paths.channel(layout.LEDGER_CHANNEL), job="r-1-1")
    assert delivered == ledger.Recorded({"step-4/": recorded, "step-6/": partial})


@mock_aws
def test_prepare_restores_no_copy_of_a_recorded_checkpoint_under_another_step(tmp_path: Path) -> None:
    """The one rule (contract/ledger.py `resumable`): a checkpoint's manifest must be the one recorded of its own
    directory; the bytes of recorded step-4 copied to step-8 are not step 8."""
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    run = layout.run_checkpoints("r-1")
    recorded = put_checkpoint(s3, BUCKET, run, 4)
    ledger.record(s3, BUCKET, "r-1", checkpoint="step-4/", step=4, manifest_sha256=recorded, job="r-1-1", execution="e")
    for key in [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{run}step-4/")["Contents"]]:
        s3.copy_object(Bucket=BUCKET, Key=key.replace("step-4/", "step-8/"), CopySource={"Bucket": BUCKET, "Key": key})
    trusted = ledger.Recorded({"step-4/": recorded})
    restored = batch_contract.restore_checkpoints(s3, f"s3://{BUCKET}/{run}", tmp_path / "checkpoints", trusted=trusted)
    assert restored == ["step-4/"]


@mock_aws
def test_checkpoint_sync_uploads_new_files_with_the_manifest_last(tmp_path: Path) -> None:
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    uploaded: list[str] = []
    original = s3.upload_file

    def upload(path: str, bucket: str, key: str, **kwargs: Any) -> None:
        uploaded.append(key)
        original(path, bucket, key, **kwargs)

    s3.upload_file = upload  # type: ignore[method-assign]
    local = tmp_path / "checkpoints"
    (local / "step-2").mkdir(parents=True)
    (local / "step-2" / "manifest.json").write_text("{}")
    (local / "step-2" / ".metadata").write_text("m")
    (local / "step-2" / "__0_0.distcp").write_text("shard")
    (local / "step-2" / "manifest.json.tmp").write_text("partial")
    sync = batch_contract.CheckpointSync(s3, tmp_path / "empty", f"s3://{BUCKET}/runs/r/checkpoints/", interval=60)
    sync._local = local  # files that appeared after the restore
    assert sync.sync() == 3
    assert uploaded[-1] == "runs/r/checkpoints/step-2/manifest.json"
    assert "runs/r/checkpoints/step-2/.metadata" in uploaded  # DCP's metadata, though a dot file
    assert sync.sync() == 0  # unchanged files are not uploaded again


def test_the_image_entrypoint_hands_batch_nodes_to_the_batch_contract(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[2]), **_env(1)}
    env.pop(layout.MAIN_NODE_ADDRESS_ENV)  # a child node without the main node's address
    result = subprocess.run(
        [sys.executable, "-m", "training.launcher", "train"],
        env={**env, "OPT_ML_ROOT": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == batch_contract.EXIT_INVALID_INPUT
    assert "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS is not set on node 1" in result.stdout + result.stderr
    assert (tmp_path / "output" / "failure").read_text().startswith("AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS")
    assert layout.on_batch(_env(0)) and not layout.on_batch({**_env(0), layout.PREPARED_ENV: "1"})


@mock_aws
def test_the_runs_progress_records_are_restored_for_the_trainers_rework_count(tmp_path: Path) -> None:
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="ckpt")
    prefix = layout.run_checkpoints("run")
    for key in ("run-1-1700000000000.json", "run-2-1700000009000.json", "nested/x.json", "notes.txt"):
        s3.put_object(Bucket="ckpt", Key=f"{prefix}{layout.PROGRESS}/{key}", Body=b"{}")
    assert batch_contract.restore_progress(s3, f"s3://ckpt/{prefix}", tmp_path) == 2
    restored = sorted(p.name for p in (tmp_path / layout.PROGRESS).iterdir())
    assert restored == ["run-1-1700000000000.json", "run-2-1700000009000.json"]


@mock_aws
def test_prepare_lays_out_a_channel_of_one_object_as_sagemaker_does(tmp_path: Path) -> None:
    # The code channel names its archive by its whole key: the node receives the archive by its name.
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    archive = layout.code_key("vision-run", "vision", "a" * 64)
    s3.put_object(Bucket=BUCKET, Key=archive, Body=b"packed code")
    s3.put_object(Bucket=BUCKET, Key="data/train/part-0.jsonl", Body=b"{}")
    channels = [
        {"ChannelName": name, "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": uri}}}
        for name, uri in (("code", f"s3://{BUCKET}/{archive}"), ("train", f"s3://{BUCKET}/data/train/"))
    ]
    env = _env(
        0,
        TRAINING_CHANNELS=json.dumps(channels),
        TRAINING_CHECKPOINTS_S3=f"s3://{BUCKET}/runs/r-1/checkpoints/",
        OPT_ML_ROOT=str(tmp_path / "opt-ml"),
    )
    node = batch_contract.batch_node(env)
    assert node is not None
    paths = Paths.from_env(env)
    batch_contract.prepare(paths, node, env, s3)
    assert (paths.channel("code") / f"{'a' * 64}.tar.gz").read_bytes() == b"packed code"
    assert (paths.channel("train") / "part-0.jsonl").read_bytes() == b"{}"
