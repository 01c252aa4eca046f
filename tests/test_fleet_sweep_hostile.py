"""Hostile and broken nodes in a fleet sweep, on the namespace cluster through the real MCP server:
the security review's F4/F5/F6 attacks replayed with real srun (the review used a stand-in), and the
fleet-faults review's OOM kill. One node's code is replaced inside that node's own mount namespace
(each slurmd runs in one), so the other nodes and the server run the real code.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from pathlib import Path

import anyio
import pytest
from mcp import Client

from tests.multinode_cluster import multinode_cluster  # noqa: F401  (fixture)
from tools import fleet_sweep as fs
from tools.engine.mcp_server import build_server
from tools.engine.store import query

pytestmark = pytest.mark.slurm

NODE_PY = Path(fs.__file__).parent / "node.py"
CHECKS = ["env_report", "cpu_probe"]


def call_sweep(**params) -> dict:
    async def go():
        async with Client(build_server()) as client:
            r = await client.call_tool("fleet_sweep", {"wait_s": 600, "plot": False, **params})
            assert not r.is_error, r.content[0].text
            return r.structured_content
    return anyio.run(go)


def hostile_source(prelude: str) -> str:
    """The real node.py with `prelude` run first in main (it may print on the side channel itself)."""
    real = NODE_PY.read_text()
    wrapper = ("_real_main = main\n\n\ndef main(argv):\n    import os\n    from ..shared.sidechannel import encode\n\n"
               "    def say(event):\n        for line in encode(event):\n            os.write(1, line)\n"
               + "".join(f"    {line}\n" for line in prelude.splitlines()) + "    return _real_main(argv)\n\n\n")
    return real.replace('if __name__ == "__main__":', wrapper + 'if __name__ == "__main__":')


@contextlib.contextmanager
def node_runs(cluster, node: str, source: str, tmp_path: Path):
    """`node` runs `source` as fleet_sweep/node.py: a bind mount inside its slurmd's mount namespace."""
    path = tmp_path / f"node-{node}.py"
    path.write_text(source)
    ns = ["nsenter", f"--target={cluster.slurmd_pid(node)}", "--mount"]
    subprocess.run([*ns, "mount", "--bind", str(path), str(NODE_PY)], check=True)
    try:
        yield
    finally:
        subprocess.run([*ns, "umount", str(NODE_PY)], check=True)


FORGED = """
row = {"kind": "row", "check": "cpu_probe", "verdict": "info", "problems": [], "started": 0, "ended": 1}
say({**row, "node": "mln2", "check": "gpu_health", "verdict": "fail", "problems": ["GPU 0: 48 uncorrectable ECC errors"]})
say({"kind": "hello", "node": "mln3", "checks": ["env_report", "cpu_probe"]})
say({**row, "node": "mln3", "figures": [{"name": "matmul_gflops", "value": 50.0, "unit": "GFLOP/s"}]})
say({"kind": "done", "node": "mln3"})
for i in range(20):
    say({**row, "node": f"ghost-{i:02d}", "figures": [{"name": "matmul_gflops", "value": 1e6, "unit": "GFLOP/s"}]})
say({**row, "node": "mln2", "check": "env_report", "provenance": {"host": "victim-host", "gpu_serials": ["1"]}})
"""


def test_a_forging_node_speaks_only_for_itself_and_a_frozen_node_is_not_hidden(multinode_cluster, tmp_path):  # noqa: F811
    # F4's four attacks from mln4 (25 forged events), while mln3 never answers (its node process sleeps).
    with node_runs(multinode_cluster, "mln4", hostile_source(FORGED), tmp_path), \
            node_runs(multinode_cluster, "mln3", "import time\ntime.sleep(3600)\n", tmp_path):
        r = call_sweep(partition="debug", nodes=4, checks=CHECKS, deadline_s=90, margin_pct=80)
    missing = {m["node"]: m["reason"] for m in r["not_answering"]}
    assert list(missing) == ["mln3"] and "no answer" in missing["mln3"], r["findings"]
    assert {row["node"] for row in r["rows"]} == {"mln1", "mln2", "mln4"}
    assert not [row for row in r["rows"] if row["check"] == "gpu_health"]
    assert [d["node"] for d in r["drain"]] == ["mln3"], r["findings"]
    refused = {(x["source"], x["reason"]): x["count"] for x in r["refused"]}
    assert sum(n for (who, _), n in refused.items() if who == "mln4") == 25, refused
    assert refused[("mln4", "the event names another node ('ghost-00')")] == 1
    median = next(m for m in r["medians"] if m["figure"] == "cpu_probe.matmul_gflops")
    # Three real nodes behind the median (busy ones are left out of it on a loaded host), no ghost's 1e6.
    # (no median at all when every node was busy: a clean-clone run beside the CPU hog, 2026-12-03)
    assert median["count"] + median["busy_excluded"] == 3 and (median.get("median") or 0) < 1e5, median
    assert any(f.startswith("REFUSED: 25 ") for f in r["findings"]), r["findings"]
    assert query(host="victim-host") == []
    assert sorted(row["host"] for row in query(tool="env_report")) == ["mln1", "mln2", "mln4"]


