"""`CheckpointManager`: saves (in the background or not), commits, prunes and resumes a run's checkpoints."""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from contract.config import CheckpointConfig
from contract.layout import MANIFEST, step_dir, step_of
from contract.ledger import Recorded
from contract.stored_checkpoints import DCP_METADATA, FORMAT_VERSION, Listed, Manifest, manifest_sha256
from training.checkpoint.integrity import _OWN_ERROR, CheckpointError, _manifest, _Problem, transient
from training.checkpoint.planners import _PieceSavePlanner, _WeightsOnlyPlanner
from training.checkpoint.reader import _SafeReader
from training.checkpoint.state import ModelState
from training.checkpoint.storage import (
    _remove_old,
    committed_steps,
    data_files,
    io_threads,
    remove_checkpoint,
    write_manifest,
    written_by,
)
from training.checkpoint.writer import _writer, file_entries
from training.distributed import DistEnv, new_group
from training.sagemaker_contract import describe

log = logging.getLogger(__name__)


LOAD_RETRY_SECONDS = (2.0, 10.0)
"""The waits before a checkpoint whose load failed with `TRANSIENT_ERRNOS` alone is loaded again: three tries."""


_NO_DIST_WARNING = "torch.distributed is disabled, unavailable or uninitialized"
"""How the warning DCP gives of every save and load run with ``no_dist`` begins."""


@contextmanager
def _alone(env: DistEnv) -> Iterator[bool]:
    """Whether DCP is to save or load without its collectives (``no_dist``): in a world of one process, where they
    would pickle its plans and results and send them to itself (a GPT-2 save spent 0.03-0.05 s of 0.7 s so,
    docs/BENCHMARKS.md). DCP's warning of it is silenced meanwhile; a larger world's warnings are left alone."""
    if env.world_size != 1:
        yield False
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NO_DIST_WARNING, category=UserWarning)
        yield True


@dataclass
class _Pending:
    step: int
    future: Future[Any]
    world_size: int
    tokens_consumed: int
    hashed: dict[str, Listed]
    started: float = field(default_factory=time.monotonic)


