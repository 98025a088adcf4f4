"""A heterogeneous cluster on the launcher: the training groups form the torchrun job, the others follow it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from training_helpers import TINY_JOB, clean_env, free_port, kill_tree, launcher, make_opt_ml

from training.roles import Auxiliary, follow_training, training_cluster
from training.sagemaker_contract import ContractError, Paths, ResourceConfig, read_resource_config

GROUPS = (("cpu", ("algo-1",)), ("gpu", ("algo-2", "algo-3")))
HOSTS = ("algo-1", "algo-2", "algo-3")


def _resources(current: str) -> ResourceConfig:
    return ResourceConfig(current_host=current, hosts=HOSTS, network_interface_name="eth0", groups=GROUPS)


def test_the_training_groups_hosts_form_the_job_in_the_clusters_order() -> None:
    cluster = training_cluster(_resources("algo-3"), {"TRAINING_GROUPS": "gpu"})
    assert cluster is not None
    assert (cluster.hosts, cluster.node_rank, cluster.network_interface_name) == (("algo-2", "algo-3"), 1, "eth0")
    assert training_cluster(_resources("algo-1"), {"TRAINING_GROUPS": "gpu"}) is None  # auxiliary
    both = training_cluster(_resources("algo-1"), {"TRAINING_GROUPS": "cpu, gpu"})
    assert both is not None and both.hosts == HOSTS


def test_a_homogeneous_cluster_trains_everywhere_whatever_the_groups_say() -> None:
    plain = ResourceConfig(current_host="algo-2", hosts=("algo-1", "algo-2"))
    assert training_cluster(plain, {"TRAINING_GROUPS": "train"}) is plain
    assert training_cluster(plain, {}) is plain


@pytest.mark.parametrize(
    ("groups", "message"),
    [("", "TRAINING_GROUPS names no group that trains"), ("gpu,tpu", "the training groups named are gpu,tpu")],
)
def test_training_groups_must_name_the_clusters_groups(groups: str, message: str) -> None:
    with pytest.raises(ContractError, match=message.replace(",", ", ") if "named are" in message else message):
        training_cluster(_resources("algo-2"), {"TRAINING_GROUPS": groups})


def test_resourceconfig_instance_groups_are_read_and_one_group_is_none(tmp_path: Path) -> None:
    paths = make_opt_ml(tmp_path, {}, corpus=None, hosts=HOSTS, current_host="algo-1")
    config = json.loads(paths.resource_config.read_text())
    config["instance_groups"] = [
        {"instance_group_name": name, "instance_type": "ml.c5.2xlarge", "hosts": list(hosts)} for name, hosts in GROUPS
    ]
    paths.resource_config.write_text(json.dumps(config))
    assert read_resource_config(paths, {}).groups == GROUPS
    config["instance_groups"] = [{"instance_group_name": "homogeneousCluster", "hosts": list(HOSTS)}]
    paths.resource_config.write_text(json.dumps(config))
    assert read_resource_config(paths, {}).groups == ()
    config["instance_groups"] = {"cpu": ["algo-1"]}
    paths.resource_config.write_text(json.dumps(config))
    with pytest.raises(ContractError, match="'instance_groups' must be a list of groups with their hosts"):
        read_resource_config(paths, {})


def test_an_auxiliary_host_follows_the_training_master_from_start_to_end() -> None:
    aux = Auxiliary.of(_resources("algo-1"), {"TRAINING_GROUPS": "gpu"}, master_port=29500)
    assert aux == Auxiliary(group="cpu", master_addr="algo-2", master_port=29500)
    answers = iter([False, False, True, True, False, True, False, False, False])
    seen: list[tuple[str, int]] = []

    def listening(addr: str, port: int) -> bool:
        seen.append((addr, port))
        return next(answers)

    assert follow_training(aux, start_timeout=60, interval=0, listening=listening) == 0
    # A moment's refusal (the 5th answer) is not the end; three in a row are.
    assert len(seen) == 9 and set(seen) == {("algo-2", 29500)}
    assert follow_training(aux, start_timeout=0, interval=0, listening=lambda _a, _p: False) == 1


SHORT_JOB = {**TINY_JOB, "max_steps": "2", "optim.warmup_steps": "1", "checkpoint.interval_steps": "0"}


@pytest.mark.slow
def test_two_training_hosts_train_while_the_auxiliary_host_follows(tmp_path: Path, corpus: Path) -> None:
    """algo-1 (cpu, auxiliary, no data channel) and algo-2/algo-3 (gpu group) launched as SageMaker would."""
    port = str(free_port())
    trees: dict[str, Paths] = {}
    for host in HOSTS:
        auxiliary = host == "algo-1"
        paths = make_opt_ml(
            tmp_path / host, SHORT_JOB, corpus=None if auxiliary else corpus, hosts=HOSTS, current_host=host
        )
        config = json.loads(paths.resource_config.read_text())
        config["instance_groups"] = [{"instance_group_name": n, "hosts": list(h)} for n, h in GROUPS]
        paths.resource_config.write_text(json.dumps(config))
        trees[host] = paths
    procs = {
        host: subprocess.Popen(
            launcher(),
            env=clean_env(
                paths.root, TRAINING_MASTER_ADDR="127.0.0.1", TRAINING_MASTER_PORT=port, TRAINING_GROUPS="gpu"
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for host, paths in trees.items()
    }
    try:
        logs = {host: proc.communicate(timeout=150)[0] for host, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                kill_tree(proc.pid)
    for host, proc in procs.items():
        assert proc.returncode == 0, logs[host][-3000:]
    assert "host algo-2 is node 0 of 2" in logs["algo-2"] and "host algo-3 is node 1 of 2" in logs["algo-3"]
    assert "step=2 loss=" in logs["algo-2"]
    aux = logs["algo-1"]
    assert "host is auxiliary (group cpu)" in aux and "the training started" in aux and "the training ended" in aux
    assert "pre-flight" not in aux and not trees["algo-1"].failure.exists()
