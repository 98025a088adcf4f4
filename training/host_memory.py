"""The process's C heap: memory a step frees is kept for the next step, not handed back to the kernel.

glibc's malloc returns the top of a heap to the kernel once more than ``M_TRIM_THRESHOLD`` of it is free,
and serves blocks above ``M_MMAP_THRESHOLD`` with mappings of their own. Both start at 128 KiB and rise only
when a mapped block is freed. A training step on the CPU allocates and frees the same activations and
gradients every time, so the heap shrank and grew again within every step. On the peer benchmark's model
(training/bench_peer.py), that was about 12 ``brk`` calls per step and 660 page faults, each a fresh
page for the kernel to zero. (On GPUs a step's tensors are not on the C heap; this was measured on CPUs only.)

Fixing the two thresholds at the ceiling glibc's own adjustment stops at (32 MiB, and twice that for
the trim) keeps what a step frees for the next. The cost is memory held: the main heap keeps up to 64 MiB
free at its top, and the heap of a thread's arena (64 MiB at most) is no longer shrunk, only freed once
empty. PyTorch's tuning guide suggests preloading jemalloc or tcmalloc for the same effect; that needs a
library in the image and the variable set before the interpreter starts. ``mallopt`` is two calls in
the process itself, so every entry point gets it (``python -m training.train``, the benchmarks, tests).
"""

from __future__ import annotations

import ctypes
import logging
import platform

log = logging.getLogger(__name__)

# <malloc.h>
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: the ceiling of its own adjustment of the threshold.
MMAP_THRESHOLD = 32 * 2**20
# What glibc's own adjustment sets beside it (twice the mmap threshold).
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD


def keep_freed_memory() -> bool:
    """Set the thresholds above; False (and nothing changed) where the C library is not glibc."""
    if platform.libc_ver()[0] != "glibc":
        log.debug("not glibc: the C heap's thresholds are left as they are")
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    refused = [
        name
        for name, option, value in (
            ("M_MMAP_THRESHOLD", M_MMAP_THRESHOLD, MMAP_THRESHOLD),
            ("M_TRIM_THRESHOLD", M_TRIM_THRESHOLD, TRIM_THRESHOLD),
        )
        if mallopt(option, value) != 1
    ]
    if refused:
        log.warning("glibc refused %s: the heap is handed back to the kernel as before", " and ".join(refused))
    return not refused
