"""AWS Batch's multi-node contract, turned into the /opt/ml tree the launcher reads, and S3 done by hand.

On Batch every node runs the image's entrypoint with ``AWS_BATCH_JOB_NODE_INDEX``,
``AWS_BATCH_JOB_NUM_NODES``, ``AWS_BATCH_JOB_MAIN_NODE_INDEX`` and, on the other nodes,
``AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS``. What SageMaker does around the container is done
here: hyperparameters.json and resourceconfig.json are written from the job's environment, data
channels point at FSx (mounted on the host at /fsx) or are downloaded from S3, the run's complete
checkpoints that its ledger records are restored from S3 before the launcher starts, new ones are
uploaded while it runs, and at the end each node
writes its result (exit status, failure, and on the main node the final metrics and the model
archive) under the job's output prefix, where the pipeline's PollBatchJob reads it. The launcher
itself then runs as on SageMaker, as a child process whose SIGTERM this forwards.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from contract.goodput import job_name
from contract.layout import (
    ATTEMPT_ENV,
    CHANNELS_ENV,
    CHECKPOINTS_ENV,
    FSX_ROOT_ENV,
    HYPERPARAMETERS_ENV,
    LEDGER_CHANNEL,
    MAIN_NODE_ADDRESS_ENV,
    MAIN_NODE_INDEX_ENV,
    MANIFEST,
    MASTER_ADDR_ENV,
    NODE_INDEX_ENV,
    NUM_NODES_ENV,
    OUTPUT_ENV,
    PREPARED_ENV,
    PROGRESS,
    SYNC_SECONDS_ENV,
    channel_file,
    result_key,
    split_s3_uri,
)
from contract.ledger import Recorded, delivered
from contract.metrics import parse_metrics
from contract.stored_checkpoints import complete_checkpoints
from training.sagemaker_contract import ContractError, Paths, ResourceConfig, write_failure

log = logging.getLogger("training.batch")

DEFAULT_FSX_ROOT = "/fsx"
EXIT_INVALID_INPUT = 2


@dataclass(frozen=True)
class BatchNode:
    """This node's place in the multi-node job, from Batch's variables."""

    index: int
    num_nodes: int
    main_index: int
    main_address: str | None
    attempt: int

    @property
    def is_main(self) -> bool:
        return self.index == self.main_index

    @property
    def master_addr(self) -> str:
        # The main node hosts the rendezvous (listening on every interface); its own workers reach it locally.
        return "127.0.0.1" if self.is_main else str(self.main_address)

    def resource_config(self) -> ResourceConfig:
        """Host names as the launcher wants them; the main node is rank 0 whatever its index."""
        order = [self.main_index, *(i for i in range(self.num_nodes) if i != self.main_index)]
        hosts = tuple(f"node-{i}" for i in order)
        return ResourceConfig(current_host=f"node-{self.index}", hosts=hosts)


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name, "").strip()
    if not raw and default is not None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ContractError(f"AWS Batch variable {name}={raw!r} must be an integer") from None


def batch_node(env: Mapping[str, str]) -> BatchNode | None:
    """This node from Batch's multi-node variables; None when not on Batch."""
    if NODE_INDEX_ENV not in env:
        return None
    node = BatchNode(
        index=_int(env, NODE_INDEX_ENV),
        num_nodes=_int(env, NUM_NODES_ENV),
        main_index=_int(env, MAIN_NODE_INDEX_ENV, 0),
        main_address=env.get(MAIN_NODE_ADDRESS_ENV) or None,
        attempt=_int(env, ATTEMPT_ENV, 1),
    )
    if node.num_nodes < 1 or not 0 <= node.index < node.num_nodes or not 0 <= node.main_index < node.num_nodes:
        raise ContractError(
            f"AWS Batch variables are inconsistent: node {node.index} (main {node.main_index}) of {node.num_nodes}"
        )
    if not node.is_main and node.main_address is None:
        raise ContractError(
            f"{MAIN_NODE_ADDRESS_ENV} is not set on node {node.index}: the node cannot find the main node"
        )
    return node


def _required(env: Mapping[str, str], name: str) -> str:
    value = env.get(name, "").strip()
    if not value:
        raise ContractError(f"environment variable {name} is not set; the pipeline's SubmitJob sets it")
    return value


def _download(s3: Any, uri: str, target: Path) -> int:
    try:
        bucket, prefix = split_s3_uri(uri)
    except ValueError as exc:  # a channel's or the checkpoints' URI: invalid input
        raise ContractError(str(exc)) from None
    count = 0
    target.mkdir(parents=True, exist_ok=True)
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            destination = target / channel_file(prefix, obj["Key"])
            destination.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(bucket, obj["Key"], str(destination))
            count += 1
    return count


