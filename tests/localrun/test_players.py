"""The local platform plays each registered backend that declares a local player, made as the demo makes it."""

from __future__ import annotations

from pathlib import Path

from lambdas.backends import BACKENDS
from localrun.aws.engine import player_factories
from localrun.backends.batch import LocalBatch


def test_every_backend_with_a_local_player_has_a_factory_that_makes_one(tmp_path: Path) -> None:
    factories = player_factories()
    assert sorted(factories) == sorted(name for name, declared in BACKENDS.items() if declared.local is not None)
    for name, make in factories.items():
        player = make(tmp_path / name, max_hosts=3, spot_interrupt=False, on_line=lambda _job, _line: None)
        assert player.patches() and player.job_facts() == []
        player.close()


def test_the_demos_batch_loses_one_node_when_asked_to_interrupt(tmp_path: Path) -> None:
    batch = player_factories()["batch"](tmp_path, max_hosts=3, spot_interrupt=True, on_line=lambda _j, _l: None)
    assert isinstance(batch, LocalBatch)
    assert (batch.max_nodes, batch.kill_node_after_checkpoint) == (3, 1)
