"""What a checkpoint holds, as a DCP state dict and back: the model (a tied weight once), its optimizer (whose
state a load fills without a step first), the LR schedule, the step, the RNG streams and the trainer's data
position."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.tensor import DTensor
from torch.optim.lr_scheduler import LRScheduler

from training.data import DistributedTokenLoader


def _same_memory(value: Any) -> tuple[Any, ...] | None:
    """What makes two tensors the very same one (the same storage, seen the same way), an empty one too (a rank's
    empty shard of a tied weight); None for what is not a tensor. A DTensor is its local shard."""
    local = value.to_local() if isinstance(value, DTensor) else value
    if not isinstance(local, torch.Tensor):
        return None
    storage = local.untyped_storage()._cdata  # the storage itself, which each view of it shares
    return (storage, local.storage_offset(), tuple(local.shape), local.stride(), local.dtype)


def _untied(model_sd: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """`model_sd` with each tensor once, and the key of each entry left out mapped to the earlier one it is the
    same tensor as: a tied weight (GPT-2's head is its token embedding, 9% of its checkpoint's bytes) is saved and
    loaded once."""
    kept: dict[str, Any] = {}
    tied: dict[str, str] = {}
    first: dict[tuple[Any, ...], str] = {}
    for key, value in model_sd.items():
        memory = _same_memory(value)
        if memory is not None and memory in first:
            tied[key] = first[memory]
            continue
        kept[key] = value
        if memory is not None:
            first[memory] = key
    return kept, tied


def _unfilled_optimizer_state(optimizer: torch.optim.Optimizer) -> bool:
    """Give an optimizer that has no state yet its state's tensors uninitialised, for a load to fill; whether it
    did. Else DCP's `get_state_dict` makes them with a step on zero gradients, which writes every byte of them and
    of the gradients (GPT-2 124M: 1.4 GiB of new memory) before the load overwrites them all; left unwritten, the
    load's copies touch that memory first, while the disk reads. Should the load fail, `load_latest` loads an older
    checkpoint over them, or refuses to start.

    The layout is the optimizer's own: a twin of the same type and options takes one step on two tensors per
    parameter, of its dtype, device and rank, one of size 1 along every dimension and one of sizes 2, 3, 4, ...
    A state tensor of each twin's shape is shaped like the parameter (`torch.empty_like`, in the state's dtype);
    one of the same shape in both is a copy of the first twin's; so is a value that is not a tensor. An optimizer
    whose state is otherwise, that has gradients already (DCP takes it to have no state), whose parameters need no
    gradient, that is not one of torch.optim's (whose steps are the process's own: no collective), or whose twin
    cannot step is left to DCP. The twin has none of the optimizer's own hooks; torch's global step hooks run for
    it, as they do for DCP's step."""
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    if (
        optimizer.state
        or not _of_torch_optim(type(optimizer))
        or not params
        or any(p.grad is not None or (isinstance(p, DTensor) and not p.dim()) for p in params)
    ):
        return False  # a DTensor of no dimension: its state would be DTensors, the twins' plain tensors
    pairs = {p: _twins(p) for p in params}
    groups = [
        {**group, "params": [t for p in group["params"] if p.requires_grad for t in pairs[p]]}
        for group in optimizer.param_groups
    ]
    shadow = type(optimizer).__new__(type(optimizer))
    shadow.__setstate__({"defaults": dict(optimizer.defaults), "state": defaultdict(dict), "param_groups": groups})
    shadow._warned_capturable_if_run_uncaptured = True  # as `Optimizer.__init__` sets it: no warning per resume
    try:
        shadow.step()
    except Exception:  # one that cannot step on tensors this small: DCP's step is on the real ones
        return False
    made: dict[torch.Tensor, dict[str, Any]] = {}
    for p, (one, two) in pairs.items():
        entries, of_two = shadow.state[one], shadow.state[two]
        if entries.keys() != of_two.keys():
            return False
        made[p] = {key: _unfilled_entry(p, value, of_two[key], one, two) for key, value in entries.items()}
        if any(value is None for value in made[p].values()):
            return False
    optimizer.state.update((p, entries) for p, entries in made.items() if entries)
    return bool(optimizer.state)


def _of_torch_optim(kind: type) -> bool:
    """Whether `kind` is one of torch.optim's optimizers (defined in torch.optim or a module of it)."""
    return kind.__module__ == "torch.optim" or kind.__module__.startswith("torch.optim.")