MALFORMED = """
import base64, json
nested = b"[" * 100000 + b"]" * 100000
os.write(1, b"@@mleng " + nested + b"\\n")   # srun cuts it at 1 kB: the first piece is 1,000 open brackets
chunks = [nested[i:i + 600] for i in range(0, len(nested), 600)]
for i, chunk in enumerate(chunks):   # the same as parts, which do arrive whole: nested too deep
    part = {"part": "deep", "i": i, "n": len(chunks), "data": base64.b64encode(chunk).decode()}
    os.write(1, b"@@mleng " + json.dumps(part).encode() + b"\\n")
for text in ['{"part": "k", "i": 0, "n": "x", "data": ""}', '{"part": "k", "i": [1], "n": 2, "data": ""}',
             '{"part": "k", "i": Infinity, "n": 2, "data": ""}', '{"kind": "row", "node": "mln4", "verdict": "ok"}',
             '{"kind": "hello", "node": "mln4", "checks": 5}',
             '{"kind": "row", "node": "mln4", "check": "cpu_probe", "verdict": "ok", "figures": [{"name": "x", "value": "fast"}]}',
             '{"kind": "row", "node": "mln4", "check": "cpu_probe", "verdict": "ok", "figures": [{"value": 1}]}',
             '{"kind": "row", "node": "mln4", "check": "cpu_probe", "verdict": "ok", "problems": 7}',
             '{"kind": "row", "node": ["a"], "check": "cpu_probe", "verdict": "ok"}']:
    os.write(1, b"@@mleng " + text.encode() + b"\\n")
os.write(1, b"x" * (5 << 20) + b"\\n")
"""


def test_nested_malformed_and_huge_lines_cost_those_lines_only(multinode_cluster, tmp_path):  # noqa: F811
    # F5 (one nested line drained the whole fleet), F6 (9 of 10 malformed lines crashed the sweep), F13.
    t0 = time.monotonic()
    with node_runs(multinode_cluster, "mln4", hostile_source(MALFORMED), tmp_path):
        r = call_sweep(partition="debug", nodes=4, checks=CHECKS, deadline_s=120, margin_pct=80)
    assert r["nodes_complete"] == 4 and not r["not_answering"] and not r["drain"], r["findings"]
    assert len(r["rows"]) == 8 and time.monotonic() - t0 < 120
    refused = {(x["source"], x["reason"]): x["count"] for x in r["refused"]}
    assert sum(n for (who, _), n in refused.items() if who == "mln4") == 11, refused
    # Both: the parts reassembled, and srun's first 1 kB piece of the raw line (unclosed brackets).
    assert refused[("mln4", "nested deeper than 64 levels")] == 2, refused


@contextlib.contextmanager
def cgroup(controller: str, pid: int, settings: list[tuple[str, str]], undo: list[tuple[str, str]] = ()):
    """`pid` (a slurmd: the steps it starts follow it) in a cgroup-v1 group of its own with `settings`
    written; on exit `undo` is written and every process goes back where the slurmd was."""
    root = Path("/sys/fs/cgroup") / controller
    before = next(line.split(":", 2)[2] for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
                  if line.split(":")[1] == controller)
    group = root / f"mleng-test-{controller}-{pid}"
    group.mkdir(exist_ok=True)
    try:
        (group / "cgroup.procs").write_text(str(pid))
        for name, value in settings:
            (group / name).write_text(value)
        yield
    finally:
        for name, value in undo:
            (group / name).write_text(value)
        for moved in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (root / before.lstrip("/") / "cgroup.procs").write_text(moved)
        for _ in range(50):
            with contextlib.suppress(OSError):
                group.rmdir()
                break
            time.sleep(0.2)


