"""collective_bench transport "rdma": the pairwise rounds run perftest per pair instead of NCCL.

Each pair of a round runs `ib_write_bw` then `ib_write_lat` (tools/shared/perftest.py): the server as one
srun step on the first node, the client as one on the second, naming the first node's address; pairs of a
round run at once. A bad NIC or cable then shows apart from NCCL and its settings. Before any round, one
srun step asks every node whether it has perftest and an ACTIVE RDMA port: nodes without them are named and
nothing runs.
"""

from __future__ import annotations

import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

from ..engine.spec import ToolFailure
from ..shared import perftest
from .node_groups import GroupRun, node_addresses

# Prints "<node> <first RDMA device with an ACTIVE port 1 or -> <perftest path or ->" on each node.
READINESS = ('d=-; for p in /sys/class/infiniband/*/ports/1/state; do grep -q ACTIVE "$p" 2>/dev/null && '
             '{ d=$(basename "$(dirname "$(dirname "$(dirname "$p")")")"); break; }; done; '
             'echo "${SLURMD_NODENAME:-$(hostname)} $d $(command -v ib_write_bw || echo -) $(command -v ib_write_lat || echo -)"')
PORT_BASE = 18515


def readiness(names: list[str], timeout_s: float = 60) -> dict[str, str]:
    """node -> its RDMA device; ToolFailure naming every node that lacks perftest or an active RDMA port."""
    cmd = ["srun", "--overlap", f"--nodelist={','.join(names)}", f"--nodes={len(names)}",
           f"--ntasks={len(names)}", "--ntasks-per-node=1", "sh", "-c", READINESS]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ToolFailure(f"transport: could not ask the nodes whether perftest is there ({e})") from None
    seen = {parts[0]: parts[1:] for parts in (line.split() for line in out.splitlines()) if len(parts) == 4}
    lacking = []
    for node in names:
        device, bw, lat = seen.get(node, ["?", "?", "?"])
        why = [w for w, bad in (("no answer", device == "?"), ("no RDMA device with an ACTIVE port", device == "-"),
                                ("perftest not present (ib_write_bw / ib_write_lat not on PATH)", "-" in (bw, lat)))
               if bad]
        if why:
            lacking.append(f"{node}: {', '.join(dict.fromkeys(why))}")
    if lacking:
        raise ToolFailure("transport: rdma needs perftest and an ACTIVE RDMA port on every node; "
                          + "; ".join(lacking) + ". Use transport nccl, or install perftest (rdma-core) there.")
    return {node: seen[node][0] for node in names}


def _launch(node: str, argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(["srun", "--overlap", f"--nodelist={node}", "--nodes=1", "--ntasks=1", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def run_round_rdma(groups: list[list[int]], *, names: list[str], devices: dict[str, str],
                   deadline_s: float) -> list[GroupRun]:
    """Every pair of the round at once; busbw_gbps holds the RDMA write bandwidth (GB/s, from Gb/s / 8) and
    latency_us the typical write latency, so the pairwise judging and matrix work unchanged."""
    addresses = node_addresses(names)

    def one(k: int, group: list[int]) -> GroupRun:
        server, client = (names[i] for i in group)
        t0 = time.monotonic()
        measured = [perftest.run_pair(server, client, _launch, test=test, device=devices[server],
                                      port=PORT_BASE + 2 * k + j, server_addr=addresses[server],
                                      deadline_s=deadline_s / 2) for j, test in enumerate(("bw", "lat"))]
        bw, lat = measured
        status = "ok" if bw.value is not None and lat.value is not None else \
            "hang" if any("hung" in m.detail for m in measured) else "fail"
        detail = "" if status == "ok" else f"{server}+{client}: " + "; ".join(
            f"{m.test}: {m.detail}" for m in measured if m.value is None)
        return GroupRun(list(group), status, bw.value / 8 if bw.value is not None else None, lat.value,
                        round(time.monotonic() - t0, 2), detail)

    with ThreadPoolExecutor(max_workers=max(1, len(groups))) as pool:  # every pair of the round at once
        return list(pool.map(one, range(len(groups)), groups))
