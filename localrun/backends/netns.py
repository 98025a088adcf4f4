"""Network isolation for local training hosts: a network namespace whose only interface is loopback.

SageMaker's EnableNetworkIsolation leaves a job's containers nothing but their cluster. Locally the
hosts of an isolated job run in one user and network namespace (util-linux `unshare`/`nsenter`)
with loopback up and no route out, so they reach each other over 127.0.0.1 and nothing else.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import time

_UP = "ip link set lo up && exec sleep infinity"


@functools.cache
def available() -> bool:
    """Whether this machine lets an unprivileged process create such a namespace."""
    if not (shutil.which("unshare") and shutil.which("nsenter") and shutil.which("ip")):
        return False
    probe = subprocess.run(["unshare", "-rn", "sh", "-c", "ip link set lo up"], capture_output=True, check=False)
    return probe.returncode == 0


class LoopbackNamespace:
    """One namespace, held open by a sleeping process until `close()`."""

    def __init__(self, timeout: float = 10.0) -> None:
        self._holder = subprocess.Popen(["unshare", "-rn", "sh", "-c", _UP], start_new_session=True)
        deadline = time.monotonic() + timeout
        while "UP" not in self._run(["ip", "-o", "link", "show", "lo"]):
            if self._holder.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("could not bring loopback up in a new network namespace")
            time.sleep(0.05)

    def command(self, argv: list[str]) -> list[str]:
        """`argv`, run inside the namespace."""
        return ["nsenter", "--preserve-credentials", "-U", "-n", "-t", str(self._holder.pid), "--", *argv]

    def _run(self, argv: list[str]) -> str:
        return subprocess.run(self.command(argv), capture_output=True, text=True, check=False).stdout

    def close(self) -> None:
        if self._holder.poll() is None:
            self._holder.kill()
            self._holder.wait()