def _twins(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Zeros of `p`'s dtype, device and rank, of size 1 along every dimension and of sizes 2, 3, 4, ..., with zero
    gradients: a state of the second's shape grows with each dimension of the parameter, not with another one's."""
    shapes = ((1,) * p.dim(), tuple(range(2, 2 + p.dim())))
    pair = tuple(torch.zeros(shape, dtype=p.dtype, device=p.device, requires_grad=True) for shape in shapes)
    for twin in pair:
        twin.grad = torch.zeros_like(twin)
    return pair[0], pair[1]


def _unfilled_entry(p: torch.Tensor, value: Any, other: Any, one: torch.Tensor, two: torch.Tensor) -> Any:
    """The entry of `p`'s state whose values are `value` for the twin `one` and `other` for the twin `two`: a
    tensor shaped like `p`, a copy, or None when it is neither (and when `value` is None: either way the optimizer
    is left to DCP)."""
    if not isinstance(value, torch.Tensor):
        return value
    if p.dim() and value.shape == one.shape and other.shape == two.shape and value.device == one.device:
        return torch.empty_like(p, dtype=value.dtype)
    return value.clone() if value.shape == other.shape else None


@dataclass
class ModelState:
    """What every checkpoint of a model holds, as a DCP state dict (and back): the model, its optimizer, the LR
    schedule, the step and every rank's RNG streams; `_progress` and `_restore` add what a kind of training keeps
    besides (the trainer's data position, a script's own values). The model's part holds a tied weight once
    (`_untied`); `load_state_dict` gives it the model under each of its names."""

    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    """None: the model alone is saved or loaded (a load takes it from a checkpoint that holds an optimizer too)."""
    scheduler: LRScheduler | None
    rank: int
    seed: int
    step: int = 0
    _tied: dict[str, str] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def tokens_consumed(self) -> int:
        return 0

    def _progress(self) -> dict[str, Any]:
        return {}

    def _restore(self, progress: dict[str, Any]) -> None:
        pass

    def _rng(self) -> dict[str, Any]:
        """This rank's random streams."""
        rng = {"cpu": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state()
        return rng

    def _set_rng(self, rng: dict[str, Any]) -> None:
        torch.set_rng_state(rng["cpu"])
        if "cuda" in rng:
            torch.cuda.set_rng_state(rng["cuda"])

    def state_dict(self, *, with_rng: bool = True) -> dict[str, Any]:
        if self.optimizer is None:
            model_sd, optim_sd = get_model_state_dict(self.model), None
        else:
            model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        model_sd, self._tied = _untied(model_sd)
        progress = {"step": self.step, "tokens_consumed": self.tokens_consumed, **self._progress()}
        if self.scheduler is not None:
            progress["scheduler"] = self.scheduler.state_dict()
        state: dict[str, Any] = {"model": model_sd, "progress": json.dumps(progress)}
        if optim_sd is not None:
            state["optim"] = optim_sd
        if with_rng:
            # One key per rank: DCP deduplicates identical keys across ranks, these must all be kept.
            state["rng"] = {f"rank{self.rank}": self._rng()}
        return state

    def to_load_into(self, *, with_rng: bool = True) -> dict[str, Any]:
        """`state_dict`, for a load to fill: an optimizer without state gets it uninitialised
        (`_unfilled_optimizer_state`)."""
        if self.optimizer is not None:
            _unfilled_optimizer_state(self.optimizer)
        return self.state_dict(with_rng=with_rng)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self._tied is None:
            self.state_dict(with_rng=False)  # learns which of the model's weights are tied
        model_sd = dict(state["model"])
        for key, same in (self._tied or {}).items():
            model_sd.setdefault(key, model_sd[same])
        if self.optimizer is None:
            set_model_state_dict(self.model, model_sd)
        else:
            set_state_dict(self.model, self.optimizer, model_state_dict=model_sd, optim_state_dict=state["optim"])
        progress = json.loads(state["progress"])
        self.step = int(progress["step"])
        self._restore(progress)
        if self.scheduler is not None:
            self.scheduler.load_state_dict(progress["scheduler"])
        if "rng" in state:
            self._set_rng(state["rng"][f"rank{self.rank}"])
        else:
            # Another world size: rank r's old stream has no successor, so derive a fresh one.
            torch.manual_seed(self.seed + 1_000_003 * self.step + self.rank)


@dataclass
class TrainingState(ModelState):
    """The trainer's state: a model's, and the data loader's position."""

    loader: DistributedTokenLoader | None = None

    @property
    def tokens_consumed(self) -> int:
        assert self.loader is not None
        return self.loader.consumed * self.loader.samples.seq_len

    def _progress(self) -> dict[str, Any]:
        assert self.loader is not None
        return {"loader": self.loader.state_dict()}

    def _restore(self, progress: dict[str, Any]) -> None:
        assert self.loader is not None
        self.loader.load_state_dict(progress["loader"])
