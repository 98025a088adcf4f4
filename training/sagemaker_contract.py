"""SageMaker's container contract: the /opt/ml tree, the host list, data channels, the failure file.

Torch-free, shared by the launcher and the trainer. ``OPT_ML_ROOT`` relocates /opt/ml for local runs.
"""

from __future__ import annotations

import json
import os
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from contract.layout import OPT_ML_ROOT_ENV
from contract.sft import SUFFIXES as SFT_SUFFIXES

DEFAULT_OPT_ML_ROOT = "/opt/ml"
TRAIN_CHANNEL = "train"
VALIDATION_CHANNEL = "validation"
SHARD_GLOB = "*.bin"
VAL_SHARD_GLOB = "*val*.bin"
FAILURE_TAIL_LINES = 15


class ContractError(ValueError):
    """The container's inputs (channels, resource config) do not match the contract; says what to fix."""


@dataclass(frozen=True)
class Paths:
    """Where SageMaker puts inputs and collects outputs, rooted at /opt/ml or ``$OPT_ML_ROOT``."""

    root: Path

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Paths:
        env = os.environ if env is None else env
        return cls(Path(env.get(OPT_ML_ROOT_ENV) or DEFAULT_OPT_ML_ROOT))

    @property
    def hyperparameters(self) -> Path:
        return self.root / "input" / "config" / "hyperparameters.json"

    @property
    def resource_config(self) -> Path:
        return self.root / "input" / "config" / "resourceconfig.json"

    def channel(self, name: str) -> Path:
        return self.root / "input" / "data" / name

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def model(self) -> Path:
        return self.root / "model"

    @property
    def output(self) -> Path:
        return self.root / "output"

    @property
    def failure(self) -> Path:
        return self.output / "failure"


@dataclass(frozen=True)
class ResourceConfig:
    """This host's place in the cluster, from resourceconfig.json (the source of truth)."""

    current_host: str
    hosts: tuple[str, ...]
    network_interface_name: str | None = None
    groups: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """A heterogeneous cluster's instance groups and their hosts; empty for one group."""

    @property
    def node_rank(self) -> int:
        return self.hosts.index(self.current_host)

    def of_groups(self, names: Sequence[str]) -> ResourceConfig | None:
        """The cluster of the named groups only (hosts in the job's order), or None when this host is not in it.

        A cluster without groups is all one group, whatever the names.
        """
        if not self.groups:
            return self
        known = dict(self.groups)
        unknown = sorted(set(names) - set(known))
        if unknown or not names:
            raise ContractError(
                f"the job's instance groups are {', '.join(known)}; the training groups named are "
                f"{', '.join(names) or 'none'}"
            )
        members = {host for name in names for host in known[name]}
        if self.current_host not in members:
            return None
        hosts = tuple(host for host in self.hosts if host in members)
        return ResourceConfig(self.current_host, hosts, self.network_interface_name)


def read_hyperparameters(paths: Paths) -> dict[str, object]:
    """hyperparameters.json as a dict (empty when absent, as for a job without hyperparameters)."""
    if not paths.hyperparameters.exists():
        return {}
    try:
        data = json.loads(paths.hyperparameters.read_text())
    except json.JSONDecodeError as exc:
        raise ContractError(f"{paths.hyperparameters} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ContractError(f"{paths.hyperparameters} must hold a JSON object, got {type(data).__name__}")
    return data


def read_resource_config(paths: Paths, env: Mapping[str, str] | None = None) -> ResourceConfig:
    """The file when present, else SageMaker's SM_CURRENT_HOST/SM_HOSTS, else a single local host."""
    env = os.environ if env is None else env
    if paths.resource_config.exists():
        try:
            data = json.loads(paths.resource_config.read_text())
        except json.JSONDecodeError as exc:
            raise ContractError(f"{paths.resource_config} is not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ContractError(f"{paths.resource_config} must hold a JSON object")
        current, hosts, ifname = (
            data.get("current_host"),
            data.get("hosts"),
            data.get("network_interface_name"),
        )
        groups = _instance_groups(paths, data.get("instance_groups"))
    elif "SM_CURRENT_HOST" in env:
        current, hosts, ifname = env["SM_CURRENT_HOST"], json.loads(env.get("SM_HOSTS", "[]")), None
        groups = ()
    else:
        return ResourceConfig(current_host="localhost", hosts=("localhost",))
    if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) for h in hosts):
        raise ContractError(f"{paths.resource_config}: 'hosts' must be a non-empty list of names, got {hosts!r}")
    if current not in hosts:
        raise ContractError(f"{paths.resource_config}: current_host {current!r} is not in hosts {hosts}")
    return ResourceConfig(
        current_host=str(current), hosts=tuple(hosts), network_interface_name=ifname or None, groups=groups
    )


