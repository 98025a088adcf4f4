"""Straggler detection: a host whose ranks compute their steps markedly slower than the others'.

Every rank times its own compute of each step: the data and forward pass of every micro-batch, which
under DDP hold no collective, so a rank's time is its own and not the wait for the slowest (on a GPU
with CUDA events, read only once they have completed: no host sync). Every `stragglers.interval_steps`
steps the ranks share the window's times in one small all-gather over the gloo group; every rank then
judges the same matrix the same way: a host is slow at a step when its slowest rank took at least
``1 + stragglers.threshold`` times the median of the other hosts' ranks, and a straggler when it has
been slow for `stragglers.steps` consecutive steps; a job on one host has no peers to compare with.
The last step of training never stops for `replace`: training is done. Under FSDP the forward pass
holds the parameter all-gathers, so a slow rank also delays its peers' forward: the signal is weaker
there.

Torch-free at import; `StepTimer` takes the torch module it times with.
"""

from __future__ import annotations

import collections
import math
import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


class StragglerError(RuntimeError):
    """`stragglers.action=replace` stopped training, after a checkpoint, because a host lagged the others."""


_NAMED = "straggler: "
_NAMED_LINE = re.compile(rf"{_NAMED}(host \S+ \(ranks [^)]*\) computed its steps .*)$", re.MULTILINE)


def named(log: str) -> list[str]:
    """The stragglers a training log names, each once, in the order first named."""
    return list(dict.fromkeys(match.group(1).rstrip() for match in _NAMED_LINE.finditer(log)))


@dataclass(frozen=True)
class Straggler:
    """A host found slow: its ranks, how much slower than the median (the window's mean ratio), since when."""

    host: str
    ranks: tuple[int, ...]
    slowdown: float
    steps: int
    since_step: int

    def log_line(self) -> str:
        """How rank 0 names it in the log (`named` reads it back)."""
        return f"{_NAMED}{self.describe()}"

    def describe(self) -> str:
        ranks = ", ".join(str(rank) for rank in self.ranks)
        return (
            f"host {self.host} (ranks {ranks}) computed its steps {100 * (self.slowdown - 1):.0f}% slower than the "
            f"other hosts' median rank for {self.steps} consecutive steps, since step {self.since_step}"
        )


@dataclass
class StragglerDetector:
    """Judges each window of step times (ranks x steps), each host against the other hosts' median rank;
    the same on every rank."""

    hosts: Sequence[str]
    """The host of each rank, in rank order."""
    threshold: float
    steps: int
    _streak: dict[str, int] = field(default_factory=dict)
    _ratios: dict[str, list[float]] = field(default_factory=dict)
    _reported: set[str] = field(default_factory=set)
    _since: dict[str, int] = field(default_factory=dict)
    slowdown: float = 1.0
    """The last window's slowest host: the median over its judged steps of its ratio to the other hosts'
    median rank."""

    @property
    def stragglers(self) -> int:
        """Hosts slow for at least `steps` consecutive steps, up to the last window."""
        return sum(1 for streak in self._streak.values() if streak >= self.steps)

    def observe(self, first_step: int, times: Sequence[Sequence[float]]) -> list[Straggler]:
        """`times[rank][i]`: that rank's seconds for step ``first_step + i`` (NaN: not known). The hosts that
        became stragglers in this window, each reported once."""
        found = []
        window: dict[str, list[float]] = {}
        by_host: dict[str, list[int]] = {}
        for rank, host in enumerate(self.hosts):
            by_host.setdefault(host, []).append(rank)
        for i in range(len(times[0]) if times else 0):
            column = [row[i] for row in times]
            if len(by_host) < 2 or not all(math.isfinite(value) for value in column):
                continue  # one host has no peers; a step some rank has no time for is judged by no one
            for host, ranks in by_host.items():
                # Against the other hosts' ranks: with two hosts, a median over all ranks would sit
                # halfway to the slow host and hide it.
                median = statistics.median(column[rank] for rank in range(len(column)) if rank not in ranks)
                ratio = max(column[rank] for rank in ranks) / median if median > 0 else 1.0
                window.setdefault(host, []).append(ratio)
                if ratio >= 1 + self.threshold:
                    if not self._streak.get(host):
                        self._since[host] = first_step + i
                    self._streak[host] = self._streak.get(host, 0) + 1
                    self._ratios.setdefault(host, []).append(ratio)
                else:
                    self._streak[host], self._ratios[host] = 0, []
                    self._reported.discard(host)
                if self._streak[host] >= self.steps and host not in self._reported:
                    self._reported.add(host)
                    ratios = self._ratios[host][-self.steps :]
                    slowdown = sum(ratios) / len(ratios)
                    found.append(Straggler(host, tuple(ranks), slowdown, self._streak[host], self._since[host]))
        self.slowdown = max((statistics.median(ratios) for ratios in window.values()), default=1.0)
        return found


def share_and_judge(
    torch: Any, timer: StepTimer, detector: StragglerDetector, *, step: int, window: int, group: Any
) -> list[Straggler]:
    """Every rank's last `window` step times (up to `step`), shared in one all-gather over `group` (gloo,
    CPU tensors), and judged: the stragglers found, the same on every rank."""
    mine = torch.tensor(timer.take(window), dtype=torch.float64)
    gathered = [torch.empty_like(mine) for _ in range(torch.distributed.get_world_size(group))]
    torch.distributed.all_gather(gathered, mine, group=group)
    return detector.observe(step - window + 1, [row.numpy().tolist() for row in gathered])


class StepTimer:
    """This rank's compute time per step, from the intervals between `start` and `stop` within it."""

    def __init__(
        self, torch: Any, device: Any, *, keep: int = 0, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        """`keep`: the steps to remember until `take` (0: time nothing, as when no check runs); `clock`: the
        seconds a CPU interval is measured on."""
        self.torch = torch
        self.clock = clock
        self.cuda = device.type == "cuda"
        self._open: Any = None
        self._intervals: list[Any] = []
        # Per finished step: its intervals (CUDA event pairs or seconds); the oldest go beyond `keep`.
        self._pending: collections.deque[list[Any]] = collections.deque(maxlen=max(keep, 1))
        self.enabled = keep > 0

    def start(self) -> None:
        if not self.enabled:
            return
        if self.cuda:
            self._open = self.torch.cuda.Event(enable_timing=True)
            self._open.record()
        else:
            self._open = self.clock()

    def stop(self) -> None:
        if not self.enabled:
            return
        if self.cuda:
            end = self.torch.cuda.Event(enable_timing=True)
            end.record()
            self._intervals.append((self._open, end))
        else:
            self._intervals.append(self.clock() - self._open)

    def end_step(self) -> None:
        if self.enabled:
            self._pending.append(self._intervals)
            self._intervals = []

    def take(self, count: int) -> list[float]:
        """The last `count` finished steps' seconds, oldest first; NaN for a step whose GPU work has not
        finished yet (never waited for). Older steps are dropped."""
        steps = list(self._pending)[-count:]
        self._pending.clear()
        times = [self._seconds(intervals) for intervals in steps]
        return [math.nan] * (count - len(times)) + times

    def _seconds(self, intervals: list[Any]) -> float:
        if not self.cuda:
            return float(sum(intervals))
        if not all(end.query() for _, end in intervals):
            return math.nan
        return float(sum(start.elapsed_time(end) for start, end in intervals)) / 1000
