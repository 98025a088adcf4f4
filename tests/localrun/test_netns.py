"""The local runner's stand-in for EnableNetworkIsolation: hosts reach each other and nothing else."""

from __future__ import annotations

import subprocess
import sys

import pytest

from localrun.backends import netns

pytestmark = pytest.mark.skipif(not netns.available(), reason="this machine cannot create network namespaces")

PROBE = """
import errno, socket, sys
print([name for _, name in socket.if_nameindex()])
server = socket.socket(); server.bind(("127.0.0.1", 0)); server.listen()
socket.create_connection(server.getsockname(), timeout=2)  # the cluster: loopback works
try:
    socket.create_connection(("198.51.100.7", 443), timeout=2)  # anything else: no route at all
except OSError as exc:
    sys.exit(0 if exc.errno == errno.ENETUNREACH else 2)
sys.exit(1)
"""


def test_hosts_in_the_namespace_reach_loopback_and_nothing_else() -> None:
    namespace = netns.LoopbackNamespace()
    try:
        inside = subprocess.run(
            namespace.command([sys.executable, "-c", PROBE]), capture_output=True, text=True, check=False
        )
    finally:
        namespace.close()
    assert inside.returncode == 0, inside.stdout + inside.stderr
    assert inside.stdout.strip() == "['lo']"