def prepare(paths: Paths, node: BatchNode, env: Mapping[str, str], s3: Any) -> None:
    """Lay out /opt/ml from the job's environment, and restore the run's checkpoints from S3."""
    config = paths.hyperparameters.parent
    config.mkdir(parents=True, exist_ok=True)
    try:
        hyperparameters = json.loads(env.get(HYPERPARAMETERS_ENV) or "{}")
        channels = json.loads(_required(env, CHANNELS_ENV))
    except json.JSONDecodeError as exc:
        raise ContractError(f"{HYPERPARAMETERS_ENV} or {CHANNELS_ENV} is not valid JSON: {exc}") from None
    paths.hyperparameters.write_text(json.dumps(hyperparameters))
    resources = node.resource_config()
    paths.resource_config.write_text(
        json.dumps({"current_host": resources.current_host, "hosts": list(resources.hosts)})
    )
    fsx_root = Path(env.get(FSX_ROOT_ENV) or DEFAULT_FSX_ROOT)
    for channel in channels:
        name, source = channel["ChannelName"], channel["DataSource"]
        target = paths.channel(name)
        if target.exists() or target.is_symlink():
            continue
        if "FileSystemDataSource" in source:
            # SageMaker's DirectoryPath is /<mount name>/<path>; the host mounts the file system's root at /fsx.
            relative = source["FileSystemDataSource"]["DirectoryPath"].strip("/").split("/", 1)[1]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(fsx_root / relative, target_is_directory=True)
        else:
            _download(s3, source["S3DataSource"]["S3Uri"], target)
    trusted = delivered(paths.channel(LEDGER_CHANNEL), job=job_name(env))
    restored = restore_checkpoints(s3, _required(env, CHECKPOINTS_ENV), paths.checkpoints, trusted=trusted)
    log.info("node %d of %d: checkpoints %s restored from S3", node.index, node.num_nodes, restored or "none")
    if node.is_main:
        restore_progress(s3, _required(env, CHECKPOINTS_ENV), paths.checkpoints)


def restore_progress(s3: Any, uri: str, target: Path) -> int:
    """Download the run's progress records (contract/goodput.py), as SageMaker restores the whole prefix; how many."""
    bucket, prefix = split_s3_uri(uri)
    folder = f"{prefix}{PROGRESS}/"
    count = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=folder):
        for item in page.get("Contents", []):
            name = item["Key"].removeprefix(folder)
            if "/" in name or not name.endswith(".json"):
                continue
            (target / PROGRESS).mkdir(parents=True, exist_ok=True)
            s3.download_file(bucket, item["Key"], str(target / PROGRESS / name))
            count += 1
    return count


def restore_checkpoints(s3: Any, uri: str, target: Path, *, trusted: Recorded | None) -> list[str]:
    """Download the run's checkpoints it may resume from (contract/ledger.py `Recorded.admits`: complete, and as its
    ledger `trusted` records them; None: no ledger, every complete one), each manifest after its files; their
    directories."""
    try:
        bucket, prefix = split_s3_uri(uri)
    except ValueError as exc:
        raise ContractError(str(exc)) from None
    restored = []
    for checkpoint in complete_checkpoints(s3, bucket, prefix):
        if trusted is not None and not trusted.admits(
            checkpoint.prefix.removeprefix(prefix), checkpoint.manifest_sha256
        ):
            log.warning("not restoring %s: not as the run's ledger records it", checkpoint.uri)
            continue
        directory = target / checkpoint.prefix.removeprefix(prefix)
        directory.mkdir(parents=True, exist_ok=True)
        for name in sorted(checkpoint.files, key=lambda n: n == MANIFEST):
            s3.download_file(bucket, f"{checkpoint.prefix}{name}", str(directory / name))
        restored.append(checkpoint.prefix.removeprefix(prefix))
    return restored


