"""nccl_log_analyze — what NCCL set up, read from NCCL_DEBUG=INFO output, and what in it is wrong.

Parses the INFO/WARN lines NCCL prints at communicator init (any NCCL 2.x; lines may carry torchrun /
srun / mpirun prefixes and come from many processes interleaved): NCCL version per process, each rank's
host / GPU / PCI bus id, network plugin and transport (IB, RoCE, Socket, a plugin), NICs and their speed,
GPUDirect RDMA, P2P / SHM / NVLS, channel counts, ring and tree graphs, the TUNING table and algorithm
choices, NCCL_* settings and warnings. Flags: socket fallback where InfiniBand exists, GDR off, hosts that
see different NICs or bootstrap over different interfaces, ranks that leave NICs idle, slow NICs, P2P
disabled, traffic forced over PCIe or through the CPU, mismatched NCCL versions, ranks whose init never
completed.

Get a log (any workload; a one-step all_reduce is enough):
    one GPU / one node:  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH,ENV,TUNING,NET \
                         torchrun --standalone --nproc-per-node 8 train.py 2>&1 | tee nccl.log
    several nodes:       add NCCL_DEBUG_FILE=/shared/nccl.%h.%p (one file per process), or collect the
                         srun output: srun --label ... 2>&1 | tee nccl.log
    scripts/gpu_nccl_logs.sh writes such logs with a tiny all_reduce.
Then:
    python -m tools.nccl_log_analyze --paths nccl.log
    python -m tools.nccl_log_analyze --paths '/shared/nccl.*' --json
"""

import re
from collections import Counter
from dataclasses import dataclass, field

from pydantic import BaseModel

from tools.harness import (
    Field,
    Progress,
    Result,
    ToolFailure,
    ToolSpec,
    load_data,
    main,
)
from tools.log_triage import (
    LogInputParams,
    NotText,
    iter_text_blocks,
    iter_text_chunks_of_string,
    ranks_phrase,
    resolve_paths,
)

# `host:pid:tid [cudaDev] (file.cc:123 )?NCCL INFO|WARN message`, anywhere in the line (labels before it).
_HEAD = re.compile(r"(?P<host>[^\s:\[\]]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] (?:(?P<src>[\w./-]+:\d+) )?"
                   r"NCCL (?P<level>INFO|WARN|TRACE|ABORT) ?(?P<msg>.*)$")
_BARE = re.compile(r"(?:\[(?P<dev>\d+)\] )?NCCL (?P<level>INFO|WARN) ?(?P<msg>.*)$")
_VERSION = re.compile(r"NCCL version (?P<v>\d+\.\d+\.\d+)(?:[-+]\w*?cuda(?P<cuda>[\d.]+))?")

MSG = {name: re.compile(rx) for name, rx in {
    "bootstrap": r"^Bootstrap ?: Using (?P<iface>[^:\s]+):(?P<ip>[^<\s]+)<\d+>",
    "plugin_loaded": r"^NET/Plugin ?: Loaded (?:net )?plugin (?P<name>.+?)(?: \(v\d+\))?$",
    "plugin_none": r"^NET/Plugin ?: (?:No plugin found|Could not find: libnccl-net|Plugin load .* returned)",
    "ib_using": r"^NET/IB ?: Using (?P<list>.*?)(?:\s*;\s*OOB (?P<oob>[^:\s]+):(?P<ip>[^<\s]+)<\d+>)?\s*$",
    "ib_none": r"^NET/IB ?: No device found",
    "socket_using": r"^NET/Socket ?: Using (?P<list>.*)$",
    "network": r"^Using (?:non-device )?network (?P<net>.+?)\s*$",
    "init": r"(?:comm (?P<comm>0x[0-9a-f]+) )?rank (?P<rank>\d+) nranks (?P<nranks>\d+) cudaDev (?P<cudadev>\d+)"
            r"(?: nvmlDev (?P<nvml>\d+))?(?: busId (?P<busid>[0-9a-fA-F]+))?(?: commId (?P<commid>0x[0-9a-f]+))?"
            r"(?: localSize \d+)? - Init (?P<state>START|COMPLETE)",
    "nodes": r"rank (?P<rank>\d+) nRanks (?P<nranks>\d+) nNodes (?P<nnodes>\d+) localRanks (?P<local>\d+)",
    "env": r"^(?P<var>NCCL_\w+) set (?:by environment )?to (?P<value>.*?)\.?\s*$",
    "gdr": r"GPU Direct RDMA (?P<state>Enabled|Disabled) for (?:GPU (?P<gpu>\w+) / )?HCA (?P<hca>\d+)"
           r"(?: '(?P<name>[^']+)')?(?: \(distance (?P<dist>\d+) (?:<=|>) (?P<level>\d+)\))?",
    "p2p_off": r"^P2P is disabled between connected GPUs (?P<a>\d+) and (?P<b>\d+)",
    "nvls": r"^NVLS multicast support is (?P<not>not )?available on dev (?P<dev>\d+)",
    "channels": r"^(?P<coll>\d+) coll channels, (?:(?P<collnet>\d+) collnet channels, )?(?:(?P<nvls>\d+) nvls "
                r"channels, )?(?P<p2p>\d+) p2p channels, (?P<per_peer>\d+) p2p channels per peer",
    "edge": r"^(?:Channel|Ring) (?P<ch>\d+)(?:/(?P<sub>\d+))? : (?P<src>\d+)(?:\[(?P<srcdev>\w+)\])? -> "
            r"(?P<dst>\d+)(?:\[(?P<dstdev>\w+)\])?(?: \[(?P<dir>send|receive)\])? via "
            r"(?P<via>NET/[^/]+/\S+|\S+(?: pointer/\S+)?)",
    "ring": r"^(?:Channel (?P<ch>\d+)/\d+|Ring (?P<ch2>\d+)) :(?P<order>(?:\s+\d+)+)\s*$",
    "trees": r"^Trees? (?P<trees>\[\d+\].*)$",
    "pattern": r"^Pattern (?P<pattern>\d+), crossNic (?P<cross>\d+), nChannels (?P<nch>\d+), (?:bw|speed) "
               r"(?P<bw_intra>[\d.]+)/(?P<bw_inter>[\d.]+), type (?P<t_intra>\w+)/(?P<t_inter>\w+)",
    "topo_net": r"\+ NET\[(?P<bw>[\d.]+)\] - NET/(?P<idx>\d+) \((?P<guid>\w+)/(?P<port>\d+)/(?P<speed>[\d.]+)\)",
    "algo_choice": r"(?P<bytes>\d+) Bytes -> Algo (?P<algo>\w+) proto (?P<proto>\w+) time (?P<time>[\d.]+)",
    "tuning_header": r"^\s*(?P<kind>Algorithm|Protocol|Latency/AlgBw)\s*\|(?P<cells>.*)$",
    "tuning_row": r"^\s*(?P<op>Broadcast|Reduce|AllGather|ReduceScatter|AllReduce)\s*\|(?P<cells>.*)$",
}.items()}

