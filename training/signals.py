"""SIGTERM/SIGINT become a stop request that the training loop honours at the next step boundary.

Torch-free so that ``train.py`` can install the handler before the slow torch import: a SIGTERM
that arrives while torch loads is then still turned into a clean stop instead of a kill.
"""

from __future__ import annotations

import os
import signal
from types import FrameType


class StopRequest:
    """Records the first stop signal; a second SIGINT interrupts immediately (interactive runs)."""

    def __init__(self) -> None:
        self.signum: int | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum
        # os.write is async-signal-safe; logging from a handler can deadlock on its lock.
        os.write(2, f"received {signal.Signals(signum).name}: stopping after this step\n".encode())

    @classmethod
    def install(cls) -> StopRequest:
        stop = cls()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, stop._handle)
        return stop
