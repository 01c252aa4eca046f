"""nccl_log_analyze — what NCCL set up, read from NCCL_DEBUG=INFO output, and what in it is wrong.

Reads the log host by host (tools/nccl_log_analyze/hosts.py): NCCL version, CUDA driver, net plugin, transport,
NICs, GDR and RoCE GID index per host, and names the host whose net plugin, transport or GID index differs from
the rest (a cause of hangs after init). RoCE "Got completion ... error 12" is judged with the GID index in
tools/nccl_log_analyze/roce.py.

Parses the INFO/WARN lines NCCL prints at communicator init (any NCCL 2.x; lines may carry torchrun /
srun / mpirun prefixes and come from many processes interleaved): NCCL version per process, each rank's
host / GPU / PCI bus id, network plugin and transport (IB, RoCE, Socket, a plugin), NICs and their speed,
GPUDirect RDMA, P2P / SHM / NVLS, channel counts, ring and tree graphs, the TUNING table and algorithm
choices, NCCL_* settings and warnings. Flags: socket fallback where InfiniBand exists, GDR off, hosts that
see different NICs or bootstrap over different interfaces, ranks that leave NICs idle, slow NICs, P2P
disabled, traffic forced over PCIe or through the CPU, mismatched NCCL versions, ranks whose init never
completed, RoCE ports pooled with InfiniBand ports, a second socket interface left idle, settings that differ
from NCCL's documented defaults (knowledge/data/nccl_env_defaults.toml). Also reads what users paste from
nccl-tests (the text table, or a `-J` JSON with `-I` per-iteration data: busbw against the expected figure,
#wrong, per-process stragglers) and from `ncclras` (missing and lagging ranks, for the hang ladder).

Get a log (any workload; a one-step all_reduce is enough):
    one GPU / one node:  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH,ENV,TUNING,NET \
                         torchrun --standalone --nproc-per-node 8 train.py 2>&1 | tee nccl.log
    several nodes:       add NCCL_DEBUG_FILE=/shared/nccl.%h.%p (one file per process), or collect the
                         srun output: srun --label ... 2>&1 | tee nccl.log
    scripts/gpu_nccl_logs.sh writes such logs with a tiny all_reduce.
Then:
    mleng run nccl_log_analyze --paths nccl.log
    mleng run nccl_log_analyze --paths '/shared/nccl.*' --json

The parsing lives in tools/nccl_log_analyze/parse.py (line heads, per-process records) and tools/nccl_log_analyze/messages.py (one
regex and handler per message kind); the checks that flag problems in tools/nccl_log_analyze/checks.py.
"""

from collections import Counter
from collections.abc import Iterator


from ..shared.logscan import LogInputParams, looks_binary, resolve_paths
from ..shared.safe_read import read_head
from .checks import NEXT, check_all, largest_comm, name_list
from .hosts import HostRow, host_rows, hosts_match
from .messages import transport_of
from .outputs import read_all
from .parse import Parsed, Proc, parse_line, parse_paths, parse_text
from ..engine.spec import SELF_EVIDENT, Field, Progress, Record, Result, ToolFailure, ToolSpec, worst
from ..engine.data import load_data

OUTPUT_READ_BYTES = 16 << 20   # nccl-tests output and RAS reports are small; a huge training log is cut here

# What the tests and other modules import from here, although the parsing now lives in the helper modules.
__all__ = ["SPEC", "NcclLogParams", "NcclLogResult", "analyse", "expected_per_nic", "parse_line", "parse_paths",
           "parse_text", "run", "transport_of"]


# ---------------------------------------------------------------------------------------------------
# Result

class RankInfo(Record):
    detail_fields = ("pid", "nics_used")       # the host row lists its NICs; a pid names no culprit

    rank: int = Field(description="Rank in the largest communicator.")
    host: str = Field(description="Host name as NCCL printed it.")
    pid: str = Field("", description="Process id.")
    cuda_dev: int = Field(description="CUDA device index in that process.")
    bus_id: str | None = Field(None, description="PCI bus id of the GPU (NCCL's short form, e.g. 18000).")
    nics_used: list[str] = Field(default_factory=list, description="Network devices its channels go through.")
    init_complete: bool = Field(True, description="Whether 'Init COMPLETE' was seen for it.")


