"""collective_bench transport "rdma": the pairwise rounds run perftest per pair instead of NCCL.

Each pair of a round runs `ib_write_bw` then `ib_write_lat` (tools/shared/perftest.py) on every rail: the
server on the first node, the client on the second, naming the first node's address;
rail k pairs the k-th RDMA device with an ACTIVE port of one node with the k-th of the other (rail-optimised
fabrics cable rail k to rail k); pairs of a round run at once, a pair's rails one after another. The pair's
figure is its slowest rail, named in the record, so one bad NIC or cable among eight shows apart from NCCL and
its settings. Before any round, one step asks every node whether it has perftest and ACTIVE RDMA ports:
nodes without them are named and nothing runs.

Nodes are reached through the node transport the pattern found them with (engine/transport.py): srun inside
the SLURM allocation, or ssh to `hosts=` without SLURM. The readiness step is one `run_step`, its answers
credited to the node the transport reached (never to a name the node prints); each side of a pair is one
`command(node, argv)`, killed at its deadline (over ssh, remote_step then kills it on the node). The server's
address is the one the transport names: SLURM's NodeAddr, or the HostName this machine's ssh config gives.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from ..engine.placement import inside_allocation
from ..engine.processes import child_env, without_secrets
from ..engine.spec import ToolFailure
from ..engine.srun import SrunTransport
from ..engine.transport import SshTransport, Transport
from ..shared import perftest
from .node_groups import GroupRun, node_addresses

# Prints "<RDMA devices with an ACTIVE port 1, comma-separated, or -> <perftest paths or ->" on each node.
READINESS = ('d=; for p in /sys/class/infiniband/*/ports/1/state; do grep -q ACTIVE "$p" 2>/dev/null && '
             'd="${d:+$d,}$(basename "$(dirname "$(dirname "$(dirname "$p")")")")"; done; '
             'echo "${d:--} $(command -v ib_write_bw || echo -) $(command -v ib_write_lat || echo -)"')
PORT_BASE = 18515
STEP_NAME = "mleng-rdma-rounds"


def rdma_transport(how: str, names: list[str]) -> tuple[Transport, dict[str, str]]:
    """The transport the pattern reached `names` by ("srun": inside the allocation; "ssh": hosts=), and the
    address each node's server is dialled at."""
    if how == "ssh":
        ssh = SshTransport(without_secrets(dict(os.environ)))
        return ssh, {n: ssh.address(n) for n in names}
    srun = SrunTransport(inside_allocation().srun_args, job_name=f"{STEP_NAME}-{uuid.uuid4().hex[:8]}",
                         kill_on_bad_exit=False)
    return srun, node_addresses(names)


def readiness(transport: Transport, names: list[str], timeout_s: float = 60) -> dict[str, list[str]]:
    """node -> its RDMA devices with an ACTIVE port (its rails, in sysfs order); ToolFailure naming every node that
    lacks perftest or an active RDMA port, or did not answer."""
    seen: dict[str, list[str]] = {}

    def on_line(node: str, line: str) -> None:
        if len(parts := line.split()) == 3:
            seen.setdefault(node, parts)

    try:
        ends = transport.run_step(names, ["sh", "-c", READINESS], timeout_s, on_line)
    except OSError as e:
        raise ToolFailure(f"transport: could not ask the nodes whether perftest is there ({e})") from None
    lacking = []
    for node in names:
        device, bw, lat = seen.get(node, ["?", "?", "?"])
        end = ends[node]
        silence = "no answer" + (f" ({end.why.removeprefix(node + ': ')})" if end.how == "unreachable" else
                                 f" within {timeout_s:.0f} s" if end.how == "silent" else "")
        why = [w for w, bad in ((silence, device == "?"), ("no RDMA device with an ACTIVE port", device == "-"),
                                ("perftest not present (ib_write_bw / ib_write_lat not on PATH)", "-" in (bw, lat)))
               if bad]
        if why:
            lacking.append(f"{node}: {', '.join(dict.fromkeys(why))}")
    if lacking:
        raise ToolFailure("transport: rdma needs perftest and an ACTIVE RDMA port on every node; "
                          + "; ".join(lacking) + ". Use transport nccl, or install perftest (rdma-core) there.")
    return {node: seen[node][0].split(",") for node in names}


def launcher(transport: Transport):
    """launch(node, argv) -> Popen: one side of a pair, run on `node` through the transport, in a session of
    its own so that perftest.run_pair's kill_tree at the deadline takes srun or ssh with it."""
    def launch(node: str, argv: list[str]) -> subprocess.Popen:
        return subprocess.Popen(transport.command(node, argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, text=True, start_new_session=True, env=child_env())
    return launch


def run_round_rdma(groups: list[list[int]], *, names: list[str], devices: dict[str, list[str]],
                   addresses: dict[str, str], deadline_s: float, launch) -> list[GroupRun]:
    """Every pair of the round at once; busbw_gbps holds the slowest rail's RDMA write bandwidth (GB/s, from
    Gb/s / 8) and latency_us the highest typical write latency, so the pairwise judging and matrix work
    unchanged; the detail names each rail's figures. `launch(node, argv) -> Popen` (launcher(transport));
    `addresses`: node -> the address its server is dialled at."""

    def one(k: int, group: list[int]) -> GroupRun:
        server, client = (names[i] for i in group)
        rails = list(zip(devices[server], devices[client]))
        t0 = time.monotonic()
        measured = [(rail, perftest.run_pair(server, client, launch, test=test, device=dev_s, client_device=dev_c,
                                             port=PORT_BASE + 2 * (k * len(rails) + rail) + j,
                                             server_addr=addresses[server],
                                             deadline_s=deadline_s / (2 * len(rails))))
                    for rail, (dev_s, dev_c) in enumerate(rails) for j, test in enumerate(("bw", "lat"))]
        missing = [(rail, m) for rail, m in measured if m.value is None]
        bws = {rail: m.value for rail, m in measured if m.test == "bw" and m.value is not None}
        lats = [m.value for _, m in measured if m.test == "lat" and m.value is not None]
        status = "ok" if not missing else "hang" if any("hung" in m.detail for _, m in missing) else "fail"
        if missing:
            detail = f"{server}+{client}: " + "; ".join(f"{_rail(rails[r])} {m.test}: {m.detail}" for r, m in missing)
        else:
            slowest = min(bws, key=bws.get)
            detail = "" if len(rails) == 1 else f"{len(rails)} rails, slowest {_rail(rails[slowest])}: " + ", ".join(
                f"{_rail(rails[r])} {v:g} Gb/s" for r, v in sorted(bws.items()))
        return GroupRun(list(group), status, min(bws.values()) / 8 if status == "ok" else None,
                        max(lats) if status == "ok" else None, round(time.monotonic() - t0, 2), detail)

    with ThreadPoolExecutor(max_workers=max(1, len(groups))) as pool:  # every pair of the round at once
        return list(pool.map(one, range(len(groups)), groups))


def _rail(devices: tuple[str, str]) -> str:
    return devices[0] if devices[0] == devices[1] else f"{devices[0]}->{devices[1]}"
