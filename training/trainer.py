"""The training loop: build everything from the config, train, checkpoint, evaluate, export."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import json
import logging
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from contract import goodput, metrics
from contract.config import ConfigError, JobConfig, packed_rows_problem
from contract.distributions import distribution
from contract.hang import StepReport
from contract.layout import LEDGER_CHANNEL, step_dir
from contract.ledger import delivered
from contract.mesh import resolve_layout
from contract.sft import RecordError
from training import distributed, host_memory, sft
from training.checkpoint import CheckpointManager, TrainingState
from training.data import DistributedTokenLoader, Samples, TokenSamples, validation_batches
from training.export import export_model
from training.finetune import FineTuning, folder_of
from training.flops import mfu, peak_flops
from training.models.build import model_builder, model_flops_per_token
from training.optim import build_optimizer, build_scheduler
from training.parallel.pipeline import IGNORE_INDEX
from training.parallelize import Options, Weights, parallelize
from training.preflight import Preflight
from training.sagemaker_contract import DataFiles, Paths, find_data_files, read_resource_config
from training.signals import StopRequest
from training.stragglers import StepTimer, Straggler, StragglerDetector, StragglerError, share_and_judge

log = logging.getLogger(__name__)


class DataRangeError(ValueError):
    """A token id does not fit the model's vocabulary."""


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite."""


class Trainer:
    """Owns the process group, model, optimizer, data and checkpoints of one training job."""

    def __init__(
        self,
        cfg: JobConfig,
        paths: Paths,
        stop: StopRequest,
        preflight: Preflight | None = None,
        *,
        started: float | None = None,
    ) -> None:
        """`started`: when this worker started (time.monotonic()), from which its phases are counted."""
        self.cfg, self.paths, self.stop = cfg, paths, stop
        self.preflight = preflight
        self.clock = metrics.PhaseClock(started)
        # Rank 0 keeps this start's progress record (contract/goodput.py) from the pre-flight check on.
        self.progress: goodput.ProgressWriter | None = None
        self.rework_until = 0
        self._resources = contextlib.ExitStack()
        try:
            self._build()
        except BaseException:
            self._final_progress()
            self._resources.close()
            raise

    def _build(self) -> None:
        host_memory.keep_freed_memory()  # before the model and its first step allocate
        self._init_process()
        self.param_dtype = self._compute_dtype()
        files = find_data_files(self.paths)
        self.seq_len = self.cfg.seq_len
        self.layout = resolve_layout(self.cfg, self.env.world_size, self.env.local_world_size)
        self.grad_accum = self.cfg.train.grad_accum_steps(self.layout.dp)
        self.global_batch = self.cfg.train.global_batch(self.layout.dp)
        n_params = self._build_model()
        self._build_optimizer()
        loader = self._build_data(files)
        self._build_checkpoint(loader)
        self._build_metrics()
        if self.env.is_main:
            self._log_setup(n_params, loader.samples.n_samples)
        # What is built lives until the run ends (some 300,000 objects for GPT-2): out of the garbage collector's
        # sight, its full collections, which a checkpoint save's allocations trigger, no longer walk it (0.1-0.3 s
        # of every other save on the benchmark VM).
        if gc.get_freeze_count() == 0:  # not already done by another Trainer in this process (tests)
            gc.collect()
            gc.freeze()
            self._resources.callback(gc.unfreeze)

    def _init_process(self) -> None:
        """The process group and determinism, then the config log and optional outputs."""
        cfg = self.cfg
        self.host = read_resource_config(self.paths).current_host  # as the cluster names it (algo-1, ...)
        if self.preflight is not None:
            self.preflight.check_devices(self.host, distributed.host_rank())
        self.env = env = distributed.init_distributed(
            distribution=cfg.distribution,
            deterministic=cfg.train.deterministic,
            timeout_minutes=cfg.parallel.timeout_minutes,
        )
        self._resources.callback(distributed.destroy)
        if env.is_main:
            self.progress = goodput.ProgressWriter(
                self.paths.checkpoints, job=goodput.job_name(os.environ), started=self.clock.started, first_step=0
            )
        if self.preflight is not None:
            # In the training's own process group, before anything is built or loaded (training/preflight.py).
            with self.clock.phase("preflight"):
                self.preflight.run(
                    self.host, rank=env.rank, ranks=env.world_size, local_rank=env.local_rank, group=env.ctrl
                )
        distributed.set_determinism(seed=cfg.train.seed, deterministic=cfg.train.deterministic, device=env.device)
        if env.is_main:
            log.info("config %s", json.dumps(cfg.to_dict(), sort_keys=True))
        # Optional outputs fail here, on every rank, before any expensive work.
        self.tensorboard = self._tensorboard() if cfg.metrics.tensorboard else None

    def _build_model(self) -> int:
        """Build and parallelise the model; returns its parameter count."""
        cfg, env = self.cfg, self.env
        fsdp = distribution(cfg.distribution).shards_parameters
        self.finetune: FineTuning | None = None
        weights: Weights | None = None
        if cfg.model.init_from:
            # Built on the meta device; its weights are read once it is sharded (training/finetune.py).
            self.finetune, meta_model = FineTuning.build(cfg, self.paths, env.device)
            self.model_args, build = self.finetune.base.args, lambda: meta_model
            weights = functools.partial(self.finetune.materialize, device=env.device)
        else:
            build, self.model_args = model_builder(cfg.model, code_dir=self.paths.channel("code"))
        self.vocab_size = self.model_args.vocab_size
        self.parallel = parallelize(
            build,
            arch=None if cfg.model.factory else self.model_args.arch,
            layout=self.layout,
            opts=Options(
                fsdp=fsdp,
                param_dtype=self.param_dtype,
                activation_checkpointing=cfg.parallel.activation_checkpointing,
                compile=cfg.parallel.compile,
                reshard_after_forward=cfg.parallel.reshard_after_forward,
            ),
            device=env.device,
            weights=weights,
        )
        self.model = self.parallel.module
        whole = self.parallel.whole
        self.flops_per_token = model_flops_per_token(
            whole, self.model_args, self.seq_len, custom=bool(cfg.model.factory)
        )
        return sum(p.numel() for p in whole.parameters())

    def _build_optimizer(self) -> None:
        self.optimizer = build_optimizer(self.model, self.cfg.optim)
        self.scheduler = build_scheduler(self.optimizer, self.cfg.optim, self.cfg.train.max_steps)

    def _build_data(self, files: DataFiles) -> DistributedTokenLoader:
        """The training loader and this rank's fixed validation batches."""
        cfg, env = self.cfg, self.env
        self.packed = files.sft
        # Each data-parallel process reads its share; the processes of one tensor or pipeline group read the same.
        data_rank, data_world = self.layout.dp_rank(env.rank), self.layout.dp
        loader = DistributedTokenLoader(
            self._samples(files.train, shifted=cfg.data.shift_windows),
            micro_batch=cfg.train.micro_batch_size,
            rank=data_rank,
            world_size=data_world,
            seed=cfg.train.seed,
            shuffle=cfg.data.shuffle,
        )
        self.val_batches: list[tuple[npt.NDArray[np.int64], int]] = []
        self.periodic_val_batches: list[tuple[npt.NDArray[np.int64], int]] = []
        if files.validation:
            validation = self._samples(files.validation, shifted=False)
            shares = {"micro_batch": cfg.train.micro_batch_size, "rank": data_rank, "world_size": data_world}
            self.val_batches = validation_batches(validation, **shares, max_sequences=cfg.eval.max_sequences)
            self.periodic_val_batches = self.val_batches
            if cfg.eval.max_batches:
                self.periodic_val_batches = validation_batches(
                    validation,
                    **shares,
                    max_sequences=cfg.eval.max_sequences,
                    sample_batches=cfg.eval.max_batches,
                    seed=cfg.train.seed,
                )
        if not self.val_batches and env.is_main:
            log.warning("no validation data (channel 'validation' or *val*.bin in 'train'): val_loss not reported")
        return loader

    def _samples(self, files: tuple[Path, ...], *, shifted: bool) -> Samples:
        """Token shards' windows, or fine-tuning examples packed into rows (training/sft.py)."""
        if not self.packed:
            return TokenSamples(files, self.seq_len, shifted=shifted)
        if self.cfg.model.factory:
            raise ConfigError("fine-tuning data needs a built-in architecture: drop model.factory")
        if (pipelined := packed_rows_problem(self.layout.pp)) is not None:
            raise ConfigError(f"fine-tuning data: {pipelined}")
        folder = folder_of(self.cfg.model.init_from, self.paths) if self.cfg.model.init_from else None
        try:
            samples = sft.PackedSamples(sft.load_examples(files, folder), self.seq_len)
        except (sft.ChatTemplateError, RecordError) as exc:
            raise ConfigError(f"fine-tuning data: {exc}") from exc
        if samples.cut and self.env.is_main:
            log.warning("%d examples are longer than seq_len + 1 = %d tokens: cut to it", samples.cut, self.seq_len + 1)
        return samples

    def _build_checkpoint(self, loader: DistributedTokenLoader) -> None:
        """The resumable state, restored from the latest committed checkpoint if there is one."""
        cfg, env = self.cfg, self.env
        # Dropout streams differ per rank; a same-size resume restores them from the checkpoint.
        torch.manual_seed(cfg.train.seed + 1 + env.rank)
        self.loader = loader
        self.state = TrainingState(
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            loader=loader,
            rank=env.rank,
            seed=cfg.train.seed,
        )
        self.checkpoints = CheckpointManager(
            self.paths.checkpoints,
            env,
            cfg.checkpoint,
            trusted=delivered(self.paths.channel(LEDGER_CHANNEL), job=goodput.job_name(os.environ)),
        )
        with self.clock.phase("checkpoint_load"):
            self.checkpoints.load_latest(self.state)
        self.start_step = self.state.step
        # The steps an earlier start of the run already took, up to the furthest its records show, are rework.
        if self.progress is not None:
            self.progress.record.first_step = self.progress.record.step = self.start_step
            records = goodput.local_records(self.paths.checkpoints)
            self.rework_until = goodput.furthest_step(records, besides=self.progress.path)
            if self.rework_until > self.start_step:
                log.info("steps %d-%d were taken before: counted as rework", self.start_step + 1, self.rework_until)

    def _build_metrics(self) -> None:
        """The device's peak FLOP/s for MFU, the profiler (which starts at ``start_step``) and, with peers,
        the straggler check (training/stragglers.py)."""
        cfg, env = self.cfg, self.env
        self.stragglers: StragglerDetector | None = None
        self.replace_hosts: list[Straggler] = []
        checked = cfg.stragglers.action != "off" and env.world_size > 1
        self.step_timer = StepTimer(torch, env.device, keep=cfg.stragglers.interval_steps if checked else 0)
        if checked:
            hosts: list[Any] = [None] * env.world_size
            dist.all_gather_object(hosts, self.host, group=env.ctrl)
            self.stragglers = StragglerDetector(hosts, cfg.stragglers.threshold, cfg.stragglers.steps)
        self.peak_flops = cfg.metrics.peak_tflops * 1e12 or (
            peak_flops(torch.cuda.get_device_name(env.device)) if env.device.type == "cuda" else None
        )
        self.profiler = self._profiler() if cfg.metrics.profile else None

    def _log_setup(self, n_params: int, n_samples: int) -> None:
        cfg = self.cfg
        log.info(
            "model %s: %.2fM parameters, %.3g FLOPs/token; layout %s; %d data-parallel processes x %d sequences x "
            "%d accumulation = %d sequences of %d tokens per step; %d training samples; starting at step %d",
            cfg.model.factory or (f"from {cfg.model.init_from}" if cfg.model.init_from else cfg.model.name),
            n_params / 1e6,
            self.flops_per_token,
            self.layout.describe(),
            self.layout.dp,
            cfg.train.micro_batch_size,
            self.grad_accum,
            self.global_batch,
            self.seq_len,
            n_samples,
            self.start_step,
        )

    def _compute_dtype(self) -> torch.dtype:
        choice = self.cfg.train.dtype
        if choice == "auto":
            choice = "bf16" if self.env.device.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"
        return torch.bfloat16 if choice == "bf16" else torch.float32

    def _tensorboard(self) -> Any:
        try:
            from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415  (optional dependency)
        except ImportError as exc:
            raise ConfigError(
                "hyperparameter metrics.tensorboard=true is invalid here: the image has no 'tensorboard' "
                "package; install it or set metrics.tensorboard=false"
            ) from exc
        if not self.env.is_main:
            return None
        writer = SummaryWriter(log_dir=str(self.paths.output / "tensorboard"))
        self._resources.callback(writer.close)
        return writer

    def _profiler(self) -> torch.profiler.profile:
        m = self.cfg.metrics
        delay = max(0, m.profile_start_step - 1 - self.start_step)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.env.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        profiler = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(
                wait=max(0, delay - 1), warmup=min(1, delay), active=m.profile_steps, repeat=1
            ),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(
                str(self.paths.output / "data" / "profile"), worker_name=f"rank{self.env.rank}"
            ),
        )
        profiler.start()
        self._resources.callback(profiler.stop)
        return profiler

    # ------------------------------------------------------------------ the loop

    def train(self) -> bool:
        """Train to ``max_steps``; False when a stop signal ended it early (after a checkpoint)."""
        cfg = self.cfg
        max_steps = cfg.train.max_steps
        tokens_per_step = self.global_batch * self.seq_len
        window_start, window_steps = time.perf_counter(), 0
        self.parallel.train()
        self.clock.enter("rework" if self.state.step < self.rework_until else "train")
        report_step = StepReport.from_env(os.environ, self.env.rank)  # for the launcher's hang check
        report_step(self.state.step)
        while self.state.step < max_steps:
            step = self.state.step + 1
            if step == self.rework_until + 1:
                self.clock.enter("train")
            lr = float(self.scheduler.get_last_lr()[0])
            loss, grad_norm = self._train_step()
            self.scheduler.step()
            self.state.step = step
            report_step(step)
            window_steps += 1
            if self.profiler is not None:
                self.profiler.step()
            stop, save_due_by_time, save_busy = self._agree()
            if self.stragglers is not None and step % cfg.stragglers.interval_steps == 0:
                stop = self._check_stragglers(step) or stop
            if self.checkpoints.pending is not None and not save_busy:
                with self.clock.phase("checkpoint"):
                    self.checkpoints.wait()

            interval = cfg.checkpoint.interval_steps
            save = stop or save_due_by_time or bool(interval and step % interval == 0) or step == max_steps
            # Saving steps are logged too: the finite-loss check runs before any state is written.
            if step % cfg.metrics.log_interval == 0 or step == 1 or save:
                # The window ends once the host has read the step's loss and norm, i.e. once the device's work
                # is done (on a GPU, the steps before are only queued); the logging itself falls in the next
                # window, as every other cost of a step does.
                loss_value, norm = self._mean_over_ranks(loss), float(grad_norm.item())
                now = time.perf_counter()
                self._log_step(step, loss_value, lr, norm, window_steps * tokens_per_step / (now - window_start))
                window_start, window_steps = now, 0
            if cfg.eval.interval_steps and step % cfg.eval.interval_steps == 0 and step < max_steps:
                self._log_validation(step, self.evaluate(self.periodic_val_batches))
                window_start = time.perf_counter()
            if save:
                with self.clock.phase("checkpoint"):
                    self.checkpoints.save(self.state, blocking=stop or step == max_steps)
                self._log_phases(step)
                window_start = time.perf_counter()
            if stop:
                if self.replace_hosts:
                    raise StragglerError(
                        "; ".join(s.describe() for s in self.replace_hosts)
                        + f"; checkpoint {step_dir(step)} is committed: replace the host (stragglers.action=replace)"
                    )
                if self.env.is_main:
                    log.info("stopped by signal at step %d: checkpoint %s is committed", step, step_dir(step))
                return False
        self._finish()
        self._log_phases(self.state.step)
        return True

    def _train_step(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step over ``grad_accum`` micro-batches; returns (mean loss, grad norm) tensors."""
        loss_sum = torch.zeros((), device=self.env.device)
        for micro in range(self.grad_accum):
            last = micro == self.grad_accum - 1
            self.step_timer.start()  # this rank's own compute: data and forward hold no collective under DDP
            x_BT, y_BT, doc_BT = self._to_device(self.loader.next_batch())
            with self._grad_sync(last):
                loss = self.parallel.forward_backward(x_BT, y_BT, 1 / self.grad_accum, self.step_timer.stop, doc_BT)
            if loss is not None:
                loss_sum += loss
        grad_norm = self.parallel.clip_grad_norm(self.cfg.train.max_grad_norm or math.inf)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step_timer.end_step()
        return loss_sum / self.grad_accum, grad_norm

    def _to_device(self, rows: npt.NDArray[np.int64]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(inputs, targets, document ids or None) of a batch of token windows or packed rows."""
        top = int(rows[:, 0].max() if self.packed else rows.max())
        if top >= self.vocab_size:
            raise DataRangeError(
                f"token id {top} does not fit model.vocab_size={self.vocab_size}: set model.vocab_size to at "
                "least the tokenizer's vocabulary (50304 for GPT-2 BPE, 257 for bytes)"
            )
        batch = torch.from_numpy(rows)
        if self.env.device.type == "cuda":
            batch = batch.pin_memory().to(self.env.device, non_blocking=True)
        if self.packed:
            x_BT, y_BT, doc_BT = sft.targets(batch)
            return x_BT, y_BT, doc_BT
        return batch[:, :-1], batch[:, 1:], None

    @contextlib.contextmanager
    def _grad_sync(self, enabled: bool) -> Iterator[None]:
        # Gradient accumulation: reduce across ranks only on the last micro-batch.
        if isinstance(self.model, DistributedDataParallel):
            with contextlib.nullcontext() if enabled else self.model.no_sync():
                yield
            return
        set_sync = getattr(self.model, "set_requires_gradient_sync", None)
        if set_sync is not None:
            set_sync(enabled)
        yield

    def _agree(self) -> tuple[bool, bool, bool]:
        """(stop requested, time-based save due, background save busy) on any rank, agreed by all ranks."""
        interval = self.cfg.checkpoint.interval_minutes * 60
        due = bool(interval) and time.monotonic() - self.checkpoints.last_save_time >= interval
        flags = torch.tensor(
            [self.stop.requested, due and self.env.is_main, not self.checkpoints.pending_done()],
            dtype=torch.int64,
        )
        self._all_reduce(flags, op=dist.ReduceOp.MAX, group=self.env.ctrl)
        stop, due_any, busy = (bool(v) for v in flags.tolist())
        return stop, due_any, busy

    def _check_stragglers(self, step: int) -> bool:
        """Share the window's step times (one all-gather over the gloo group) and judge them, the same on
        every rank; True when `stragglers.action=replace` must stop training at this step."""
        assert self.stragglers is not None
        window = self.cfg.stragglers.interval_steps
        found = share_and_judge(torch, self.step_timer, self.stragglers, step=step, window=window, group=self.env.ctrl)
        if self.env.is_main:
            for straggler in found:
                log.warning(straggler.log_line())
            line = metrics.format_stragglers_line(
                step=step, hosts=self.stragglers.stragglers, slowdown=self.stragglers.slowdown
            )
            log.info(line)
        # At the last step training is done: a new cluster would only export the model.
        if found and self.cfg.stragglers.action == "replace" and step < self.cfg.train.max_steps:
            self.replace_hosts = found
            return True
        return False

    def _all_reduce(
        self, tensor: torch.Tensor, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM, group: Any = None
    ) -> None:
        # A world of one has nothing to reduce: the loop's per-step agreements then cost no collective.
        if self.env.world_size > 1:
            dist.all_reduce(tensor, op=op, group=group)

    # ------------------------------------------------------------------ metrics

    def _mean_over_ranks(self, value: torch.Tensor) -> float:
        """The mean of `value` over the ranks that compute the loss (under a pipeline, its last stage's)."""
        total = torch.stack([value.detach() * self.parallel.has_loss, torch.tensor(float(self.parallel.has_loss))])
        self._all_reduce(total)
        return float(total[0].item()) / float(total[1].item())

    def _log_step(self, step: int, loss_value: float, lr: float, norm: float, tps: float) -> None:
        """`loss_value`: the step's loss averaged over the ranks; `norm`: its gradient norm."""
        if not math.isfinite(loss_value):
            raise NonFiniteLossError(
                f"loss is {loss_value} at step {step}: lower optim.lr, raise optim.warmup_steps, or keep "
                "train.max_grad_norm > 0"
            )
        utilisation = None
        if self.peak_flops:
            utilisation = mfu(
                tokens_per_sec=tps,
                flops_per_token=self.flops_per_token,
                peak_flops_per_device=self.peak_flops,
                devices=self.env.world_size,
            )
        if self.env.is_main:
            log.info(
                metrics.format_train_line(
                    step=step, loss=loss_value, lr=lr, grad_norm=norm, tokens_per_sec=tps, mfu=utilisation
                )
            )
            self._record_progress(step, self.clock.totals(), due_only=True)
            if self.tensorboard is not None:
                for name, value in (
                    ("loss", loss_value),
                    ("lr", lr),
                    ("grad_norm", norm),
                    ("tokens_per_sec", tps),
                ):
                    self.tensorboard.add_scalar(f"train/{name}", value, step)
                if utilisation is not None:
                    self.tensorboard.add_scalar("train/mfu", utilisation, step)

    def _log_validation(self, step: int, val_loss: float | None) -> None:
        if val_loss is None or not self.env.is_main:
            return
        log.info(metrics.format_validation_line(step=step, val_loss=val_loss))
        if self.tensorboard is not None:
            self.tensorboard.add_scalar("validation/loss", val_loss, step)

    def _log_phases(self, step: int) -> None:
        """Where this worker's time went so far (rank 0's): at every checkpoint and at the end."""
        if self.env.is_main:
            totals = self.clock.totals()
            log.info(metrics.format_phases_line(step=step, seconds=totals))
            self._record_progress(step, totals)

    def _final_progress(self) -> None:
        """The record's last word as this start ends, whether it trained to the end, stopped or failed."""
        if self.progress is None:
            return
        try:
            state = getattr(self, "state", None)
            self._record_progress(state.step if state is not None else self.progress.record.step, self.clock.totals())
        except Exception:  # the start is ending, perhaps with an error of its own: never mask it
            log.exception("progress record %s not written", self.progress.path)

    def _record_progress(self, step: int, phases: dict[str, float], *, due_only: bool = False) -> None:
        """Rank 0's progress record; a record that cannot be written is logged, never fails training."""
        if self.progress is None:
            return
        try:
            self.progress.write(step, phases, due_only=due_only)
        except OSError as exc:
            log.warning("progress record %s not written: %s", self.progress.path, exc)

    @torch.no_grad()
    def evaluate(self, batches: list[tuple[npt.NDArray[np.int64], int]] | None = None) -> float | None:
        """Token-weighted mean loss over ``batches`` (default: the whole fixed validation set), or None
        without validation data."""
        batches = self.val_batches if batches is None else batches
        if not batches:
            return None
        with self.clock.phase("eval"):
            return self._evaluate(batches)

    def _evaluate(self, batches: list[tuple[npt.NDArray[np.int64], int]]) -> float:
        self.parallel.train(False)
        totals = torch.zeros(2, dtype=torch.float64, device=self.env.device)
        for tokens, valid in batches:
            x_BT, y_BT, doc_BT = self._to_device(tokens)
            y_BT = y_BT.clone()
            y_BT[valid:] = IGNORE_INDEX  # padding rows: every rank runs as many batches, they count in no loss
            loss_sum = self.parallel.loss_sum(x_BT, y_BT, doc_BT)
            if loss_sum is not None:
                totals[0] += loss_sum
                totals[1] += (y_BT != IGNORE_INDEX).sum()
        self._all_reduce(totals)
        self.parallel.train()
        return float(totals[0].item() / totals[1].item())

    # ------------------------------------------------------------------ the end

    def _finish(self) -> None:
        step = self.state.step
        val_loss = self.evaluate()
        self._log_validation(step, val_loss)
        self.clock.enter("export")
        # Every rank takes part in gathering the full weights; only rank 0 writes them.
        full = self.parallel.full_state_dict(self.env.ctrl)
        if self.env.is_main:
            config = {
                "architecture": self.cfg.model.factory or self.model_args.arch,
                "model_args": dataclasses.asdict(self.model_args),
                "job_config": self.cfg.to_dict(),
                "step": step,
                "tokens_consumed": self.state.tokens_consumed,
                "metrics": {"validation:loss": val_loss},
                "torch_version": torch.__version__,
            }
            path = export_model(self.paths.model, full, config)
            log.info("model written to %s", path)
            if self.finetune is not None:
                log.info("model folder written to %s", self.finetune.export(full, self.paths.model))
        dist.barrier(group=self.env.ctrl)

    def close(self, *, commit_pending: bool = True) -> None:
        """Commit a background save (unless failing), then release profiler, TensorBoard, process group."""
        try:
            self.checkpoints.close(commit=commit_pending)
        finally:
            self._final_progress()
            self._resources.close()