class CheckpointManager:
    """Saves (optionally in the background), commits, prunes and resumes checkpoints under ``root``."""

    def __init__(self, root: Path, env: DistEnv, cfg: CheckpointConfig, *, trusted: Recorded | None = None) -> None:
        """`trusted`: the run's ledger (contract/ledger.py); only the checkpoints it admits are loaded. None: no
        ledger (a run outside the pipeline), any intact checkpoint may be."""
        self.root, self.env, self.cfg, self.trusted = root, env, cfg, trusted
        self.committed: list[int] = []
        self.pending: _Pending | None = None
        self.last_save_time = time.monotonic()
        self._deleter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-prune")
        self._deletions: dict[Path, Future[None]] = {}  # of old checkpoints, by directory
        # Async saves run collectives from a background thread: they get their own group so they
        # never interleave with the main thread's collectives.
        self._async_group = new_group(backend="gloo") if cfg.async_save else None
        if env.is_local_main:
            root.mkdir(parents=True, exist_ok=True)

    # ---------------------------------------------------------------- saving

    def save(self, state: ModelState, *, blocking: bool = False) -> None:
        """Checkpoint ``state.step``; in async mode return once the state is staged (unless blocking)."""
        self.wait()
        step = state.step
        if step in self.committed:
            return
        directory = self.root / step_dir(step)
        if self.env.is_local_main and directory.exists():
            remove_checkpoint(directory)  # debris of an interrupted attempt at this same step
        dist.barrier(group=self.env.ctrl)
        started = time.monotonic()
        state_dict = state.state_dict()
        writer, hashed = _writer(directory)
        planner = _PieceSavePlanner()
        if self._async_group is not None and not blocking:
            response = dcp_async_save(
                state_dict, storage_writer=writer, planner=planner, process_group=self._async_group
            )
            # torch returns a Future, or (with some stagers) a response holding the upload's Future.
            future = response if isinstance(response, Future) else response.upload_completion
            self.pending = _Pending(step, future, self.env.world_size, state.tokens_consumed, hashed, started)
            log.info(
                "checkpoint %s: staged in %.2fs, writing in the background",
                step_dir(step),
                time.monotonic() - started,
            )
            return
        with _alone(self.env) as alone:
            metadata = dcp_save(
                state_dict, storage_writer=writer, planner=planner, process_group=self.env.ctrl, no_dist=alone
            )
        self._commit(
            step, metadata, world_size=self.env.world_size, tokens=state.tokens_consumed, hashed=hashed, started=started
        )

    def pending_done(self) -> bool:
        """Whether this rank's background save (if any) has finished writing."""
        return self.pending is None or self.pending.future.done()

    def wait(self) -> None:
        """Finish and commit the background save, if any (collective)."""
        if self.pending is None:
            return
        pending, self.pending = self.pending, None
        metadata = pending.future.result()
        self._commit(
            pending.step,
            metadata,
            world_size=pending.world_size,
            tokens=pending.tokens_consumed,
            hashed=pending.hashed,
            started=pending.started,
        )

    def _commit(
        self,
        step: int,
        metadata: Any,
        *,
        world_size: int,
        tokens: int,
        hashed: dict[str, Listed],
        started: float,
    ) -> None:
        directory = self.root / step_dir(step)
        error: str | None = None
        # Each process hashes the data files it wrote, as it wrote them (hosts do not share /opt/ml/checkpoints).
        own: dict[str, dict[str, Any]] | str
        try:
            if not isinstance(metadata, Metadata):
                raise CheckpointError(f"DCP returned {type(metadata).__name__}, not its Metadata")
            names = [n for n in data_files(metadata) if n.startswith(written_by(self.env.rank))]
            own = file_entries(directory, names + ([DCP_METADATA] if self.env.is_main else []), hashed)
        except Exception as exc:
            own = describe(exc)
        gathered: list[dict[str, dict[str, Any]] | str | None] = [None] * self.env.world_size
        dist.all_gather_object(gathered, own, group=self.env.ctrl)
        if self.env.is_main:
            try:
                files: dict[str, dict[str, Any]] = {}
                for rank, entries in enumerate(gathered):
                    if not isinstance(entries, dict):
                        raise CheckpointError(f"rank {rank} could not hash its files: {entries}")
                    files.update(entries)
                assert isinstance(metadata, Metadata)
                missing = sorted({*data_files(metadata), DCP_METADATA} - set(files))
                if missing:
                    raise CheckpointError(f"no process hashed {', '.join(missing)}")
                write_manifest(
                    directory,
                    {
                        "format": FORMAT_VERSION,
                        "step": step,
                        "world_size": world_size,
                        "tokens_consumed": tokens,
                        "files": files,
                        "torch_version": torch.__version__,
                        "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    },
                )
            except Exception as exc:  # every rank must learn of the failure, not just rank 0
                error = describe(exc)
        outcome: list[str | None] = [error]
        dist.broadcast_object_list(outcome, src=0, group=self.env.ctrl)
        if outcome[0] is not None:
            raise CheckpointError(f"checkpoint {step_dir(step)} could not be committed: {outcome[0]}")
        self.committed.append(step)
        self.last_save_time = time.monotonic()
        log.info("checkpoint %s committed in %.2fs", step_dir(step), time.monotonic() - started)
        self._prune()

    def _prune(self) -> None:
        """Keep the newest ``keep_last`` committed checkpoints; delete older ones and older debris."""
        keep = set(sorted(self.committed)[-self.cfg.keep_last :])
        newest = max(self.committed)
        self.committed = sorted(keep)
        # One process per host deletes: hosts do not share /opt/ml/checkpoints on SageMaker.
        if not self.env.is_local_main or not self.root.is_dir():
            return
        # Never touch anything newer than the newest commit: it may be a save in progress.
        for entry in self.root.iterdir():
            step = step_of(entry.name)
            if step is not None and step < newest and step not in keep and entry not in self._deletions:
                # In the background: a deletion can take as long as writing a checkpoint (a disk mounted with
                # `discard` trims every freed block as it is freed), and training need not wait for it.
                self._deletions[entry] = self._deleter.submit(_remove_old, entry)

    def wait_for_deletions(self) -> None:
        """Wait for the deletions `_prune` started, so that nothing else touches the directories meanwhile."""
        for deletion in self._deletions.values():
            deletion.result()
        self._deletions.clear()

    # ---------------------------------------------------------------- loading

    def _agree(self, local: _Problem | None) -> list[_Problem]:
        gathered: list[_Problem | None] = [None] * self.env.world_size
        dist.all_gather_object(gathered, local, group=self.env.ctrl)
        return [
            _Problem(f"rank {rank}: {problem.text}", problem.transient)
            for rank, problem in enumerate(gathered)
            if problem is not None
        ]

    def _recorded(self, steps: list[int]) -> list[int]:
        """Those of `steps` whose manifest the run's ledger holds (all of them without a ledger)."""
        if self.trusted is None:
            return steps
        kept = []
        for step in steps:
            try:
                data = (self.root / step_dir(step) / MANIFEST).read_bytes()
            except OSError:  # its load reads the manifest again, checks it against the ledger, and says why not
                kept.append(step)
                continue
            if self.trusted.admits(f"{step_dir(step)}/", manifest_sha256(data)):
                kept.append(step)
            else:
                log.warning("skipping checkpoint %s: the run's ledger does not record it", step_dir(step))
        return kept

    def _load(
        self, directory: Path, manifest: Manifest, state: ModelState, *, same_world: bool
    ) -> tuple[dict[str, Any], _Problem | None]:
        """Load the checkpoint in `directory` into a state dict of `state`'s own tensors (with its RNG streams when
        `same_world`); that state dict, and why it could not be loaded, or None."""
        reader = _SafeReader(directory, manifest)
        try:
            if same_world:  # each process reads the files it wrote: it starts reading them now
                own = [name for name in sorted(manifest.files) if name.startswith(written_by(self.env.rank))]
                problem = None
                try:
                    reader.read_ahead(own[: io_threads()])
                except Exception as exc:
                    problem = _Problem(f"{directory.name}: {describe(exc)}", transient(exc))
                # Every rank learns of a refusal before any enters DCP's collectives, which the others would wait in.
                if others := self._agree(problem):
                    passing = all(other.transient for other in others)  # as every rank's: all try again, or none
                    return {}, problem or _Problem(
                        f"{directory.name}: another rank refused its {DCP_METADATA}", passing
                    )
            template = state.to_load_into(with_rng=same_world)  # while those reads run
            try:
                with _alone(self.env) as alone:
                    dcp_load(
                        template,
                        storage_reader=reader,
                        planner=_WeightsOnlyPlanner(),
                        process_group=self.env.ctrl,
                        no_dist=alone,
                    )
            # DCP raises on every rank when any rank fails to read; its exception is a BaseException.
            except (Exception, CheckpointException) as exc:
                # DCP wraps the cause; its last line says what was wrong with the files, except for a refused
                # weights_only load, whose reason is the line naming the global.
                lines = [line.strip().removeprefix(_OWN_ERROR) for line in str(exc).strip().splitlines()]
                refused = [line for line in lines if "Unsupported global" in line]
                text = f"{directory.name}: {(refused or lines)[-1] if lines else describe(exc)}"
                return template, _Problem(text, transient(exc))
        finally:
            reader.close()
        return template, None

    def _load_tried(self, step: int, state: ModelState) -> tuple[dict[str, Any], Manifest | None, list[_Problem]]:
        """Load checkpoint `step` into `state`'s tensors (`_load`), and again after each of `LOAD_RETRY_SECONDS`
        while every rank's errors may pass; the state dict, the manifest, and every rank's errors in the last try
        (none: it loaded)."""
        directory = self.root / step_dir(step)
        for attempt, wait in enumerate((*LOAD_RETRY_SECONDS, None), start=1):
            template: dict[str, Any] = {}
            manifest = _manifest(directory, self.trusted)
            errors = self._agree(manifest if isinstance(manifest, _Problem) else None)
            if not errors:
                assert isinstance(manifest, Manifest)
                same_world = manifest.world_size == self.env.world_size
                template, error = self._load(directory, manifest, state, same_world=same_world)
                errors = self._agree(error)
            if not errors or wait is None or not all(error.transient for error in errors):
                break
            if self.env.is_main:
                log.warning(
                    "checkpoint %s: %s; loading it again in %.0f s (try %d of %d failed with errors that may pass)",
                    step_dir(step),
                    "; ".join(error.text for error in errors),
                    wait,
                    attempt,
                    len(LOAD_RETRY_SECONDS) + 1,
                )
            time.sleep(wait)
        return template, None if isinstance(manifest, _Problem) else manifest, errors

    def load_latest(self, state: ModelState) -> int | None:
        """Restore the newest checkpoint that every rank can load; None when there is none to resume."""
        if not self.cfg.resume:
            return None
        self.wait_for_deletions()
        listing: list[list[int]] = [self._recorded(committed_steps(self.root)) if self.env.is_main else []]
        dist.broadcast_object_list(listing, src=0, group=self.env.ctrl)
        candidates = listing[0]
        problems: list[str] = []
        for step in candidates:
            template, manifest, errors = self._load_tried(step, state)
            if errors:
                problems.extend(error.text for error in errors)
                if self.env.is_main:
                    log.warning("skipping checkpoint %s: %s", step_dir(step), "; ".join(e.text for e in errors))
                continue
            assert manifest is not None
            same_world = manifest.world_size == self.env.world_size
            state.load_state_dict(template)
            if not same_world:
                log.warning(
                    "checkpoint %s was written by %d processes, resuming on %d: model and optimizer "
                    "resharded, data position kept, RNG streams reseeded",
                    step_dir(step),
                    manifest.world_size,
                    self.env.world_size,
                )
            self.committed = sorted(s for s in candidates if s <= step)
            if self.env.is_main:
                for entry in sorted(self.root.iterdir()):
                    later = step_of(entry.name)
                    if later is not None and later > step and not (entry / MANIFEST).exists():
                        log.warning("ignoring incomplete checkpoint %s (no %s)", entry.name, MANIFEST)
            log.info("resumed from checkpoint %s (%d tokens consumed)", step_dir(step), state.tokens_consumed)
            return step
        if candidates:
            raise CheckpointError(
                f"none of the {len(candidates)} checkpoints in {self.root} can be loaded "
                f"({'; '.join(problems[:4])}); fix or delete them, or set checkpoint.resume=false"
            )
        return None

    def close(self, *, commit: bool = True) -> None:
        """Commit a background save, if any (unless not `commit`: the run is failing, and other ranks may not
        take part), and finish deleting old checkpoints."""
        try:
            if commit:
                self.wait()
        finally:
            self.wait_for_deletions()
            self._deleter.shutdown()
