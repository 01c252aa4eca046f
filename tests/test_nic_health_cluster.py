"""nic_health for real on the namespace cluster: a node whose link flaps during a fleet_sweep is named with
its carrier changes, and healthy nodes are never flagged (repeated). The flap is injected from outside the
node, on the host end of its veth (`ip link set mlnK-h down/up`), so the node sees its eth0 lose carrier as a
cable pull would show. Inside a node /sys is the host's, so this is also the netlink path of the reader."""

from __future__ import annotations

import subprocess
import threading

import pytest

from tests.multinode_cluster import multinode_cluster  # noqa: F401  (fixture)
from tools import fleet_sweep as fs

pytestmark = pytest.mark.slurm


def sweep(**params):
    return fs.SPEC.run(fs.SPEC.Params(partition="debug", checks=["nic_health"], deadline_s=180, **params),
                       lambda f, m: None)


class Flapper:
    """Flap a node's link from the host side until stopped: 0.1 s down every `period_s`."""

    def __init__(self, node: str, period_s: float = 0.7):
        self.link, self.period_s, self.stop_event = f"{node}-h", period_s, threading.Event()
        self.flaps = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _ip(self, state: str) -> None:
        subprocess.run(["ip", "link", "set", self.link, state], check=True, capture_output=True, timeout=10)

    def _run(self) -> None:
        while not self.stop_event.wait(self.period_s):
            self._ip("down")
            self.stop_event.wait(0.1)
            self._ip("up")
            self.flaps += 1

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop_event.set()
        self.thread.join(timeout=10)
        self._ip("up")  # whatever happened, the link is left up


def nic_rows(result) -> dict[str, object]:
    return {r.node: r for r in result.rows if r.check == "nic_health"}


def test_healthy_nodes_are_never_flagged(multinode_cluster):  # noqa: F811
    for _ in range(2):
        result = sweep()
        rows = nic_rows(result)
        assert sorted(rows) == multinode_cluster.nodes, result.findings
        assert all(r.verdict == "ok" and not r.problems for r in rows.values()), [r.problems for r in rows.values()]
        assert not result.drain, result.drain


def test_a_flapping_link_names_its_node_with_its_carrier_changes(multinode_cluster):  # noqa: F811
    with Flapper("mln3") as flapper:
        result = sweep()
    assert flapper.flaps >= 3
    rows = nic_rows(result)
    assert sorted(rows) == multinode_cluster.nodes, result.findings
    assert rows["mln3"].verdict == "fail", rows["mln3"].problems
    assert any("eth0:" in p and "carrier changes in the 3" in p and "drain_node" in p for p in rows["mln3"].problems)
    assert [d.node for d in result.drain] == ["mln3"], result.drain
    assert "carrier changes" in " ".join(result.drain[0].reasons)
    assert all(rows[n].verdict == "ok" for n in multinode_cluster.nodes if n != "mln3")