class CheckpointSync:
    """Uploads new or changed files under /opt/ml/checkpoints to the run's prefix, as SageMaker does."""

    def __init__(self, s3: Any, local: Path, uri: str, *, interval: float) -> None:
        self._s3, self._local, self._interval = s3, local, interval
        self._bucket, self._prefix = split_s3_uri(uri)
        self._seen: dict[Path, tuple[float, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        # Files restored from S3 are there already.
        self._mark_all()

    def _mark_all(self) -> None:
        for path in self._files():
            stat = path.stat()
            self._seen[path] = (stat.st_mtime, stat.st_size)

    def _files(self) -> list[Path]:
        if not self._local.is_dir():
            return []
        # Everything but the manifest's temporary file (DCP's own .metadata included).
        return sorted(p for p in self._local.rglob("*") if p.is_file() and not p.name.endswith(".tmp"))

    def sync(self) -> int:
        """One pass; manifests last, so a step's manifest never reaches S3 before this host's shards of it."""
        changed = []
        for path in self._files():
            try:
                stat = path.stat()
            except FileNotFoundError:  # pruned meanwhile
                continue
            if self._seen.get(path) != (stat.st_mtime, stat.st_size):
                changed.append((path, (stat.st_mtime, stat.st_size)))
        changed.sort(key=lambda item: item[0].name == MANIFEST)
        for path, signature in changed:
            key = self._prefix + path.relative_to(self._local).as_posix()
            try:
                self._s3.upload_file(str(path), self._bucket, key)
            except FileNotFoundError:
                continue
            self._seen[path] = signature
        return len(changed)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.sync()
            except Exception:  # a failed pass is retried on the next; the final sync raises
                log.exception("checkpoint upload failed; retrying")

    def __enter__(self) -> CheckpointSync:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sync()


def _launch(
    env: Mapping[str, str],
    master_addr: str,
    *,
    echo: Callable[[str], None] | None = None,
    started: Callable[[subprocess.Popen[bytes]], None] | None = None,
) -> tuple[int, str]:
    """The launcher as a child process in its own session (SIGTERM forwarded); its exit status and output."""
    child_env = {**env, PREPARED_ENV: "1", MASTER_ADDR_ENV: master_addr}
    child = subprocess.Popen(
        [sys.executable, "-m", "training.launcher", "train"],
        env=child_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    if started is not None:
        started(child)

    def forward(signum: int, _frame: FrameType | None) -> None:
        child.send_signal(signum)

    # Batch's TerminateJob (and a host's shutdown) signals this process; the launcher checkpoints on SIGTERM.
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, forward) if main_thread else None
    lines = []
    try:
        assert child.stdout is not None
        for raw in child.stdout:
            line = raw.decode(errors="replace")
            (echo or _print)(line)
            lines.append(line)
        return child.wait(), "".join(lines)
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def _print(line: str) -> None:
    sys.stdout.write(line)
    sys.stdout.flush()


def _put_json(s3: Any, uri: str, body: dict[str, Any]) -> None:
    bucket, key = split_s3_uri(uri)
    s3.put_object(Bucket=bucket, Key=key, Body=json.dumps(body).encode(), ContentType="application/json")


def _upload_model(s3: Any, paths: Paths, output: str) -> str:
    bucket, prefix = split_s3_uri(output)
    with tempfile.TemporaryDirectory() as scratch:
        archive = Path(scratch) / "model.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            for path in sorted(paths.model.rglob("*")):
                tar.add(path, arcname=path.relative_to(paths.model).as_posix())
        s3.upload_file(str(archive), bucket, f"{prefix}model.tar.gz")
    return f"s3://{bucket}/{prefix}model.tar.gz"


def run(
    node: BatchNode,
    env: Mapping[str, str],
    s3: Any,
    *,
    echo: Callable[[str], None] | None = None,
    started: Callable[[subprocess.Popen[bytes]], None] | None = None,
) -> int:
    """Prepare, train with checkpoints synced to S3, then record this node's result; the launcher's exit status."""
    paths = Paths.from_env(env)
    output = _required(env, OUTPUT_ENV)
    result: dict[str, Any] = {"node": node.index, "attempt": node.attempt}
    try:
        prepare(paths, node, env, s3)
    except ContractError as exc:
        log.error("invalid input: %s", exc)
        write_failure(paths, str(exc))
        _put_json(
            s3,
            result_key(output, node.attempt, node.index),
            {**result, "exit_code": EXIT_INVALID_INPUT, "failure": str(exc)},
        )
        return EXIT_INVALID_INPUT
    interval = float(env.get(SYNC_SECONDS_ENV) or 30)
    with CheckpointSync(s3, paths.checkpoints, _required(env, CHECKPOINTS_ENV), interval=interval):
        returncode, text = _launch(env, node.master_addr, echo=echo, started=started)
    failure = paths.failure.read_text().splitlines()[0] if paths.failure.exists() else None
    result.update(exit_code=returncode, failure=failure)
    if node.is_main:
        result["final_metrics"] = {name: values[-1] for name, values in sorted(parse_metrics(text).items())}
        if returncode == 0 and paths.model.is_dir() and any(paths.model.iterdir()):
            result["model_artifacts"] = _upload_model(s3, paths, output)
    _put_json(s3, result_key(output, node.attempt, node.index), result)
    return returncode


def main(argv: Sequence[str] | None = None) -> int:
    del argv  # Batch passes the job definition's command ("train"), as SageMaker does
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s batch: %(message)s", stream=sys.stdout)
    import boto3  # noqa: PLC0415 - only the Batch path talks to S3 itself

    try:
        node = batch_node(os.environ)
    except ContractError as exc:
        log.error("invalid input: %s", exc)
        write_failure(Paths.from_env(), str(exc))
        return EXIT_INVALID_INPUT
    if node is None:
        log.error("%s is not set: not an AWS Batch multi-node job", NODE_INDEX_ENV)
        return EXIT_INVALID_INPUT
    return run(node, os.environ, boto3.client("s3"))