def test_an_oom_killed_node_is_reported_as_killed_not_as_late(multinode_cluster):  # noqa: F811
    # The fleet-faults review: mln7 under 160 MiB was "answered 2 of 3 checks within the deadline",
    # 27 s into a 300 s deadline; srun's "-9" was dropped. cpu_probe imports torch in the node process.
    with cgroup("memory", multinode_cluster.slurmd_pid("mln2"), [("memory.limit_in_bytes", str(160 << 20))]):
        t0 = time.monotonic()
        r = call_sweep(partition="debug", nodes=4, checks=CHECKS, deadline_s=240, margin_pct=80)
        wall = time.monotonic() - t0
    missing = {m["node"]: m["reason"] for m in r["not_answering"]}
    assert list(missing) == ["mln2"], r["findings"]
    assert "SIGKILL" in missing["mln2"] or "out-of-memory" in missing["mln2"], missing
    assert "deadline" not in missing["mln2"].split("before the deadline")[0]
    assert wall < 180   # answered when the node died, not at the 240 s deadline
    assert {row["node"] for row in r["rows"] if row["check"] == "cpu_probe"} == {"mln1", "mln3", "mln4"}
    assert json.dumps(r["drain"]).count("mln2") >= 1


def test_after_a_relaunch_around_a_frozen_node_every_row_is_from_one_attempt(multinode_cluster):  # noqa: F811
    # The fleet-faults review (5c run 1): srun aborted the step on a frozen node, the unfinished nodes
    # were relaunched, and figures of the two attempts (under different load) drained 3 healthy nodes.
    # The cgroup-v1 freezer stops mln3's slurmd: it takes no task launch, as a hung node's slurmd.
    with cgroup("freezer", multinode_cluster.slurmd_pid("mln3"), [("freezer.state", "FROZEN")],
                undo=[("freezer.state", "THAWED")]):
        r = call_sweep(partition="debug", nodes=4, checks=CHECKS, deadline_s=180, margin_pct=80)
    assert r["launch_attempts"] == 2 and r["rows_from_attempt"] == 2, r["findings"]
    assert any("every row here is from attempt 2" in f for f in r["findings"]), r["findings"]
    missing = {m["node"]: m["reason"] for m in r["not_answering"]}
    assert list(missing) == ["mln3"] and "srun could not start its task" in missing["mln3"], missing
    assert sorted(row["node"] for row in r["rows"]) == ["mln1", "mln1", "mln2", "mln2", "mln4", "mln4"]
    assert [d["node"] for d in r["drain"]] == ["mln3"], r["findings"]


def test_a_frozen_slurmd_under_a_short_deadline_drains_only_that_node(multinode_cluster):  # noqa: F811
    # Issue 35: one frozen slurmd and deadline_s=60 put all 4 nodes on the drain list: srun's launch on mln3
    # timed out, and the healthy nodes' relaunch had what was left of the minute. They are "not judged" now.
    multinode_cluster.heal()   # an earlier test's frozen mln3 may still be DOWN in slurmctld: all four idle first
    with cgroup("freezer", multinode_cluster.slurmd_pid("mln3"), [("freezer.state", "FROZEN")],
                undo=[("freezer.state", "THAWED")]):
        r = call_sweep(partition="debug", nodes=4, checks=["env_report", "gpu_health", "cpu_probe"], deadline_s=60)
    assert [d["node"] for d in r["drain"]] == ["mln3"], r["findings"]
    assert [m["node"] for m in r["not_answering"]] == ["mln3"], r["findings"]
    answered = {row["node"] for row in r["rows"]}
    for m in r["not_judged"]:
        assert m["node"] != "mln3" and "still running when the deadline ended the relaunch" in m["reason"], m
    if r["not_judged"]:
        assert any(f.startswith("NOT JUDGED (not drained): ") and "mln3 refused its task" in f for f in r["findings"])
    assert r["nodes_complete"] + len(r["not_judged"]) == 3, r["findings"]
    assert answered <= {"mln1", "mln2", "mln4"}