# A literal each message of that kind contains: a cheap test before the regex (NCCL logs run to millions of lines).
HINTS = {"bootstrap": "Bootstrap", "plugin_loaded": "NET/Plugin", "plugin_none": "NET/Plugin", "ib_using": "NET/IB",
         "ib_none": "NET/IB", "socket_using": "NET/Socket", "network": "network ", "init": " - Init ", "nodes": "nNodes",
         "env": "NCCL_", "gdr": "GPU Direct RDMA", "p2p_off": "P2P is disabled", "nvls": "NVLS multicast",
         "channels": "coll channels", "edge": " via ", "ring": " : ", "trees": "Tree", "pattern": "Pattern ",
         "topo_net": "NET[", "algo_choice": "Bytes -> Algo", "tuning_header": "|", "tuning_row": "|"}

PATTERNS = {1: "balanced tree", 2: "split tree", 3: "tree", 4: "ring", 5: "NVLS", 6: "NVLS tree", 7: "CollNet direct",
            8: "CollNet chain"}
ALGOS = {"0": "Tree", "1": "Ring", "2": "CollNetDirect", "3": "CollNetChain", "4": "NVLS", "5": "NVLSTree", "6": "PAT"}
PROTOS = {"0": "LL", "1": "LL128", "2": "Simple"}
# Paths NCCL's topology reports, nearest first: NVLink, PCIe switch (one or several), host bridge, the
# CPU's PCIe root (NODE), across the CPU interconnect (SYS).
CPU_PATHS = {"PHB", "NODE", "SYS"}
PCIE_PATHS = {"PIX", "PXB"}
VIRTUAL_IFACES = ("lo", "docker", "virbr", "veth", "cni", "flannel", "br-")


@dataclass
class Proc:
    host: str
    pid: str
    devs: set = field(default_factory=set)
    version: str | None = None
    env: dict = field(default_factory=dict)
    networks: set = field(default_factory=set)
    plugin: str | None = None
    ib_nics: dict = field(default_factory=dict)       # index -> (name, port, link layer)
    socket_ifaces: list = field(default_factory=list)
    bootstrap: str | None = None
    gdr_enabled: int = 0
    gdr_disabled: list = field(default_factory=list)
    net_devs_used: Counter = field(default_factory=Counter)
    ib_edges: int = 0
    ib_gdr_edges: int = 0
    nvls: bool | None = None
    ib_none: bool = False


@dataclass
class Parsed:
    procs: dict = field(default_factory=dict)
    comms: dict = field(default_factory=dict)          # commId/comm -> {"nranks", "ranks": {rank: info}}
    loose_versions: set = field(default_factory=set)
    transports: Counter = field(default_factory=Counter)
    shm_pairs: set = field(default_factory=set)
    p2p_off_pairs: set = field(default_factory=set)
    channels: list = field(default_factory=list)
    rings: list = field(default_factory=list)
    trees: list = field(default_factory=list)
    graphs: list = field(default_factory=list)
    nic_speeds: dict = field(default_factory=dict)     # (host, idx) -> GB/s
    nnodes: int | None = None
    tuning_pairs: list = field(default_factory=list)
    tuning: dict = field(default_factory=dict)
    algo_choices: Counter = field(default_factory=Counter)
    warnings: Counter = field(default_factory=Counter)
    lines: int = 0
    nccl_lines: int = 0


def _proc(parsed: Parsed, host: str, pid: str) -> Proc:
    key = (host, pid)
    if key not in parsed.procs:
        parsed.procs[key] = Proc(host, pid)
    return parsed.procs[key]


def parse_line(parsed: Parsed, line: str) -> None:
    """Fold one log line into `parsed` (lines without 'NCCL' are skipped by the caller)."""
    m = _HEAD.search(line)
    if m:
        proc = _proc(parsed, m["host"], m["pid"])
        proc.devs.add(int(m["dev"]))
        level, msg = m["level"], m["msg"].strip()
    else:
        v = _VERSION.search(line)
        if v:  # the bare "NCCL version 2.x.y+cudaX" line rank 0 prints
            parsed.loose_versions.add(v["v"])
            parsed.nccl_lines += 1
            return
        m = _BARE.search(line)
        if not m:
            return
        proc = _proc(parsed, "?", "?")
        level, msg = m["level"], m["msg"].strip()
    parsed.nccl_lines += 1
    if level == "WARN":
        parsed.warnings[re.sub(r"\b\d+\b|0x[0-9a-f]+", "N", msg)[:200]] += 1
        return
    _parse_info(parsed, proc, msg)


def _parse_info(parsed: Parsed, proc: Proc, msg: str) -> None:
    v = _VERSION.search(msg)
    if v:
        proc.version = v["v"]
        return
    for name, rx in MSG.items():
        if HINTS[name] not in msg:
            continue
        m = rx.search(msg)
        if m:
            _HANDLERS[name](parsed, proc, m)
            return


def _on_bootstrap(parsed, proc, m):
    proc.bootstrap = m["iface"]


def _on_plugin_loaded(parsed, proc, m):
    proc.plugin = m["name"]


def _on_plugin_none(parsed, proc, m):
    proc.plugin = proc.plugin or "internal"


