"""The local platform plays each registered backend that declares a local player, made as the demo makes it."""

from __future__ import annotations

from pathlib import Path

import boto3
from moto import mock_aws

from contract.layout import code_key, split_s3_uri
from lambdas.backends import BACKENDS
from lambdas.validate.code import channel
from localrun.aws.engine import player_factories
from localrun.backends.batch import LocalBatch
from localrun.backends.sagemaker import _download_prefix


def test_every_backend_with_a_local_player_has_a_factory_that_makes_one(tmp_path: Path) -> None:
    factories = player_factories()
    assert sorted(factories) == sorted(name for name, declared in BACKENDS.items() if declared.local is not None)
    for name, make in factories.items():
        player = make(tmp_path / name, max_hosts=3, spot_interrupt=False, on_line=lambda _job, _line: None)
        assert player.patches() and player.job_facts() == []
        player.close()


def test_the_demos_batch_loses_one_node_when_asked_to_interrupt(tmp_path: Path) -> None:
    batch = player_factories()["batch"](tmp_path, max_hosts=3, spot_interrupt=True, on_line=lambda _j, _l: None)
    assert isinstance(batch, LocalBatch)
    assert (batch.max_nodes, batch.kill_node_after_checkpoint) == (3, 1)


@mock_aws
def test_the_local_sagemaker_lays_out_the_code_channel_as_sagemaker_does(tmp_path: Path) -> None:
    # One object named by its whole key: the host receives it by its name, /opt/ml/input/data/code/<sha256>.tar.gz.
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="artifacts")
    key = code_key("vision-run", None, "b" * 64)
    s3.put_object(Bucket="artifacts", Key=key, Body=b"packed code")
    uri = channel(f"s3://artifacts/{key}")["DataSource"]["S3DataSource"]["S3Uri"]
    _download_prefix(s3, *split_s3_uri(uri), tmp_path / "code")
    assert [p.name for p in (tmp_path / "code").iterdir()] == [f"{'b' * 64}.tar.gz"]
    assert (tmp_path / "code" / f"{'b' * 64}.tar.gz").read_bytes() == b"packed code"
