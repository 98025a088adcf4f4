"""A local host's processes end together, whatever sessions its launcher and torchrun start."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from localrun import processes

# A launcher whose child starts a grandchild in a session of its own, as torchrun starts its workers.
_LAUNCHER = """
import subprocess, sys, time
child = subprocess.Popen(
    [sys.executable, "-c", "import subprocess, sys, time; "
     "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True); "
     "time.sleep(600)"],
    start_new_session=True,
)
print("up", flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_killing_a_host_kills_what_its_launcher_started_in_other_sessions() -> None:
    launcher = subprocess.Popen([sys.executable, "-c", _LAUNCHER], stdout=subprocess.PIPE, start_new_session=True)
    assert launcher.stdout is not None and launcher.stdout.readline() == b"up\n"
    deadline = time.monotonic() + 10
    while len(tree := processes.tree(launcher.pid)) < 3:
        assert time.monotonic() < deadline, tree
        time.sleep(0.05)
    processes.kill(launcher.pid)
    launcher.wait(timeout=10)
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in tree):
        assert time.monotonic() < deadline, [pid for pid in tree if _alive(pid)]
        time.sleep(0.05)
