"""Fine-tuning a model folder: the built-in model made from its config, its weights read after sharding (each
process only its part), LoRA adapters where asked, and the fine-tuned model written back as a model folder.

The model is built on the meta device (no memory, no random initialisation), adapted, sharded (FSDP2) or not,
then given real storage on the process's device (on the CPU, a whole weight's storage is the buffer its file's
bytes are read into) and filled from the folder's files (training/hf_weights.py).
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from contract import model_folder as mf
from contract.config import ConfigError, JobConfig
from contract.distributions import distribution
from training import hf_weights, lora
from training.models.build import ARCHS
from training.parallel.materialize import share_again, shared_parameters
from training.sagemaker_contract import Paths

log = logging.getLogger(__name__)


_INITIALISERS = frozenset(
    {
        *(getattr(nn.init, name) for name in ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_")),
        *(getattr(nn.init, f"{kind}_{law}_") for kind in ("xavier", "kaiming") for law in ("uniform", "normal")),
        torch.Tensor.uniform_,
        torch.Tensor.normal_,
        torch.Tensor.zero_,
        torch.Tensor.fill_,
    }
)


@contextmanager
def _without_garbage_collection() -> Iterator[None]:
    """Python's cyclic garbage collector paused: a load makes thousands of objects (modules, parameters), and a
    full collection they set off took 0.2 s of a 0.15-0.4 s load on the benchmark VM (docs/BENCHMARKS.md); the
    next collection after it finds what this one would have."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class _NoInitialisation(TorchFunctionMode):
    """Torch's own initialisation of the modules' parameters (nn.Linear's and nn.Embedding's reset_parameters)
    skipped: on the meta device it writes nothing, yet took half of building GPT-2 there (25 ms of 50)."""

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if func in _INITIALISERS:
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


def folder_of(init_from: str, paths: Paths) -> Path:
    """model.init_from as a folder: an absolute path, else the input channel of that name."""
    path = Path(init_from)
    return path if path.is_absolute() else paths.channel(init_from)


@dataclass
class FineTuning:
    """What the trainer keeps of the model folder it fine-tunes: the base model and the adapters."""

    base: hf_weights.BaseModel
    cfg: JobConfig
    adapters: dict[str, lora.LoRALinear]
    prefetch: hf_weights.Prefetch | None = None

    @classmethod
    @_without_garbage_collection()
    def build(cls, cfg: JobConfig, paths: Paths, device: torch.device | None = None) -> tuple[FineTuning, nn.Module]:
        """The base model checked and the built-in model for it on the meta device; ConfigError if it cannot run.
        `device`: where the process will hold the model; on the CPU, unsharded (DDP, a world of one), the weights'
        reads start before the model is built."""
        try:
            base = hf_weights.open_base_model(folder_of(cfg.model.init_from, paths), dropout=cfg.model.dropout)
        except mf.ModelFolderError as exc:
            raise ConfigError(f"hyperparameter model.init_from={cfg.model.init_from!r} is invalid: {exc}") from exc
        if cfg.seq_len > base.args.max_seq_len:
            raise ConfigError(
                f"hyperparameter data.seq_len={cfg.seq_len} is invalid: the model folder's limit is "
                f"{base.args.max_seq_len} tokens (config.json); use at most that"
            )
        if problems := cfg.split_problems(base.args):
            raise ConfigError(f"hyperparameters invalid for the model folder of model.init_from: {'; '.join(problems)}")
        whole = not distribution(cfg.distribution).shards_parameters
        prefetch = hf_weights.Prefetch(base) if device is not None and device.type == "cpu" and whole else None
        try:
            with torch.device("meta"), _NoInitialisation():
                model = ARCHS[base.args.arch](base.args, init=False)  # every weight is read from the folder
            adapters = lora.apply(model, cfg.lora, base.args) if cfg.lora.rank else {}
        except ValueError as exc:
            if prefetch is not None:
                prefetch.wait()
            raise ConfigError(f"hyperparameter {exc}") from exc
        return cls(base, cfg, adapters, prefetch), model

    @_without_garbage_collection()
    def materialize(self, parts: list[nn.Module], device: torch.device) -> None:
        """Real storage on `device` for this process's parts of the model (the whole model, or its pipeline
        stages; sharded or not), filled from the folder; adapters initialised."""
        for part in parts:
            shared = shared_parameters(part)
            placed = hf_weights.place_in_read_buffers(part, self.base, device, self.prefetch)
            self.prefetch = None  # its reads are the first part's
            hf_weights.empty_rest(part, device, placed)
            share_again(shared)  # to_empty gives each module a new parameter: tie again what was tied
            # A pipeline stage holds some of the folder's weights; otherwise every one must be loaded.
            slots = hf_weights.parameter_slots(part)
            filled = hf_weights.load_weights(slots, self.base, some=self.cfg.parallel.pp > 1, placed=placed)
            adapters = {f"{name}.{attr}" for name in self.adapters for attr in ("lora_a", "lora_b")}
            if left := sorted(set(slots) - filled - adapters):
                raise RuntimeError(f"the model folder fills no value of {', '.join(left)}: they would hold no value")
            hf_weights.set_rope(part, self.base)
        lora.initialise(self.adapters, self.cfg.train.seed)

    def export(self, full: Mapping[str, Any], model_dir: Path) -> Path:
        """The fine-tuned model folder (adapters merged) and, with adapters, the adapter: rank 0, once, at the end."""
        weights = lora.merged(full, list(self.adapters), self.cfg.lora) if self.adapters else full
        folder = hf_weights.write_model_folder(model_dir / mf.FINE_TUNED_FOLDER, weights, self.base)
        if self.adapters:
            name = str(self.base.config.get("_name_or_path") or self.base.path.name)
            chosen = mf.lora_targets(self.base.args, self.cfg.lora.target_modules)
            lora.write_adapter(
                model_dir / mf.ADAPTER_FOLDER, full, chosen, self.cfg.lora, self.base.args, base_model=name
            )
        return folder