class NicInfo(Record):
    host: str = Field(description="Host.")
    index: int = Field(description="NCCL's NET device index.")
    name: str = Field(description="Device (mlx5_0) or interface (eth0) name.")
    kind: str = Field(description="IB | RoCE | Socket")
    speed_gbps: float | None = Field(None, description="Speed from NCCL's topology dump, GB/s decimal (50 = 400 Gb/s).")


class NcclLogParams(LogInputParams):
    """paths: NCCL_DEBUG=INFO output, e.g. one file per process from NCCL_DEBUG_FILE, or a directory of them."""

    max_ranks: int = Field(64, ge=0, le=100_000, json_schema_extra=SELF_EVIDENT, description="Ranks listed, at most.")


class NcclLogResult(Result):
    # Said in the findings (versions, hosts, network and NICs, transports, channels, graphs, tuning) or bulk the
    # culprit is never named from (ring and tree orders, algorithm lines, line counts). Stored whole.
    detail_fields = ("nccl_versions", "hosts", "network", "net_plugin", "nics", "transports", "channels", "rings",
                     "trees", "graphs", "tuning", "algo_choices", "lines_scanned", "nccl_lines")

    problems: list[str] = Field(default_factory=list, description=(
        "Ids of what was flagged: socket_fallback, socket_inter_node, gdr_off, nic_mismatch, bootstrap_mismatch, "
        "virtual_interface, nic_idle, slow_nic, p2p_disabled, intra_node_via_cpu, intra_node_pcie, "
        "nic_via_cpu, version_mismatch, init_incomplete, nccl_warnings, forced_settings, roce_ib_mixed, "
        "socket_iface_idle; from pasted outputs: nccl_tests_wrong, nccl_tests_low_busbw, nccl_tests_straggler, "
        "ras_incomplete, ras_mismatch, ..."))
    nccl_tests_runs: int = Field(0, description="nccl-tests outputs (text tables or -J JSON) found in the input.")
    nccl_versions: dict[str, int] = Field(default_factory=dict, description="NCCL version -> number of processes.")
    hosts: list[str] = Field(default_factory=list, description="Hosts seen.")
    host_rows: list[HostRow] = Field(default_factory=list, description="Per host: NCCL, CUDA driver, net plugin, "
                                     "transport, NICs, GDR, GID index, what differs from the other hosts.")
    odd_hosts: list[str] = Field(default_factory=list, description="Hosts whose net plugin, transport or GID "
                                 "index differs from the rest (a cause of hangs).")
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
    where = f"{len(hosts)} host(s) ({name_list(hosts)})" if hosts else "unnamed hosts"
    vtext = ", ".join(f"{v}" for v in sorted(versions)) or "version not printed"
    size = f"; {comm['nranks']} ranks in the largest communicator" if comm else ""
    out.append(f"NCCL {vtext}: {len(procs)} process(es) on {where}{size}.")
    networks = sorted(set().union(*(p.networks for p in procs))) if procs else []
    if networks or nics:
        speeds = sorted({n.speed_gbps for n in nics if n.speed_gbps})
        per_host = Counter(n.host for n in nics)
        nic_text = (f"{max(per_host.values())} NIC(s) per host ({name_list({n.name for n in nics})})" if per_host else "no NIC list")
        # NCCL lists every RDMA device it found; the channels may use fewer (an iWARP port beside the ConnectX ones)
        used = {p.ib_nics[i][0] for p in procs for i in p.net_devs_used if i in p.ib_nics}
        if used and used < {n.name for n in nics}:
            nic_text += f", channels use {name_list(used)}"
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
    comm = largest_comm(parsed)
    hosts = sorted({p.host for p in procs if p.host != "?"})
    nodes = parsed.nnodes or len(hosts) or 1
    rows = host_rows(parsed, procs)
    rep, versions, gdr, env = check_all(parsed, procs, comm, nodes, rows)
    nics = _nic_models(parsed, procs)
    expected = expected_per_nic(nics)
    closing = []
    if expected and nodes > 1:
        closing.append(f"The NICs are {expected[0]}: a healthy fabric gives about {expected[1]:g} GB/s busbw per NIC "
                       "for large all_reduce messages between nodes (collective_bench, NCCL_ALGO=Ring).")
    ranks, omitted = _rank_models(parsed, comm, max_ranks)
    nvls = [p.nvls for p in procs if p.nvls is not None]
    verdict = "fail" if "fail" in rep.severities else "warn" if "warn" in rep.severities else "ok"
    alike = hosts_match(rows)      # "do the hosts differ?" answered first when nothing else is wrong
    if alike:
        rep.findings.insert(0 if verdict == "ok" else len(rep.findings), alike)
    nxt = [s for problem in rep.problems for s in NEXT.get(problem, [])]
    nxt = list(dict.fromkeys(nxt + ["collective_bench", "knowledge://network/nccl-debugging.md"]))[:6]
    return NcclLogResult(
        verdict=verdict, findings=rep.findings + _summary(parsed, procs, versions, comm, hosts, nodes, gdr, nics) + closing,
        next=nxt, problems=rep.problems, nccl_versions=dict(versions), hosts=hosts, processes=len(procs),
        host_rows=rows, odd_hosts=rep.odd_hosts,
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
        return with_outputs(analyse(parse_text(params.text), params.max_ranks), [params.text])
    parsed, _read, skipped = parse_paths(params.paths, params.max_files, progress)
    result = with_outputs(analyse(parsed, params.max_ranks), _texts(params.paths, params.max_files))
    if skipped:
        result.findings.append(f"Skipped {len(skipped)} file(s): " + "; ".join(skipped[:3]))
    return result


def _texts(paths: list[str], max_files: int) -> Iterator[str]:
    """Each text file's start (its first OUTPUT_READ_BYTES), one at a time, for the nccl-tests and RAS
    readers: memory holds one file's head, not every file's (60 files of 20 MB held 1 GB)."""
    files, _ = resolve_paths(paths, max_files)
    for f in files:
        try:
            head = read_head(f, OUTPUT_READ_BYTES)
        except OSError:
            continue
        if not looks_binary(head[:65536]):
            yield head.decode("utf-8", "replace")


def with_outputs(result: NcclLogResult, texts: list[str]) -> NcclLogResult:
    """Add what nccl-tests tables / JSON and NCCL RAS reports in the input say."""
    verdict, findings, problems, runs = read_all(texts)
    if not findings:
        return result
    if not result.processes:       # only nccl-tests / RAS output: the NCCL-log summary does not apply
        result.findings, result.next = [], ["collective_bench", "knowledge://network/busbw.md"]
        result.verdict = "info"
    result.verdict = worst([result.verdict, verdict])
    result.findings = findings + result.findings
    result.problems = list(dict.fromkeys(result.problems + problems))
    result.nccl_tests_runs = runs
    if any(p.startswith("ras_") for p in problems):
        result.next = list(dict.fromkeys(["hang_stack_dump", "knowledge://debugging/hangs.md", *result.next]))[:6]
    return result


SPEC = ToolSpec(
    name="nccl_log_analyze",
    summary="Read NCCL_DEBUG=INFO output: transports, NICs, GPUDirect RDMA, rings/trees, versions; flag what is wrong.",
    description=(
        "Reads NCCL_DEBUG=INFO output (training log, NCCL_DEBUG_FILE files): NCCL version per process, rank "
        "-> host/GPU, network (IB, RoCE, Socket, plugin), NICs such as mlx5_0 / ib0 / eth0, GPUDirect RDMA, "
        "P2P / SHM / NVLS, rings and trees, NCCL_* overrides vs NCCL's defaults, WARN lines; flags socket "
        "fallback where InfiniBand exists ('NET/IB : No device found', 'Failed to open libibverbs.so'), GDR "
        "off, mismatched versions or NICs, a host whose net plugin differs, RoCE completion error 12 (GID index), "
        "inits that never completed. Also pasted nccl-tests output "
        "(all_reduce_perf tables or -J JSON: busbw vs expected, #wrong, stragglers) and ncclras reports. "
        "Reads files only. Not for which rank crashed (log_triage) or measuring bandwidth (collective_bench)."),
    Params=NcclLogParams, Result=NcclLogResult, run=run,
    runs="subprocess", read_only=True, destructive=False, idempotent=True, open_world=False, timeout_s=300,
)
