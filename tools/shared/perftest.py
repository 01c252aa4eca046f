"""perftest between two nodes: `ib_write_bw` / `ib_write_lat` command lines, a pair runner, output parsers.

RDMA bandwidth and latency per node pair without NCCL, so a bad NIC or cable is named apart from NCCL
(ClusterMAX asks for pairwise ib_write_bw / ib_write_lat, https://www.clustermax.ai/expectations/health-checks,
read 2026-12-01). The server side waits for one client and exits after the test; the client names the
server's address. Flags (perftest's own help): -d device, -p TCP port of the exchange, -x GID index (RoCE),
-s message size, -n iterations, -F do not fail on CPU frequency scaling, --report_gbits Gb/s not MB/s.
Used by collective_bench's `transport: rdma`; nothing here knows about rounds.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from dataclasses import dataclass

from ..engine.processes import kill_tree
from .logscan import capped_lines

TESTS = {"bw": "ib_write_bw", "lat": "ib_write_lat"}
BW_SIZE_BYTES = 1 << 20      # large enough to reach line rate on 400 Gb/s ports
LAT_SIZE_BYTES = 2
ITERATIONS = {"bw": 2000, "lat": 1000}
SERVER_START_S = 1.5         # time the server needs to listen before the client connects
_BW_HEADER = re.compile(r"#bytes\s+#iterations\s+BW peak\[(\w+)/sec\]\s+BW average\[(\w+)/sec\]\s+MsgRate\[Mpps\]")
_LAT_HEADER = re.compile(r"#bytes\s+#iterations\s+t_min\[usec\]\s+t_max\[usec\]\s+t_typical\[usec\]\s+t_avg\[usec\]")
_NUMBER_ROW = re.compile(r"^\s*(\d+)\s+(\d+)((?:\s+\d+(?:\.\d+)?)+)\s*$")   # "1.2.3" is not a number
# What perftest prints when the node has no RDMA device (or its driver is not loaded), checked on the real binary.
_NO_DEVICE = ("Did not detect devices", "Unable to find the Infiniband/RoCE device")


@dataclass
class BwRow:
    size_bytes: int
    iterations: int
    peak_gbps: float
    average_gbps: float
    msg_rate_mpps: float


@dataclass
class LatRow:
    size_bytes: int
    iterations: int
    t_min_us: float
    t_max_us: float
    t_typical_us: float
    t_avg_us: float
    t_stdev_us: float | None
    p99_us: float | None
    p999_us: float | None


@dataclass
class PairMeasure:
    """One pair's perftest result: a figure, or why there is none."""
    server: str
    client: str
    test: str
    value: float | None      # Gb/s (bw, average) or microseconds (lat, typical)
    unit: str
    detail: str


def available() -> tuple[bool, str]:
    found = {name: shutil.which(name) for name in TESTS.values()}
    missing = [n for n, p in found.items() if not p]
    return (not missing, "not present (" + ", ".join(missing) + " not on PATH)" if missing
            else ", ".join(p for p in found.values() if p))


def argv(test: str, device: str, port: int, server: str | None = None, gid_index: int | None = None) -> list[str]:
    """The command line of one side: server when `server` is None, else the client connecting to it."""
    size = BW_SIZE_BYTES if test == "bw" else LAT_SIZE_BYTES
    line = [TESTS[test], "-d", device, "-p", str(port), "-s", str(size), "-n", str(ITERATIONS[test]), "-F"]
    if test == "bw":
        line.append("--report_gbits")
    if gid_index is not None:
        line += ["-x", str(gid_index)]
    return line + ([server] if server else [])


def _rows(text: str, header: re.Pattern) -> tuple[re.Match | None, list[list[float]]]:
    lines = capped_lines(text, last=True)   # a node's output: each line cut, the end kept
    for i, line in enumerate(lines):
        m = header.search(line)
        if m:
            rows = []
            for row in lines[i + 1:]:
                if (n := _NUMBER_ROW.match(row)):
                    rows.append([float(n.group(1)), float(n.group(2)), *map(float, n.group(3).split())])
                elif row.strip().startswith("---") and rows:
                    break
            return m, rows
    return None, []


def parse_bw(text: str) -> list[BwRow]:
    """The result table of ib_*_bw run with --report_gbits; ValueError naming the format otherwise."""
    m, rows = _rows(text, _BW_HEADER)
    if not m or not rows:
        raise ValueError("perftest: expected an ib_write_bw table ('#bytes #iterations BW peak[Gb/sec] BW "
                         "average[Gb/sec] MsgRate[Mpps]' and rows under it)")
    if m.group(2) != "Gb":
        raise ValueError(f"perftest: the table is in {m.group(2)}/sec; run with --report_gbits to get Gb/sec")
    return [BwRow(int(r[0]), int(r[1]), r[2], r[3], r[4]) for r in rows if len(r) >= 5]


def parse_lat(text: str) -> list[LatRow]:
    """The result table of ib_*_lat (-n iterations: every column; -D duration prints fewer)."""
    m, rows = _rows(text, _LAT_HEADER)
    if not m or not rows:
        raise ValueError("perftest: expected an ib_write_lat table ('#bytes #iterations t_min[usec] t_max[usec] "
                         "t_typical[usec] t_avg[usec] ...' and rows under it)")
    out = []
    for r in rows:
        extra = r[6:9] + [None] * (3 - len(r[6:9]))
        out.append(LatRow(int(r[0]), int(r[1]), r[2], r[3], r[4], r[5], *extra))
    return out


def run_pair(server: str, client: str, launch, *, test: str, device: str, port: int, server_addr: str,
             deadline_s: float, gid_index: int | None = None, client_device: str | None = None) -> PairMeasure:
    """Server on `server` (RDMA device `device`), client on `client` (`client_device`, the same name when not
    given), through `launch(node, argv) -> Popen` (an srun step on that node, for instance); both are killed at
    the deadline. The figure comes from the client's output."""
    unit = "Gb/s" if test == "bw" else "us"
    srv = launch(server, argv(test, device, port, gid_index=gid_index))
    try:
        time.sleep(SERVER_START_S)
        cli = launch(client, argv(test, client_device or device, port, server=server_addr, gid_index=gid_index))
        try:
            out, err = cli.communicate(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            kill_tree(cli.pid)
            return PairMeasure(server, client, test, None, unit, f"no result within {deadline_s:g} s (hung)")
    finally:
        if srv.poll() is None:
            kill_tree(srv.pid)
    text = out if isinstance(out, str) else (out or b"").decode(errors="replace")
    try:
        value = parse_bw(text)[-1].average_gbps if test == "bw" else parse_lat(text)[-1].t_typical_us
    except ValueError as e:
        tail = (err if isinstance(err, str) else (err or b"").decode(errors="replace")).strip()[-300:]
        if any(s in tail or s in text for s in _NO_DEVICE):
            return PairMeasure(server, client, test, None, unit, f"not present: no RDMA device on {client} (perftest "
                               f"exit {cli.returncode}: 'Did not detect devices')")
        return PairMeasure(server, client, test, None, unit, f"exit {cli.returncode}: {tail or e}")
    return PairMeasure(server, client, test, value, unit, "ok")
