"""Straggler detection's judgement of shared step times, and the timer that measures them on CPU."""

from __future__ import annotations

import math
import time

import pytest
import torch

from training import stragglers
from training.stragglers import StepTimer, Straggler, StragglerDetector

HOSTS = ("algo-1", "algo-1", "algo-2", "algo-2")  # two ranks per host


def _window(slow: float, steps: int, *, slow_rank: int = 3) -> list[list[float]]:
    return [[slow if rank == slow_rank else 1.0] * steps for rank in range(len(HOSTS))]


def test_a_host_slow_for_the_consecutive_steps_is_named_once_with_its_ranks_and_slowdown() -> None:
    detector = StragglerDetector(HOSTS, threshold=0.15, steps=50)
    assert detector.observe(1, _window(1.3, 40)) == []  # 40 slow steps: not yet
    assert detector.stragglers == 0 and detector.slowdown == pytest.approx(1.3)
    found = detector.observe(41, _window(1.3, 40))
    assert found == [Straggler("algo-2", (2, 3), pytest.approx(1.3), 50, 1)]
    assert detector.stragglers == 1
    assert "host algo-2 (ranks 2, 3) computed its steps 30% slower than the other hosts' median rank for 50 " in (
        found[0].describe()
    )
    assert detector.observe(81, _window(1.3, 40)) == []  # still slow: not named again


def test_the_stragglers_a_log_names_are_read_back_once_each_in_order() -> None:
    first = Straggler("algo-2", (2, 3), 1.3, 50, 1)
    second = Straggler("algo-1", (0,), 1.2, 50, 300)
    log = "\n".join(
        f"2026-11-26 10:00:0{i} WARNING [rank0] training.trainer: {s.log_line()}"
        for i, s in enumerate((first, second, first))
    )
    assert stragglers.named(log + "\nstep=350 stragglers=2 slowdown=1.250\n") == [first.describe(), second.describe()]
    assert stragglers.named("step=50 loss=2.0 lr=0.1 grad_norm=1.0 tokens_per_sec=9.0") == []


def test_one_normal_step_restarts_the_count_and_a_small_lag_is_no_straggler() -> None:
    detector = StragglerDetector(HOSTS, threshold=0.15, steps=50)
    window = _window(1.3, 60)
    for row in window:
        row[45] = 1.0  # step 46 normal everywhere
    assert detector.observe(1, window) == []  # 45 slow, then 14: neither reaches 50
    detector = StragglerDetector(HOSTS, threshold=0.15, steps=50)
    assert detector.observe(1, _window(1.14, 100)) == []  # 14% slower: under the threshold


def test_of_two_hosts_the_slow_one_is_found_at_the_threshold_and_one_host_alone_never() -> None:
    """Against a median over all ranks, a host of two would need about a 35% lag to show (the median sits
    halfway between the hosts); against the other host's ranks, 15% is 15%."""
    for ranks_per_host in (1, 8):
        hosts = ["algo-1"] * ranks_per_host + ["algo-2"] * ranks_per_host
        times = [[1.0] * 50 for _ in range(ranks_per_host)] + [[1.2] * 50 for _ in range(ranks_per_host)]
        (found,) = StragglerDetector(hosts, threshold=0.15, steps=50).observe(1, times)
        assert (found.host, found.slowdown) == ("algo-2", pytest.approx(1.2))
    alone = StragglerDetector(["algo-1", "algo-1"], threshold=0.15, steps=5)
    assert alone.observe(1, [[1.0] * 10, [3.0] * 10]) == [] and alone.slowdown == 1.0


def test_a_step_some_rank_has_no_time_for_is_judged_by_no_one() -> None:
    detector = StragglerDetector(HOSTS, threshold=0.15, steps=3)
    window = _window(2.0, 4)
    window[0][1] = math.nan  # step 2 unknown on rank 0 (its GPU work had not finished)
    found = detector.observe(1, window)
    assert [s.since_step for s in found] == [1]  # steps 1, 3, 4: the unknown step neither counts nor resets


class _Clock:
    """Seconds that pass only when the test says so."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_timer_counts_each_steps_intervals_and_pads_unknown_steps() -> None:
    clock = _Clock()
    timer = StepTimer(torch, torch.device("cpu"), keep=2, clock=clock)
    for first, second in ((0.01, 0.003), (0.02, 0.004)):
        timer.start()
        clock.now += first
        timer.stop()
        clock.now += 5.0  # the backward pass between them (its collectives wait for peers): not timed
        timer.start()  # a second micro-batch in the same step
        clock.now += second
        timer.stop()
        timer.end_step()
        clock.now += 7.0  # the optimizer step: not timed
    assert timer.take(2) == pytest.approx([0.013, 0.024], abs=1e-12)
    padded = timer.take(3)
    assert all(math.isnan(v) for v in padded)  # taken already: nothing left
    # On its own clock (perf_counter) an interval lasts at least what it held: a sleep is a lower bound.
    timer = StepTimer(torch, torch.device("cpu"), keep=1)
    timer.start()
    time.sleep(0.01)
    timer.stop()
    timer.end_step()
    assert timer.take(1)[0] >= 0.01


def test_a_timer_keeps_only_the_steps_a_share_can_take_and_none_when_no_check_runs() -> None:
    timer = StepTimer(torch, torch.device("cpu"), keep=3)
    for _ in range(1000):
        timer.start()
        timer.stop()
        timer.end_step()
    assert len(timer._pending) == 3  # a run longer than the interval holds no more
    off = StepTimer(torch, torch.device("cpu"))
    off.start()
    off.stop()
    off.end_step()
    assert len(off._pending) == 0 and all(math.isnan(v) for v in off.take(2))
