"""The collective check on a real two-node Ray cluster on this machine, a node whose gloo is
pointed at an interface it does not have. (Two healthy nodes joining over gloo: the train
pipeline's preflight in tests/gpu_boundary/test_ray_cluster_run.py.)"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from rl_pipeline.engines.verl.cluster import node_label
from rl_pipeline.engines.verl.collective import check_collective

# Slow: a Ray cluster of two nodes per test.
pytestmark = pytest.mark.slow

NO_SUCH_INTERFACE = "rlp-no-such0"


@pytest.fixture
def two_nodes(request: pytest.FixtureRequest) -> Iterator[tuple[list[dict[str, Any]], str]]:
    """Two Ray nodes, the second started with the environment the test passes (indirect
    parametrize), and this process connected to them: the alive nodes and the second's id."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster()
    try:
        # No dashboard: its process can outlive the cluster by seconds, holding port 8265
        # when the next module's cluster starts its own.
        cluster.add_node(num_cpus=1, include_dashboard=False)
        # Only the second node's raylet sees it, and so only the workers it starts: a job's
        # runtime_env would set it on every node alike.
        with pytest.MonkeyPatch.context() as env:
            for name, value in getattr(request, "param", {}).items():
                env.setenv(name, value)
            second = cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        try:
            yield [n for n in ray.nodes() if n["Alive"]], second.node_id
        finally:
            ray.shutdown()
    finally:
        cluster.shutdown()


@pytest.mark.parametrize("two_nodes", [{"GLOO_SOCKET_IFNAME": NO_SUCH_INTERFACE}],
                         indirect=True)
def test_a_node_on_a_missing_interface_is_named_within_the_bound(two_nodes) -> None:
    nodes, bad_id = two_nodes
    # The bad node last (rank 1), as a worker node would be: rank 0 is left waiting for it
    # in the rendezvous, which the check must cut short.
    nodes = sorted(nodes, key=lambda node: node["NodeID"] == bad_id)
    bad = nodes[1]
    assert bad["NodeID"] == bad_id
    timeout_s = 20
    started = time.monotonic()
    problems, report = check_collective(nodes, backend="gloo", timeout_s=timeout_s)
    seconds = time.monotonic() - started
    # Shown with `pytest -s`: the time and the message a user gets.
    print(f"refused in {seconds:.1f} s")  # noqa: T201
    print("\n".join(str(p) for p in problems))  # noqa: T201
    assert seconds < timeout_s + 15
    assert not report["ok"]
    # The node's environment reached the task: the interface is the node's, not the job's.
    by_label = {n["node"]: n for n in report["nodes"]}
    assert by_label[node_label(bad)]["GLOO_SOCKET_IFNAME"] == NO_SUCH_INTERFACE
    assert by_label[node_label(bad)]["rank"] == 1
    (problem,) = problems
    assert problem.value == node_label(bad)
    for part in (node_label(bad), "gloo", NO_SUCH_INTERFACE, "GLOO_SOCKET_IFNAME",
                 report["rendezvous"]):
        assert part in problem.allowed
