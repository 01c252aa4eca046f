"""The checks nccl_log_analyze runs over a parsed NCCL log: versions, init, network and GPUDirect RDMA,
NICs and interfaces, intra-node paths, warnings and forced settings. Each flags a problem id, a severity and
a finding into a Report; NEXT says where to go for each problem."""

from collections import Counter
from dataclasses import dataclass, field

from ..engine.data import load_data

from ..shared.logscan import ranks_phrase
from .hosts import HostRow, check_hosts
from .parse import Parsed, Proc
from .roce import check_roce_gid

# Paths NCCL's topology reports, nearest first: NVLink, PCIe switch (one or several), host bridge, the
# CPU's PCIe root (NODE), across the CPU interconnect (SYS).
CPU_PATHS = {"PHB", "NODE", "SYS"}
PCIE_PATHS = {"PIX", "PXB"}
VIRTUAL_IFACES = ("lo", "docker", "virbr", "veth", "cni", "flannel", "br-")

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
    "net_plugin_mismatch": ["fleet_sweep", "knowledge://network/inter-node.md"],
    "transport_mismatch": ["fleet_sweep", "knowledge://network/inter-node.md"],
    "gid_mismatch": ["nic_health", "knowledge://network/inter-node.md"],
    "driver_mismatch": ["fleet_sweep", "knowledge://debugging/version-drift.md"],
    "roce_gid": ["nic_health", "knowledge://network/inter-node.md"],
    "roce_unreachable": ["nic_health", "collective_bench", "knowledge://network/inter-node.md"],
}
FORCING_VARS = ("NCCL_ALGO", "NCCL_PROTO", "NCCL_IB_DISABLE", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_NET_GDR_LEVEL",
                "NCCL_P2P_LEVEL", "NCCL_MAX_NCHANNELS", "NCCL_MIN_NCHANNELS", "NCCL_NVLS_ENABLE", "NCCL_NET",
                "NCCL_CROSS_NIC", "NCCL_BUFFSIZE", "NCCL_NET_GDR_READ")


@dataclass
class Report:
    """Findings in the order the checks flag them; problem ids once each."""

    findings: list = field(default_factory=list)
    problems: list = field(default_factory=list)
    severities: list = field(default_factory=list)
    odd_hosts: list = field(default_factory=list)     # hosts whose set-up differs in a way that fails

    def flag(self, problem: str, severity: str, text: str) -> None:
        if problem not in self.problems:
            self.problems.append(problem)
        self.severities.append(severity)
        self.findings.append(text)


def name_list(items) -> str:
    items = sorted(items)
    return ", ".join(items[:6]) + (f" and {len(items) - 6} more" if len(items) > 6 else "")


def largest_comm(parsed: Parsed) -> dict | None:
    return max(parsed.comms.values(), key=lambda c: (c["nranks"], len(c["ranks"])), default=None)


def check_all(parsed: Parsed, procs: list[Proc], comm: dict | None, nodes: int,
              hosts: list[HostRow]) -> tuple[Report, Counter, str, dict]:
    """Every check, in the order its findings are read: what sets one host apart and RoCE's GID first (the
    causes), then the rest. Returns (report, NCCL version -> processes, GPUDirect RDMA state, the NCCL_*
    settings the processes reported)."""
    rep = Report()
    rep.odd_hosts = check_hosts(hosts, rep, name_list, "fail")
    check_roce_gid(parsed, procs, rep, name_list)
    rank_hosts = Counter(i["host"] for i in comm["ranks"].values()) if comm else Counter()
    versions = _check_versions(parsed, procs, rep)
    _check_init(comm, rep)
    gdr = _check_network(parsed, procs, nodes, rep)
    _check_nics(parsed, procs, nodes, rank_hosts, rep)
    _check_intra(parsed, procs, rank_hosts, rep)
    _check_fabrics(procs, rep)
    env = _check_settings(parsed, procs, rep)
    check_hosts(hosts, rep, name_list, "warn")     # another driver or plugin release: worth a look, not the headline
    return rep, versions, gdr, env


def _check_versions(parsed: Parsed, procs: list[Proc], rep: Report) -> Counter:
    versions = Counter(p.version for p in procs if p.version)
    for v in parsed.loose_versions - set(versions):
        versions[v] = 1
    if len(versions) > 1:
        by = "; ".join(f"{v} on {name_list({p.host for p in procs if p.version == v}) or 'some process'}"
                       for v in sorted(versions))
        rep.flag("version_mismatch", "fail", f"NCCL versions differ between processes ({by}): mixed NCCL builds "
                 "can hang or fail at init; install one torch / NCCL everywhere.")
    return versions


