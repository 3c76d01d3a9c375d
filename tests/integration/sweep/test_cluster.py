"""A sweep on an existing multi-node Ray cluster: two Ray nodes on this machine (a head and a
second raylet, as `ray start` makes them), the CLI connected with --address, storage on a path
both nodes share. A trial's two workers cannot fit on one node, so they land on both.

The three tests share one cluster (two nodes cost ~13 s of start-up): the group keeps them on
one pytest-xdist worker, in file order, and the node-loss test, which replaces the second node,
comes last."""

import json
import os
import subprocess

import pytest
import yaml
from ray.cluster_utils import Cluster
from sweeps import (
    CLI,
    assert_ends_as_never_killed,
    checkpointed_space,
    cli_in_process,
    wait_for_a_registered_checkpoint,
)

from schedule_search.store.experiment import Experiment
from schedule_search.train.launch import free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.xdist_group("two_node_cluster"),
]

SPACE = {
    "name": "multinode",
    # One trial a sweep: the node-loss test's sweep, later on this cluster, still starts only
    # once the trial before it has given its workers' CPUs back.
    "samples": 1,
    "seed": 0,
    "scheduler": "fifo",
    "base": {
        "task": {"name": "linreg", "dim": 64, "batch": 16},
        "optimizer": {"name": "sgd", "lr": 0.05},
        "schedule": {"kind": "poly", "alpha": 0.05, "warmup": 0.05},
        "ema": {"fractions": [0.0, 0.04], "objective": 0.04},
        "window": {"policy": "microbatches", "microbatches": 2},
        "budget": {"horizon": 1.0, "eval_at": [0.5]},
    },
    "params": {"optimizer.lr": {"type": "loguniform", "low": 0.01, "high": 0.3}},
}


def two_nodes() -> Cluster:
    """A head and a second node, one CPU each: a trial of two 1-CPU workers needs
    both. The head declares one trial slot, as the README's `ray start --head --resources`
    does. Its dashboard gets a free port: another test's Ray may hold Ray's default one."""
    head = {
        "num_cpus": 1,
        "resources": {"trial_slot": 1},
        "include_dashboard": True,
        "dashboard_port": free_port(),
    }
    cluster = Cluster(initialize_head=True, head_node_args=head)
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    return cluster


@pytest.fixture(scope="module")
def two_node_cluster():
    cluster = two_nodes()
    try:
        yield cluster
    finally:
        cluster.shutdown()


def node_ids(cluster: Cluster) -> set[str]:
    """The ids of the cluster's nodes now (the node-loss test replaces one)."""
    return {node.node_id for node in [cluster.head_node, *cluster.worker_nodes]}


@pytest.mark.cost(40)
def test_sweep_on_a_two_node_cluster_spreads_a_trials_workers(
    tmp_path, monkeypatch, capfd, two_node_cluster
):
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(SPACE))
    storage = tmp_path / "shared"
    monkeypatch.setenv("RAY_ADDRESS", two_node_cluster.address)
    sweep = ["sweep", str(space), "--workers", "2", "--storage", str(storage)]
    done = cli_in_process(capfd, *sweep)
    assert done.returncode == 0, done.stderr[-3000:]
    experiment = Experiment(storage / "multinode")
    assert json.loads((experiment.root / "sweep.json").read_text())["address"] == (
        two_node_cluster.address
    )
    nodes = node_ids(two_node_cluster)
    rows = experiment.rows()
    assert len(rows) == 1 and all(r.state == "completed" for r in rows), rows
    for trial_id in experiment.trial_ids():
        placements = [
            json.loads(path.read_text())
            for path in sorted((experiment.trial_dir(trial_id) / "workers").glob("rank-*.json"))
        ]
        assert [p["rank"] for p in placements] == [0, 1]
        assert {p["node_id"] for p in placements} == nodes, placements
        assert {(p["device"], p["backend"]) for p in placements} == {("cpu", "gloo")}


@pytest.mark.cost(20)
def test_a_local_sweep_beside_a_started_cluster_runs_on_a_ray_of_its_own(
    tmp_path, monkeypatch, capfd, two_node_cluster
):
    """`ray start` on this machine leaves a cluster that a plain `ray.init()` would join (and
    refuse our CPU count for); a local sweep starts its own Ray instead."""
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(SPACE))
    storage = tmp_path / "local"
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    done = cli_in_process(capfd, "sweep", str(space), "--workers", "1", "--storage", str(storage))
    assert done.returncode == 0, done.stderr[-3000:]
    experiment = Experiment(storage / "multinode")
    assert json.loads((experiment.root / "sweep.json").read_text())["address"] is None
    (trial_id,) = experiment.trial_ids()
    placement = json.loads((experiment.trial_dir(trial_id) / "workers" / "rank-0.json").read_text())
    assert placement["node_id"] not in node_ids(two_node_cluster)


@pytest.mark.cost(55)
def test_a_node_lost_mid_trial_is_replaced_and_the_trial_ends_as_if_never_killed(
    tmp_path, capsys, two_node_cluster
):
    """SIGKILL of the second node (its raylet and the trial worker on it, as a spot instance
    or an OOM kill of a raylet takes them) while a 2-worker trial trains across both; a new
    node joins (the resources return). Ray Train restarts the worker group from the last
    checkpoint and the trial ends with the parameters and EMA bank of a run never killed."""
    cluster = two_node_cluster
    (second,) = cluster.worker_nodes
    space = checkpointed_space("lost")
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space))
    storage = tmp_path / "shared"
    sweep = subprocess.Popen(
        [*CLI, "sweep", str(path), "--workers", "2", "--storage", str(storage)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "RAY_ADDRESS": cluster.address},
    )
    experiment = Experiment(storage / "lost")
    trial = wait_for_a_registered_checkpoint(sweep, experiment)
    placements = sorted((experiment.trial_dir(trial) / "workers").glob("rank-*.json"))
    nodes = {json.loads(p.read_text())["node_id"] for p in placements}
    assert second.node_id in nodes  # a worker of the trial runs on the node to be lost
    cluster.remove_node(second, allow_graceful=False)  # SIGKILL: raylet, its workers
    cluster.add_node(num_cpus=1)
    assert sweep.wait(timeout=400) == 0

    (row,) = experiment.rows()
    assert row.state == "completed" and row.restarts >= 1, row
    shown = cli_in_process(capsys, "status", "lost", "--storage", str(storage))
    assert shown.returncode == 0 and "restarts" in shown.stdout  # the restart, in the table
    assert_ends_as_never_killed(experiment, trial, tmp_path)