def _on_ib_using(parsed, proc, m):
    for idx, name, port, layer in re.findall(r"\[(\d+)\]([\w.\-]+):(\d+)/(IB|RoCE)", m["list"]):
        proc.ib_nics[int(idx)] = (name, int(port), layer)
    if m["oob"] and not proc.bootstrap:
        proc.bootstrap = m["oob"]


def _on_ib_none(parsed, proc, m):
    proc.ib_none = True


def _on_socket_using(parsed, proc, m):
    proc.socket_ifaces = [name for _, name in re.findall(r"\[(\d+)\]([^:\s]+):", m["list"])]


def _on_network(parsed, proc, m):
    proc.networks.add(m["net"])


def _on_init(parsed, proc, m):
    # commId is shared by all ranks of a communicator; older NCCL prints only the per-process comm pointer,
    # so communicators of the same size are taken as one there.
    key = m["commid"] or f"nranks={m['nranks']}"
    comm = parsed.comms.setdefault(key, {"nranks": int(m["nranks"]), "ranks": {}})
    info = comm["ranks"].setdefault(int(m["rank"]), {"host": proc.host, "pid": proc.pid, "cuda_dev": int(m["cudadev"]),
                                                     "bus_id": m["busid"], "complete": False})
    if m["state"] == "COMPLETE":
        info["complete"] = True


def _on_nodes(parsed, proc, m):
    parsed.nnodes = max(parsed.nnodes or 0, int(m["nnodes"]))


def _on_env(parsed, proc, m):
    proc.env[m["var"]] = m["value"]


def _on_gdr(parsed, proc, m):
    if m["state"] == "Enabled":
        proc.gdr_enabled += 1
    else:
        why = f" (distance {m['dist']} > level {m['level']})" if m["dist"] else ""
        proc.gdr_disabled.append(f"HCA {m['hca']}{' ' + repr(m['name']) if m['name'] else ''}{why}")


def _on_p2p_off(parsed, proc, m):
    parsed.p2p_off_pairs.add(tuple(sorted((int(m["a"]), int(m["b"])))))


def _on_nvls(parsed, proc, m):
    proc.nvls = not m["not"]


def _on_channels(parsed, proc, m):
    if len(parsed.channels) < 64:
        parsed.channels.append({k: int(v) for k, v in m.groupdict().items() if v is not None})


def transport_of(via: str) -> str:
    """'P2P/CUMEM/read' -> p2p, 'SHM/direct/direct' -> shm, 'NET/IB/0/GDRDMA' -> net_ib_gdr, ..."""
    head = via.split("/")
    if head[0] == "P2P":
        return "p2p"
    if head[0] == "SHM":
        return "shm"
    if head[0] == "NET":
        kind = head[1] if len(head) > 1 else "?"
        if kind == "Socket":
            return "net_socket"
        if kind.startswith("IB"):
            return "net_ib_gdr" if "GDRDMA" in via else "net_ib"
        return "net_plugin_gdr" if "GDRDMA" in via else "net_plugin"
    if head[0].startswith("COLLNET"):
        return "collnet"
    if head[0].startswith("NVLS"):
        return "nvls"
    return head[0].lower()


def _on_edge(parsed, proc, m):
    kind = transport_of(m["via"])
    parsed.transports[kind] += 1
    if kind == "shm":
        parsed.shm_pairs.add(tuple(sorted((int(m["src"]), int(m["dst"])))))
    if kind.startswith("net_ib"):
        proc.ib_edges += 1
        proc.ib_gdr_edges += kind == "net_ib_gdr"
    net = re.match(r"NET/[^/]+/(\d+)", m["via"])
    if net:
        proc.net_devs_used[int(net[1])] += 1


def _on_ring(parsed, proc, m):
    if len(parsed.rings) < 8:
        parsed.rings.append(" ".join(m["order"].split()))


def _on_trees(parsed, proc, m):
    if len(parsed.trees) < 4:
        parsed.trees.append(m["trees"][:300])


def _on_pattern(parsed, proc, m):
    graph = {"pattern": PATTERNS.get(int(m["pattern"]), m["pattern"]), "n_channels": int(m["nch"]),
             "bw_intra_gbps": float(m["bw_intra"]), "bw_inter_gbps": float(m["bw_inter"]),
             "type_intra": m["t_intra"], "type_inter": m["t_inter"], "cross_nic": m["cross"] == "1"}
    if graph not in parsed.graphs and len(parsed.graphs) < 16:
        parsed.graphs.append(graph)


def _on_topo_net(parsed, proc, m):
    parsed.nic_speeds[(proc.host, int(m["idx"]))] = float(m["speed"])


def _on_algo_choice(parsed, proc, m):
    parsed.algo_choices[(int(m["bytes"]), ALGOS.get(m["algo"], m["algo"]), PROTOS.get(m["proto"], m["proto"]))] += 1