def _check_init(comm: dict | None, rep: Report) -> None:
    if not comm:
        return
    stuck = [r for r, info in comm["ranks"].items() if not info["complete"]]
    if stuck and len(stuck) < len(comm["ranks"]):
        hosts = {comm["ranks"][r]["host"] for r in stuck}
        rep.flag("init_incomplete", "fail", f"{ranks_phrase(stuck).capitalize()} (on {name_list(hosts)}) started communicator "
                 "init but never printed 'Init COMPLETE' while the others did: they hung or died during init; read "
                 "their WARN lines and their network setup.")
    elif stuck:
        rep.flag("init_incomplete", "warn", "No rank printed 'Init COMPLETE': communicator init hung everywhere "
                 "(bootstrap or network connection), or the log was cut before init finished.")
    missing = comm["nranks"] - len(comm["ranks"])
    if missing > 0:
        rep.findings.append(f"Only {len(comm['ranks'])} of {comm['nranks']} ranks appear in these logs; the others' "
                            "lines are elsewhere (NCCL_DEBUG_FILE per process, other nodes' output).")


def _check_network(parsed: Parsed, procs: list[Proc], nodes: int, rep: Report) -> str:
    t = parsed.transports
    networks = set().union(*(p.networks for p in procs)) if procs else set()
    sockets_used = "Socket" in networks or t["net_socket"] > 0
    ib_listed = {(p.host, nic[0]) for p in procs for nic in p.ib_nics.values()}
    ib_disabled = {p.host for p in procs if p.env.get("NCCL_IB_DISABLE") == "1"}
    ipoib = {(p.host, i) for p in procs for i in p.socket_ifaces if i.startswith("ib")}
    if sockets_used and (ib_listed or ib_disabled or ipoib):
        why = ("NCCL_IB_DISABLE=1 is set" if ib_disabled else
               f"RDMA devices are listed ({name_list({n for _, n in ib_listed})})" if ib_listed else
               f"sockets run over IPoIB interfaces ({name_list({i for _, i in ipoib})}), so IB hardware is there")
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
        where = name_list({h for h, _ in disabled}) or name_list({p.host for p in procs if p.ib_edges > p.ib_gdr_edges})
        detail = f" ({disabled[0][1]})" if disabled else ""
        rep.flag("gdr_off", "warn", f"GPUDirect RDMA is {gdr} ({gdr_edges} of {rdma} network connections use it; "
                 f"hosts: {where or 'unknown'}{detail}): network data bounces through host memory. Check that the "
                 "nvidia_peermem (or dmabuf) module is loaded and the GPU-NIC distance; NCCL_NET_GDR_LEVEL=SYS forces "
                 "it. On GH200/GB200 NCCL leaves it off by default.")
    return gdr


def _check_nics(parsed: Parsed, procs: list[Proc], nodes: int, rank_hosts: Counter, rep: Report) -> None:
    by_host: dict[str, Proc] = {}
    for p in procs:
        if p.ib_nics and p.host not in by_host:
            by_host[p.host] = p
    sets = {h: frozenset(n[0] for n in p.ib_nics.values()) for h, p in by_host.items()}
    if len(set(sets.values())) > 1:
        parts = "; ".join(f"{h}: {len(s)} ({name_list(s)})" for h, s in sorted(sets.items())[:6])
        rep.flag("nic_mismatch", "warn", f"Hosts see different RDMA NICs ({parts}): a port down, a missing device in "
                 "the container, or a different NCCL_IB_HCA. Ranks on the short host limit every collective.")
    boots = {p.host: p.bootstrap for p in procs if p.bootstrap and p.host != "?"}
    if len(set(boots.values())) > 1:
        rep.flag("bootstrap_mismatch", "warn", "Hosts bootstrap over different interfaces (" + "; ".join(
            f"{h}: {i}" for h, i in sorted(boots.items())[:6]) + "): set NCCL_SOCKET_IFNAME to the one they share.")
    virtual = {(h, i) for h, i in boots.items() if i.startswith(VIRTUAL_IFACES)}
    virtual |= {(p.host, i) for p in procs for i in p.socket_ifaces if i.startswith(VIRTUAL_IFACES)}
    if virtual and nodes > 1:
        rep.flag("virtual_interface", "warn", f"NCCL uses a loopback or virtual interface ({name_list({f'{h}:{i}' for h, i in virtual})}) "
                 "on a multi-node job: peers cannot reach it. Set NCCL_SOCKET_IFNAME to the real network interface.")
    for host, proc in sorted(by_host.items()):
        used = set().union(*(p.net_devs_used for p in procs if p.host == host))
        listed = len(proc.ib_nics)
        gpus = rank_hosts.get(host, 0) or len({d for p in procs if p.host == host for d in p.devs})
        if used and listed > 1 and len(used) < min(listed, gpus):
            names = name_list(proc.ib_nics.get(i, (f"NET/{i}",))[0] for i in used)
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