def _instance_groups(paths: Paths, groups: object) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """resourceconfig.json's `instance_groups` (a heterogeneous cluster's), as (name, hosts) pairs."""
    if groups is None:
        return ()
    if not isinstance(groups, list) or not all(
        isinstance(g, dict) and isinstance(g.get("instance_group_name"), str) and isinstance(g.get("hosts"), list)
        for g in groups
    ):
        raise ContractError(f"{paths.resource_config}: 'instance_groups' must be a list of groups with their hosts")
    if len(groups) < 2:  # one group (SageMaker may list a homogeneous job's too) is no heterogeneous cluster
        return ()
    return tuple((g["instance_group_name"], tuple(str(h) for h in g["hosts"])) for g in groups)


@dataclass(frozen=True)
class DataFiles:
    """Token shards, or supervised fine-tuning files (contract/sft.py), for training and validation, in a stable
    (sorted) order."""

    train: tuple[Path, ...]
    validation: tuple[Path, ...]
    sft: bool = False


def _sft_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.name.endswith(SFT_SUFFIXES))


def _shards(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob(SHARD_GLOB) if p.is_file())


def find_data_files(paths: Paths) -> DataFiles:
    """Train shards: ``*.bin`` under the train channel except ``*val*.bin``. Validation: the validation
    channel's ``*.bin`` when it has any, else the train channel's ``*val*.bin``."""
    train_dir = paths.channel(TRAIN_CHANNEL)
    if not train_dir.is_dir():
        raise ContractError(
            f"data channel '{TRAIN_CHANNEL}' is missing: expected a directory at {train_dir}. "
            "Give the training job an input channel named 'train' holding *.bin token shards."
        )
    sft = _sft_files(train_dir)
    if sft:
        return _sft_data(paths, sft, mixed=bool(_shards(train_dir)))
    all_train = _shards(train_dir)
    val_in_train = [p for p in all_train if p.match(VAL_SHARD_GLOB)]
    train = [p for p in all_train if p not in val_in_train]
    if not train:
        raise ContractError(
            f"data channel '{TRAIN_CHANNEL}' at {train_dir} has no training shards (*.bin files whose "
            "name does not contain 'val'). Create them with: python -m training.prepare"
        )
    val_dir = paths.channel(VALIDATION_CHANNEL)
    validation = _shards(val_dir) if val_dir.is_dir() else []
    return DataFiles(train=tuple(train), validation=tuple(validation or val_in_train))


def _sft_data(paths: Paths, files: list[Path], *, mixed: bool) -> DataFiles:
    """Supervised fine-tuning files: those whose name contains 'val' validate, the others train."""
    train_dir = paths.channel(TRAIN_CHANNEL)
    if mixed:
        raise ContractError(
            f"data channel '{TRAIN_CHANNEL}' at {train_dir} holds both token shards (*.bin) and fine-tuning records "
            f"({', '.join(SFT_SUFFIXES)}); give the job one kind of data"
        )
    validation = [p for p in files if "val" in p.name]
    train = [p for p in files if p not in validation]
    if not train:
        raise ContractError(
            f"data channel '{TRAIN_CHANNEL}' at {train_dir} has only validation files ('val' in the name)"
        )
    val_dir = paths.channel(VALIDATION_CHANNEL)
    validation = (_sft_files(val_dir) if val_dir.is_dir() else []) or validation
    return DataFiles(train=tuple(train), validation=tuple(validation), sft=True)


def write_failure(paths: Paths, reason: str, *, exc: BaseException | None = None, details: str = "") -> None:
    """Write SageMaker's failure file once: the reason on the first line, then a short tail of context.

    The first writer wins, so the root cause (not a peer's "connection closed") is what users see.
    """
    lines = reason.strip().splitlines() or ["training failed"]
    text = " ".join(line.strip() for line in lines)
    if exc is not None:
        details = "".join(traceback.format_exception(exc))
    tail = details.rstrip().splitlines()[-FAILURE_TAIL_LINES:]
    if tail:
        text += "\n\n" + "\n".join(tail)
    paths.output.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(paths.failure, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as out:
        out.write(text + "\n")


def describe(exc: BaseException) -> str:
    """One line for the failure file: the exception type and message."""
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__
