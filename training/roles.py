"""A heterogeneous cluster's roles: which hosts train, and what the others do while they do.

The pipeline names the instance groups that train (`TRAINING_GROUPS`, from the request); their hosts
form the torchrun job, ranked in the job's host order. A host of any other group is auxiliary: it
starts no workers, and stays up for the training's duration (it follows the training master's
rendezvous port: open while torchrun runs, closed once it has ended), then exits 0, so the job ends
when training ends. SIGTERM ends it at once: it holds nothing to checkpoint. Torch-free.
"""

from __future__ import annotations

import logging
import signal
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from contract.layout import TRAINING_GROUPS_ENV
from training.sagemaker_contract import ContractError, ResourceConfig

log = logging.getLogger("training.roles")

DEFAULT_START_TIMEOUT_SECONDS = 3600.0
# Consecutive refused connections that mean the training has ended (not a moment's hiccup).
_CLOSED_CHECKS = 3


def training_groups(env: Mapping[str, str]) -> list[str]:
    return [name.strip() for name in env.get(TRAINING_GROUPS_ENV, "").split(",") if name.strip()]


def training_cluster(resources: ResourceConfig, env: Mapping[str, str]) -> ResourceConfig | None:
    """The cluster of the hosts that train, or None when this host is auxiliary."""
    if not resources.groups:
        return resources
    names = training_groups(env)
    if not names:
        raise ContractError(
            f"this is a heterogeneous cluster ({', '.join(name for name, _ in resources.groups)}) but "
            f"{TRAINING_GROUPS_ENV} names no group that trains"
        )
    return resources.of_groups(names)


@dataclass(frozen=True)
class Auxiliary:
    """An auxiliary host's place: its group, and the training master it follows."""

    group: str
    master_addr: str
    master_port: int

    @classmethod
    def of(
        cls, resources: ResourceConfig, env: Mapping[str, str], master_port: int, master_addr: str | None = None
    ) -> Auxiliary:
        """`master_addr` overrides the first training host, as the launcher's TRAINING_MASTER_ADDR does."""
        group = next(name for name, hosts in resources.groups if resources.current_host in hosts)
        names = training_groups(env)
        training = [h for h in resources.hosts if any(h in hosts for n, hosts in resources.groups if n in names)]
        return cls(group=group, master_addr=master_addr or training[0], master_port=master_port)


def _listening(addr: str, port: int) -> bool:
    try:
        with socket.create_connection((addr, port), timeout=5):
            return True
    except OSError:
        return False


def follow_training(
    aux: Auxiliary,
    *,
    start_timeout: float,
    interval: float = 2.0,
    listening: Callable[[str, int], bool] = _listening,
) -> int:
    """Wait for the training master's rendezvous port to open, then for it to close; 0, or 1 if it never opened."""
    stopped = False

    def _stop(_signum: int, _frame: object) -> None:
        nonlocal stopped
        stopped = True

    signal.signal(signal.SIGTERM, _stop)
    log.info(
        "host is auxiliary (group %s): no training workers here; following the training at %s:%d",
        aux.group,
        aux.master_addr,
        aux.master_port,
    )
    deadline = time.monotonic() + start_timeout
    while not listening(aux.master_addr, aux.master_port):
        if stopped:
            log.info("SIGTERM before the training started: nothing to do")
            return 0
        if time.monotonic() > deadline:
            log.error(
                "the training did not start at %s:%d within %.0f s", aux.master_addr, aux.master_port, start_timeout
            )
            return 1
        time.sleep(interval)
    log.info("the training started")
    closed = 0
    while closed < _CLOSED_CHECKS and not stopped:
        closed = 0 if listening(aux.master_addr, aux.master_port) else closed + 1
        time.sleep(interval)
    log.info("SIGTERM: leaving" if stopped else "the training ended")
    return 0