def _check_intra(parsed: Parsed, procs: list[Proc], rank_hosts: Counter, rep: Report) -> None:
    multi_gpu_host = any(n > 1 for n in rank_hosts.values()) or any(len(p.devs) > 1 for p in procs)
    p2p_env = {p.host for p in procs if p.env.get("NCCL_P2P_DISABLE") == "1"}
    if p2p_env or parsed.p2p_off_pairs:
        pairs = ", ".join(f"{a}-{b}" for a, b in sorted(parsed.p2p_off_pairs)[:8])
        why = f"NCCL_P2P_DISABLE=1 on {name_list(p2p_env)}" if p2p_env else f"CUDA refuses peer access between GPUs {pairs}"
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


def _check_settings(parsed: Parsed, procs: list[Proc], rep: Report) -> dict:
    if parsed.warnings:
        top = "; ".join(f"{msg} (x{n})" for msg, n in parsed.warnings.most_common(3))
        rep.flag("nccl_warnings", "warn", f"{sum(parsed.warnings.values())} NCCL WARN line(s): {top}.")
    env = {k: v for p in procs for k, v in p.env.items()}
    nvlink = nvlink_platform(parsed)
    judged = {k: is_override(k, v, nvlink) for k, v in env.items() if k in FORCING_VARS}
    forced = {k: env[k] for k, over in judged.items() if over}
    same = sorted(f"{k}={env[k]}" for k, over in judged.items() if over is False)
    unknown = sorted(f"{k}={env[k]}" for k, over in judged.items() if over is None)
    if forced or unknown:
        rep.flag("forced_settings", "info", "Settings that override NCCL's own choices: "
                 + (", ".join(f"{k}={v}" for k, v in sorted(forced.items())) or "none") + "; keep them only if measured to help"
                 + (f" ({', '.join(same)}: NCCL's default, no effect)" if same else "")
                 + (f" ({', '.join(unknown)}: NCCL's default depends on whether the GPUs are NVLink-connected, "
                    "which this log does not show)" if unknown else "") + ".")
    return env


def nvlink_platform(parsed: Parsed) -> bool | None:
    """Whether the log shows an NVLink-based node (NVL graph paths or NVLS), a PCIe-only one, or neither."""
    if parsed.transports["nvls"] or any(g["type_intra"] == "NVL" for g in parsed.graphs):
        return True
    return False if parsed.graphs else None


def is_override(name: str, value: str, nvlink: bool | None = None) -> bool | None:
    """Whether NAME=value changes what NCCL does: not when it equals NCCL's documented default
    (knowledge/data/nccl_env_defaults.toml); always when the default is NCCL's own choice ('auto', 'unset').
    A default that depends on the platform (NCCL_NET_GDR_READ) is judged with `nvlink`; None when unknown."""
    rec = load_data("nccl_env_defaults")["var"].get(name)
    if rec is None or rec["default"] in ("auto", "unset"):
        return True
    if rec["default"] == "platform":
        if nvlink is None:
            return None
        return value.strip() != rec["default_nvlink" if nvlink else "default_other"]
    return value.strip() not in [rec["default"], *rec.get("same_as_default", [])]


def _check_fabrics(procs: list[Proc], rep: Report) -> None:
    """RoCE and InfiniBand ports in one NIC pool, and a second socket interface left idle."""
    mixed = {p.host: sorted({nic[2] for nic in p.ib_nics.values()}) for p in procs
             if len({nic[2] for nic in p.ib_nics.values()}) > 1}
    if mixed:
        host, layers = next(iter(sorted(mixed.items())))
        names = ", ".join(f"{n[0]}/{n[2]}" for p in procs if p.host == host for n in p.ib_nics.values())
        rep.flag("roce_ib_mixed", "warn", f"On {name_list(mixed)} NCCL pools RDMA ports of different link layers "
                 f"({'/'.join(layers)}: {names}): an InfiniBand port and a RoCE (Ethernet) port cannot reach each "
                 "other, and a front-end RoCE port is usually far slower. Set NCCL_IB_HCA to the ports of the "
                 "training fabric.")
    for p in procs:
        socket_used = "Socket" in p.networks
        if socket_used and len(p.socket_ifaces) > 1 and p.net_devs_used and len(p.net_devs_used) < len(p.socket_ifaces):
            idle = [n for i, n in enumerate(p.socket_ifaces) if i not in p.net_devs_used]
            rep.flag("socket_iface_idle", "warn", f"On {p.host} NCCL lists {len(p.socket_ifaces)} socket interfaces "
                     f"({', '.join(p.socket_ifaces)}) but sends only over {len(p.net_devs_used)}; {', '.join(idle)} "
                     "stays idle. Check NCCL_SOCKET_IFNAME and NCCL_SOCKET_NTHREADS / NCCL_NSOCKS_PERTHREAD, or use "
                     "the RDMA transport if the interfaces have one.")
            break