def _on_tuning_header(parsed, proc, m):
    cells = [c.strip() for c in m["cells"].split("|") if c.strip()]
    if m["kind"] == "Latency/AlgBw":  # NCCL <= 2.18: "Tree/    LL | Tree/ LL128 | ..."
        parsed.tuning_pairs = [tuple(p.strip() for p in c.split("/")) for c in cells if "/" in c]
    elif m["kind"] == "Algorithm":
        parsed.tuning_pairs = [(c, None) for c in cells]
    elif parsed.tuning_pairs and parsed.tuning_pairs[0][1] is None:  # Protocol row under an Algorithm row
        algos = [a for a, _ in parsed.tuning_pairs]
        protos = [p for c in cells for p in c.split()]  # one cell per protocol, or one per algorithm
        per_algo = max(1, len(protos) // max(1, len(algos)))
        parsed.tuning_pairs = [(algos[i // per_algo], proto) for i, proto in enumerate(protos)
                               if i // per_algo < len(algos)]


def _on_tuning_row(parsed, proc, m):
    if not parsed.tuning_pairs or parsed.tuning_pairs[0][1] is None:
        return
    values = re.findall(r"([\d.]+)\s*/\s*([\d.]+)", m["cells"])
    best = None
    for (algo, proto), (lat, bw) in zip(parsed.tuning_pairs, values):
        if float(bw) > 0 and (best is None or float(bw) > best[2]):
            best = (algo, proto, float(bw), float(lat))
    if best and m["op"] not in parsed.tuning:
        parsed.tuning[m["op"]] = (f"{best[0]}/{best[1]}: highest modelled bandwidth {best[2]:g} GB/s "
                                  f"(latency {best[3]:g} us)")


_HANDLERS = {name: globals()[f"_on_{name}"] for name in MSG}


# ---------------------------------------------------------------------------------------------------
# Reading the input

def parse_paths(paths: list[str], max_files: int, progress: Progress | None = None) -> tuple[Parsed, list, list]:
    files, skipped = resolve_paths(paths, max_files)
    parsed, read = Parsed(), []
    for i, path in enumerate(files):
        if progress:
            progress(i / max(1, len(files)), f"reading {path}")
        try:
            for block in iter_text_blocks(path):
                _parse_block(parsed, block)
        except NotText as exc:
            if len(files) == 1:
                raise ToolFailure(f"{path}: {exc}. Give the text output of a run with NCCL_DEBUG=INFO") from None
            skipped.append(f"{path} ({exc})")
            continue
        except OSError as exc:
            skipped.append(f"{path} (cannot read: {exc.strerror or exc})")
            continue
        read.append(str(path))
    if not read and skipped:
        raise ToolFailure("no readable text log among the paths given: " + "; ".join(skipped[:5]))
    return parsed, read, skipped


def parse_text(text: str) -> Parsed:
    parsed = Parsed()
    for block in iter_text_chunks_of_string(text):
        _parse_block(parsed, block)
    return parsed


def _parse_block(parsed: Parsed, block: str) -> None:
    lines = block.splitlines()
    parsed.lines += len(lines)
    for line in lines:
        if "NCCL" in line:
            parse_line(parsed, line)


# ---------------------------------------------------------------------------------------------------
# Result

class RankInfo(BaseModel):
    rank: int = Field(description="Rank in the largest communicator.")
    host: str = Field(description="Host name as NCCL printed it.")
    pid: str = Field(description="Process id.")
    cuda_dev: int = Field(description="CUDA device index in that process.")
    bus_id: str | None = Field(None, description="PCI bus id of the GPU (NCCL's short form, e.g. 18000).")
    nics_used: list[str] = Field(default_factory=list, description="Network devices its channels go through.")
    init_complete: bool = Field(True, description="Whether 'Init COMPLETE' was seen for it.")


class NicInfo(BaseModel):
    host: str = Field(description="Host.")
    index: int = Field(description="NCCL's NET device index.")
    name: str = Field(description="Device (mlx5_0) or interface (eth0) name.")
    kind: str = Field(description="IB | RoCE | Socket")
    speed_gbps: float | None = Field(None, description="Speed from NCCL's topology dump, GB/s decimal (50 = 400 Gb/s).")


class NcclLogParams(LogInputParams):
    """paths: NCCL_DEBUG=INFO output, e.g. one file per process from NCCL_DEBUG_FILE, or a directory of them."""

    max_ranks: int = Field(64, ge=0, le=100_000, description="List at most this many ranks in the result.")


class NcclLogResult(Result):
    problems: list[str] = Field(default_factory=list, description=(
        "Ids of what was flagged: socket_fallback, socket_inter_node, gdr_off, nic_mismatch, bootstrap_mismatch, "
        "virtual_interface, nic_idle, slow_nic, p2p_disabled, intra_node_via_cpu, intra_node_pcie, "
        "nic_via_cpu, version_mismatch, init_incomplete, nccl_warnings, forced_settings."))
    nccl_versions: dict[str, int] = Field(default_factory=dict, description="NCCL version -> number of processes.")
    hosts: list[str] = Field(default_factory=list, description="Hosts seen.")
    processes: int = Field(0, description="Processes that printed NCCL lines.")
    world_size: int | None = Field(None, description="nranks of the largest communicator.")
    nodes: int | None = Field(None, description="nNodes NCCL reported, else distinct hosts.")
    network: list[str] = Field(default_factory=list, description="'Using network X' values: IB, Socket, a plugin.")
    net_plugin: list[str] = Field(default_factory=list, description="Network plugins loaded ('internal' = NCCL's own).")
    nics: list[NicInfo] = Field(default_factory=list, description="NICs NCCL listed per host (first 64).")
    bootstrap_interfaces: dict[str, str] = Field(default_factory=dict, description="Host -> interface used for bootstrap.")
    transports: dict[str, int] = Field(default_factory=dict, description=(
        "Channel connections by transport: p2p, shm, nvls, collnet, net_ib, net_ib_gdr, net_socket, net_plugin(_gdr)."))
    gdr: str = Field("n/a", description="GPUDirect RDMA: on | off | partial | n/a (no RDMA network used).")
    nvls_available: bool | None = Field(None, description="NVLS multicast available (NVSwitch SHARP) on the GPUs.")
    channels: dict[str, int] = Field(default_factory=dict, description="coll / collnet / nvls / p2p channels of the first communicator.")
    rings: list[str] = Field(default_factory=list, description="Ring orders (first 8 channels).")
    trees: list[str] = Field(default_factory=list, description="Tree lines (first 4).")
    graphs: list[dict] = Field(default_factory=list, description="Search results: pattern, channels, bandwidth (GB/s), path types.")
    tuning: dict[str, str] = Field(default_factory=dict, description="Per collective, the algorithm/protocol with the highest "
                                   "modelled bandwidth in the TUNING table.")
    algo_choices: list[str] = Field(default_factory=list, description="'bytes -> algo/proto' lines printed (TUNING, newer NCCL).")
    env: dict[str, str] = Field(default_factory=dict, description="NCCL_* settings NCCL reported reading.")
    warnings: list[str] = Field(default_factory=list, description="Distinct NCCL WARN messages with counts (first 20).")
    ranks: list[RankInfo] = Field(default_factory=list, description="Per rank: host, GPU, bus id, NICs (first max_ranks).")
    ranks_omitted: int = Field(0, description="Ranks not listed (max_ranks).")
    expected_busbw_per_nic_gbps: float | None = Field(None, description=(
        "Large-message busbw a healthy fabric reaches per NIC of this kind and speed (knowledge/data/"
        "interconnects.toml), GB/s decimal: what collective_bench should show between nodes with NCCL_ALGO=Ring."))
    lines_scanned: int = Field(0, description="Lines read.")
    nccl_lines: int = Field(0, description="Lines that were NCCL output.")


# ---------------------------------------------------------------------------------------------------
# Analysis

NEXT = {
    "socket_fallback": ["knowledge://network/inter-node.md", "knowledge://network/nccl-env.md", "collective_bench"],
    "socket_inter_node": ["knowledge://network/inter-node.md", "collective_bench"],
    "gdr_off": ["gpu_topology", "knowledge://network/inter-node.md"],
    "nic_via_cpu": ["gpu_topology", "knowledge://network/inter-node.md"],
    "nic_mismatch": ["knowledge://network/nccl-debugging.md"],
    "bootstrap_mismatch": ["knowledge://network/nccl-env.md"],
    "virtual_interface": ["knowledge://network/nccl-env.md"],
    "nic_idle": ["gpu_topology", "knowledge://network/inter-node.md"],
    "slow_nic": ["knowledge://network/inter-node.md", "collective_bench"],
    "p2p_disabled": ["p2p_bandwidth", "gpu_topology", "knowledge://network/intra-node.md"],
    "intra_node_via_cpu": ["gpu_topology", "p2p_bandwidth", "knowledge://network/intra-node.md"],
    "intra_node_pcie": ["gpu_topology", "knowledge://network/intra-node.md"],
    "version_mismatch": ["env_report", "knowledge://debugging/version-drift.md"],
    "init_incomplete": ["dist_smoke_test", "log_triage", "knowledge://network/nccl-debugging.md"],
    "nccl_warnings": ["log_triage", "knowledge://network/nccl-debugging.md"],
    "forced_settings": ["env_report", "knowledge://network/nccl-env.md"],
}
FORCING_VARS = ("NCCL_ALGO", "NCCL_PROTO", "NCCL_IB_DISABLE", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_NET_GDR_LEVEL",
                "NCCL_P2P_LEVEL", "NCCL_MAX_NCHANNELS", "NCCL_MIN_NCHANNELS", "NCCL_NVLS_ENABLE", "NCCL_NET",
                "NCCL_CROSS_NIC", "NCCL_BUFFSIZE")


@dataclass
class _Report:
    findings: list = field(default_factory=list)
    problems: list = field(default_factory=list)
    severities: list = field(default_factory=list)

    def flag(self, problem: str, severity: str, text: str) -> None:
        if problem not in self.problems:
            self.problems.append(problem)
        self.severities.append(severity)
        self.findings.append(text)


def _names(items) -> str:
    items = sorted(items)
    return ", ".join(items[:6]) + (f" and {len(items) - 6} more" if len(items) > 6 else "")


def _largest_comm(parsed: Parsed) -> dict | None:
    return max(parsed.comms.values(), key=lambda c: (c["nranks"], len(c["ranks"])), default=None)


def _check_versions(parsed: Parsed, procs: list[Proc], rep: _Report) -> Counter:
    versions = Counter(p.version for p in procs if p.version)
    for v in parsed.loose_versions - set(versions):
        versions[v] = 1
    if len(versions) > 1:
        by = "; ".join(f"{v} on {_names({p.host for p in procs if p.version == v}) or 'some process'}"
                       for v in sorted(versions))
        rep.flag("version_mismatch", "fail", f"NCCL versions differ between processes ({by}): mixed NCCL builds "
                 "can hang or fail at init; install one torch / NCCL everywhere.")
    return versions


def _check_init(comm: dict | None, rep: _Report) -> None:
    if not comm:
        return
    stuck = [r for r, info in comm["ranks"].items() if not info["complete"]]
    if stuck and len(stuck) < len(comm["ranks"]):
        hosts = {comm["ranks"][r]["host"] for r in stuck}
        rep.flag("init_incomplete", "fail", f"{ranks_phrase(stuck).capitalize()} (on {_names(hosts)}) started communicator "
                 "init but never printed 'Init COMPLETE' while the others did: they hung or died during init; read "
                 "their WARN lines and their network setup.")
    elif stuck:
        rep.flag("init_incomplete", "warn", "No rank printed 'Init COMPLETE': communicator init hung everywhere "
                 "(bootstrap or network connection), or the log was cut before init finished.")
    missing = comm["nranks"] - len(comm["ranks"])
    if missing > 0:
        rep.findings.append(f"Only {len(comm['ranks'])} of {comm['nranks']} ranks appear in these logs; the others' "
                            "lines are elsewhere (NCCL_DEBUG_FILE per process, other nodes' output).")


def _check_network(parsed: Parsed, procs: list[Proc], nodes: int, rep: _Report) -> str:
    t = parsed.transports
    networks = set().union(*(p.networks for p in procs)) if procs else set()
    sockets_used = "Socket" in networks or t["net_socket"] > 0
    ib_listed = {(p.host, nic[0]) for p in procs for nic in p.ib_nics.values()}
    ib_disabled = {p.host for p in procs if p.env.get("NCCL_IB_DISABLE") == "1"}
    ipoib = {(p.host, i) for p in procs for i in p.socket_ifaces if i.startswith("ib")}
    if sockets_used and (ib_listed or ib_disabled or ipoib):
        why = ("NCCL_IB_DISABLE=1 is set" if ib_disabled else
               f"RDMA devices are listed ({_names({n for _, n in ib_listed})})" if ib_listed else
               f"sockets run over IPoIB interfaces ({_names({i for _, i in ipoib})}), so IB hardware is there")
        rep.flag("socket_fallback", "fail", f"Inter-node traffic uses TCP sockets although {why}: expect a few GB/s "
                 "instead of ~45 GB/s per 400 Gb/s NIC. Unset NCCL_IB_DISABLE, and make the RDMA stack visible "
                 "(/dev/infiniband in the container, libibverbs, the NIC's driver).")
    elif sockets_used and (nodes > 1 or t["net_socket"] or all(p.host == "?" for p in procs)):
        rep.flag("socket_inter_node", "warn", "Inter-node traffic uses TCP sockets (no RDMA NIC found"
                 + (": 'NET/IB : No device found'" if any(p.ib_none for p in procs) else "") + "); fine on "
                 "Ethernet-only clusters, but collectives between nodes will be limited to a few GB/s.")
    rdma = t["net_ib"] + t["net_ib_gdr"] + t["net_plugin"] + t["net_plugin_gdr"]
    gdr_edges = t["net_ib_gdr"] + t["net_plugin_gdr"]
    disabled = [(p.host, d) for p in procs for d in p.gdr_disabled]
    # No RDMA connection, no GPUDirect question: NCCL's Socket transport prints "GPU Direct RDMA Disabled
    # for HCA 0 'eth0'" on every run, single-node ones included (seen on the 2xH200 machine).
    gdr = ("n/a" if not rdma else "on" if gdr_edges == rdma and not disabled
           else "off" if not gdr_edges else "partial")
    if gdr in ("off", "partial"):
        where = _names({h for h, _ in disabled}) or _names({p.host for p in procs if p.ib_edges > p.ib_gdr_edges})
        detail = f" ({disabled[0][1]})" if disabled else ""
        rep.flag("gdr_off", "warn", f"GPUDirect RDMA is {gdr} ({gdr_edges} of {rdma} network connections use it; "
                 f"hosts: {where or 'unknown'}{detail}): network data bounces through host memory. Check that the "
                 "nvidia_peermem (or dmabuf) module is loaded and the GPU-NIC distance; NCCL_NET_GDR_LEVEL=SYS forces "
                 "it. On GH200/GB200 NCCL leaves it off by default.")
    return gdr


def _check_nics(parsed: Parsed, procs: list[Proc], nodes: int, rank_hosts: Counter, rep: _Report) -> None:
    by_host: dict[str, Proc] = {}
    for p in procs:
        if p.ib_nics and p.host not in by_host:
            by_host[p.host] = p
    sets = {h: frozenset(n[0] for n in p.ib_nics.values()) for h, p in by_host.items()}
    if len(set(sets.values())) > 1:
        parts = "; ".join(f"{h}: {len(s)} ({_names(s)})" for h, s in sorted(sets.items())[:6])
        rep.flag("nic_mismatch", "warn", f"Hosts see different RDMA NICs ({parts}): a port down, a missing device in "
                 "the container, or a different NCCL_IB_HCA. Ranks on the short host limit every collective.")
    boots = {p.host: p.bootstrap for p in procs if p.bootstrap and p.host != "?"}
    if len(set(boots.values())) > 1:
        rep.flag("bootstrap_mismatch", "warn", "Hosts bootstrap over different interfaces (" + "; ".join(
            f"{h}: {i}" for h, i in sorted(boots.items())[:6]) + "): set NCCL_SOCKET_IFNAME to the one they share.")
    virtual = {(h, i) for h, i in boots.items() if i.startswith(VIRTUAL_IFACES)}
    virtual |= {(p.host, i) for p in procs for i in p.socket_ifaces if i.startswith(VIRTUAL_IFACES)}
    if virtual and nodes > 1:
        rep.flag("virtual_interface", "warn", f"NCCL uses a loopback or virtual interface ({_names({f'{h}:{i}' for h, i in virtual})}) "
                 "on a multi-node job: peers cannot reach it. Set NCCL_SOCKET_IFNAME to the real network interface.")
    for host, proc in sorted(by_host.items()):
        used = set().union(*(p.net_devs_used for p in procs if p.host == host))
        listed = len(proc.ib_nics)
        gpus = rank_hosts.get(host, 0) or len({d for p in procs if p.host == host for d in p.devs})
        if used and listed > 1 and len(used) < min(listed, gpus):
            names = _names(proc.ib_nics.get(i, (f"NET/{i}",))[0] for i in used)
            rep.flag("nic_idle", "warn", f"On {host} the {gpus} ranks send over {len(used)} of {listed} NICs ({names}); "
                     "the others stay idle. Check NCCL_IB_HCA, the GPU-NIC topology (gpu_topology) and PXN.")
            break
    speeds = parsed.nic_speeds
    if speeds:
        top = max(speeds.values())
        slow = {(h, i): s for (h, i), s in speeds.items() if s < 0.75 * top}
        if slow:
            (h, i), s = next(iter(sorted(slow.items())))
            rep.flag("slow_nic", "warn", f"{len(slow)} NIC(s) run slower than the rest: NET/{i} on {h} at {s:g} GB/s "
                     f"vs {top:g} GB/s (a lower-speed port or a link trained down); collectives run at the slowest "
                     "link's pace.")


def _check_intra(parsed: Parsed, procs: list[Proc], rank_hosts: Counter, rep: _Report) -> None:
    multi_gpu_host = any(n > 1 for n in rank_hosts.values()) or any(len(p.devs) > 1 for p in procs)
    p2p_env = {p.host for p in procs if p.env.get("NCCL_P2P_DISABLE") == "1"}
    if p2p_env or parsed.p2p_off_pairs:
        pairs = ", ".join(f"{a}-{b}" for a, b in sorted(parsed.p2p_off_pairs)[:8])
        why = f"NCCL_P2P_DISABLE=1 on {_names(p2p_env)}" if p2p_env else f"CUDA refuses peer access between GPUs {pairs}"
        rep.flag("p2p_disabled", "warn", f"P2P between GPUs is off ({why}): intra-node traffic goes through host memory. "
                 "On PCIe systems this is often ACS or IOMMU (disable ACS, iommu=pt); check with p2p_bandwidth.")
    if parsed.transports["shm"]:
        rep.flag("intra_node_via_cpu", "warn", f"{parsed.transports['shm']} channel connections use SHM: GPU data is "
                 "staged through host memory and the CPU instead of NVLink or PCIe peer-to-peer.")
    for g in parsed.graphs:
        if multi_gpu_host and g["type_intra"] in CPU_PATHS:
            rep.flag("intra_node_via_cpu", "warn", f"NCCL's {g['pattern']} graph crosses the CPU between GPUs (path type "
                     f"{g['type_intra']}, {g['bw_intra_gbps']:g} GB/s per channel): the GPUs hang off different "
                     "PCIe roots or sockets, or NVLink is not used.")
            break
        if multi_gpu_host and g["type_intra"] in PCIE_PATHS:
            rep.flag("intra_node_pcie", "info", f"GPU-to-GPU paths go over PCIe switches (type {g['type_intra']}, "
                     f"{g['bw_intra_gbps']:g} GB/s per channel), not NVLink: expected on PCIe-only servers.")
            break
    for g in parsed.graphs:
        if g["type_inter"] == "SYS" and g["bw_inter_gbps"] > 0 and parsed.transports.total() - \
                parsed.transports["p2p"] - parsed.transports["shm"] - parsed.transports["nvls"] > 0:
            rep.flag("nic_via_cpu", "warn", f"GPU-to-NIC paths cross the CPU (type {g['type_inter']}): the NIC is on "
                     "another PCIe root or socket than the GPU, so GPUDirect RDMA is slow or off.")
            break


def _rank_models(parsed: Parsed, comm: dict | None, max_ranks: int) -> tuple[list[RankInfo], int]:
    if not comm:
        return [], 0
    out = []
    for rank, info in sorted(comm["ranks"].items())[:max_ranks]:
        proc = parsed.procs.get((info["host"], info["pid"]))
        nics = [proc.ib_nics.get(i, (f"NET/{i}",))[0] for i in sorted(proc.net_devs_used)] if proc else []
        out.append(RankInfo(rank=rank, host=info["host"], pid=info["pid"], cuda_dev=info["cuda_dev"],
                            bus_id=info["bus_id"], nics_used=nics, init_complete=info["complete"]))
    return out, max(0, len(comm["ranks"]) - max_ranks)


def _nic_models(parsed: Parsed, procs: list[Proc]) -> list[NicInfo]:
    nics, seen = [], set()
    for p in procs:
        entries = [(i, n, layer) for i, (n, _, layer) in sorted(p.ib_nics.items())]
        if not entries and ("Socket" in p.networks or not p.networks):
            entries = [(i, n, "Socket") for i, n in enumerate(p.socket_ifaces)]
        for idx, name, kind in entries:
            if (p.host, idx, name) not in seen and len(nics) < 64:
                seen.add((p.host, idx, name))
                nics.append(NicInfo(host=p.host, index=idx, name=name, kind=kind,
                                    speed_gbps=parsed.nic_speeds.get((p.host, idx))))
    return nics


def expected_per_nic(nics: list[NicInfo]) -> tuple[str, float] | None:
    """(link name, expected busbw GB/s) for the NICs' kind and speed, from interconnects.toml."""
    kinds = {(n.kind, n.speed_gbps) for n in nics if n.speed_gbps and n.kind in ("IB", "RoCE")}
    if len(kinds) != 1:
        return None
    kind, speed = kinds.pop()
    try:
        data = load_data("interconnects")
    except ToolFailure:
        return None
    wanted = "infiniband" if kind == "IB" else "roce"
    for link in data.get("link", []):
        if link.get("kind") == wanted and abs(link.get("per_gpu_unidir_gbps", 0) - speed) < 0.5:
            for exp in data.get("expected_busbw", []):
                if exp.get("link") == link["id"] and exp.get("gpus") == 0:
                    return link["name"], float(exp["busbw_gbps"])
    return None


def _summary(parsed, procs, versions, comm, hosts, nodes, gdr, nics) -> list[str]:
    out = []
    where = f"{len(hosts)} host(s) ({_names(hosts)})" if hosts else "unnamed hosts"
    vtext = ", ".join(f"{v}" for v in sorted(versions)) or "version not printed"
    size = f"; {comm['nranks']} ranks in the largest communicator" if comm else ""
    out.append(f"NCCL {vtext}: {len(procs)} process(es) on {where}{size}.")
    networks = sorted(set().union(*(p.networks for p in procs))) if procs else []
    if networks or nics:
        speeds = sorted({n.speed_gbps for n in nics if n.speed_gbps})
        per_host = Counter(n.host for n in nics)
        nic_text = (f"{max(per_host.values())} NIC(s) per host ({_names({n.name for n in nics})})" if per_host else "no NIC list")
        speed_text = f" at {'/'.join(f'{s:g}' for s in speeds)} GB/s" if speeds else ""
        plugins = sorted({p.plugin for p in procs if p.plugin})
        out.append(f"Network: {', '.join(networks) or 'not printed'}"
                   + (f" (plugin: {', '.join(plugins)})" if plugins else "") + f"; {nic_text}{speed_text}; "
                   f"GPUDirect RDMA: {gdr}.")
    t = parsed.transports
    if t:
        out.append("Channel connections by transport: " + ", ".join(f"{k} {v}" for k, v in t.most_common()) + ".")
    if parsed.channels:
        c = parsed.channels[0]
        out.append(f"Channels: {c.get('coll')} collective, {c.get('nvls', 0)} NVLS, {c.get('collnet', 0)} CollNet, "
                   f"{c.get('p2p')} p2p ({c.get('per_peer')} per peer).")
    for g in parsed.graphs[:2]:
        out.append(f"Graph: {g['pattern']}, {g['n_channels']} channel(s) at {g['bw_intra_gbps']:g}/{g['bw_inter_gbps']:g} "
                   f"GB/s (intra/inter), paths {g['type_intra']}/{g['type_inter']}.")
    for op, text in list(parsed.tuning.items())[:2]:
        out.append(f"TUNING {op}: {text}.")
    return out


def analyse(parsed: Parsed, max_ranks: int = 64) -> NcclLogResult:
    """Everything the parsed lines say, with the problems flagged."""
    procs = [p for p in parsed.procs.values()]
    if not parsed.nccl_lines:
        return NcclLogResult(verdict="info", lines_scanned=parsed.lines, next=["knowledge://network/nccl-debugging.md"],
                             findings=["The log is empty." if not parsed.lines else
                                       f"No NCCL output in {parsed.lines} lines: run the job with NCCL_DEBUG=INFO "
                                       "(and NCCL_DEBUG_SUBSYS=INIT,GRAPH,ENV,TUNING,NET for the full picture)."])
    rep = _Report()
    comm = _largest_comm(parsed)
    hosts = sorted({p.host for p in procs if p.host != "?"})
    nodes = parsed.nnodes or len(hosts) or 1
    rank_hosts = Counter(i["host"] for i in comm["ranks"].values()) if comm else Counter()
    versions = _check_versions(parsed, procs, rep)
    _check_init(comm, rep)
    gdr = _check_network(parsed, procs, nodes, rep)
    _check_nics(parsed, procs, nodes, rank_hosts, rep)
    _check_intra(parsed, procs, rank_hosts, rep)
    if parsed.warnings:
        top = "; ".join(f"{msg} (x{n})" for msg, n in parsed.warnings.most_common(3))
        rep.flag("nccl_warnings", "warn", f"{sum(parsed.warnings.values())} NCCL WARN line(s): {top}.")
    env = {k: v for p in procs for k, v in p.env.items()}
    forced = {k: v for k, v in env.items() if k in FORCING_VARS}
    if forced:
        rep.flag("forced_settings", "info", "Settings that override NCCL's own choices: "
                 + ", ".join(f"{k}={v}" for k, v in sorted(forced.items())) + "; keep them only if measured to help.")
    nics = _nic_models(parsed, procs)
    expected = expected_per_nic(nics)
    closing = []
    if expected and nodes > 1:
        closing.append(f"The NICs are {expected[0]}: a healthy fabric gives about {expected[1]:g} GB/s busbw per NIC "
                       "for large all_reduce messages between nodes (collective_bench, NCCL_ALGO=Ring).")
    ranks, omitted = _rank_models(parsed, comm, max_ranks)
    nvls = [p.nvls for p in procs if p.nvls is not None]
    verdict = "fail" if "fail" in rep.severities else "warn" if "warn" in rep.severities else "ok"
    nxt = [s for problem in rep.problems for s in NEXT.get(problem, [])]
    nxt = list(dict.fromkeys(nxt + ["collective_bench", "knowledge://network/nccl-debugging.md"]))[:6]
    return NcclLogResult(
        verdict=verdict, findings=rep.findings + _summary(parsed, procs, versions, comm, hosts, nodes, gdr, nics) + closing,
        next=nxt, problems=rep.problems, nccl_versions=dict(versions), hosts=hosts, processes=len(procs),
        world_size=comm["nranks"] if comm else None, nodes=nodes if hosts else parsed.nnodes,
        network=sorted(set().union(*(p.networks for p in procs))),
        net_plugin=sorted({p.plugin for p in procs if p.plugin}), nics=nics,
        bootstrap_interfaces={p.host: p.bootstrap for p in procs if p.bootstrap},
        transports=dict(parsed.transports), gdr=gdr, nvls_available=(all(nvls) if nvls else None),
        channels={k: v for k, v in (parsed.channels[0] if parsed.channels else {}).items()},
        rings=parsed.rings, trees=parsed.trees, graphs=parsed.graphs, tuning=parsed.tuning,
        algo_choices=[f"{b} bytes -> {a}/{p}" for (b, a, p), _ in sorted(parsed.algo_choices.items())[:12]],
        env=env, warnings=[f"{m} (x{n})" for m, n in parsed.warnings.most_common(20)], ranks=ranks,
        ranks_omitted=omitted, lines_scanned=parsed.lines, nccl_lines=parsed.nccl_lines,
        expected_busbw_per_nic_gbps=expected[1] if expected else None)


def run(params: NcclLogParams, progress: Progress) -> NcclLogResult:
    if params.text:
        if params.text.count("\x00") > len(params.text) // 100:
            raise ToolFailure("the text holds binary data (NUL bytes); paste the text output of the NCCL_DEBUG=INFO run")
        return analyse(parse_text(params.text), params.max_ranks)
    parsed, _read, skipped = parse_paths(params.paths, params.max_files, progress)
    result = analyse(parsed, params.max_ranks)
    if skipped:
        result.findings.append(f"Skipped {len(skipped)} file(s): " + "; ".join(skipped[:3]))
    return result


SPEC = ToolSpec(
    name="nccl_log_analyze",
    summary="Read NCCL_DEBUG=INFO output: transports, NICs, GPUDirect RDMA, rings/trees, versions; flag what is wrong.",
    description=(
        "Use when you have NCCL_DEBUG=INFO output (a training log, NCCL_DEBUG_FILE files, nccl-tests output) and want "
        "to know how NCCL connected the GPUs and whether that is right (did it fall back to sockets, which NIC or "
        "interface such as eth0 / ib0 / mlx5_0 did each rank pick, what ring and tree did it build): NCCL version "
        "per process, rank -> host/GPU/bus id, network (IB, RoCE, Socket, plugin), NICs and speeds, GPUDirect RDMA, "
        "P2P / SHM / NVLS, channels, ring and tree graphs, TUNING algorithm choices, NCCL_* settings, WARN lines. "
        "Flags socket fallback where InfiniBand exists, GDR off, hosts with different NICs or bootstrap interfaces, "
        "idle or slow NICs, P2P disabled, traffic through the CPU, mismatched NCCL versions, ranks whose init never "
        "completed. Best with NCCL_DEBUG_SUBSYS=INIT,GRAPH,ENV,TUNING,NET. Not for finding which rank crashed in a "
        "training log (log_triage) or for measuring bandwidth (collective_bench). Read-only, reads files only, "
        "needs no GPU."),
    Params=NcclLogParams, Result=NcclLogResult, run=run,
    runs="in_process", read_only=True, destructive=False, idempotent=True, open_world=False, timeout_s=300,
)

if __name__ == "__main__":
    main(SPEC)
