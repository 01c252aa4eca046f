"""The NCCL_DEBUG=INFO messages nccl_log_analyze understands: one regex per message kind, a literal that
kind always contains (a cheap test before the regex), and the handler that folds a match into the parsed
record of the process that printed it."""

import re

from ..engine.redact import redact

MSG = {name: re.compile(rx) for name, rx in {
    "bootstrap": r"^Bootstrap ?: Using (?P<iface>[^:\s]+):(?P<ip>[^<\s]+)<\d+>",
    "plugin_loaded": r"^NET/Plugin ?: Loaded (?:net )?plugin (?P<name>.+?)(?: \((?P<api>v\d+)\))?$",
    # NCCL's wordings for "no external plugin, internal IB/Socket used": 2.4-2.17 "No plugin found
    # (libnccl-net.so)[, using internal implementation]" (2.19 with "dlerror=..." before it), 2.18 "Plugin load
    # (libnccl-net.so) returned 2 : ...", 2.21 "Plugin load returned 2 : ..." / "Using internal network plugin.",
    # 2.23+ "Could not find: libnccl-net.so. Using internal network plugin." (NVIDIA/nccl #1634, #1231; nccl-tests #244)
    "plugin_none": r"^NET/Plugin ?: .*?(?:No plugin found|Could not find: libnccl-net|Plugin load .*?returned|"
                   r"Using internal network plugin)",
    "plugin_path": r"^Plugin Path ?: (?P<path>\S+)",
    "ofi_version": r"^NET/OFI (?:Using|Initializing) aws-ofi-nccl (?P<version>[\w.\-]+)",
    "cuda_driver": r"^cudaDriverVersion (?P<version>\d+)",
    # RoCE QP setup (NCCL_DEBUG_SUBSYS=NET): "NET/IB: [NCCL Dev 0 IbDev 0 ]Dev 0 Port 1 qpn 1234 mtu 5 GID 3
    # (0/9011A8C0FFFF0000)": the GID index and the GID's subnet prefix / interface id as little-endian words.
    "ib_gid": r"^NET/IB ?: .*?\bqpn \d+ mtu \d+ .*?GID (?P<index>-?\d+) \((?P<prefix>[0-9A-Fa-f]+)/(?P<iid>[0-9A-Fa-f]+)\)",
    "ib_using": r"^NET/IB ?: Using (?P<list>[^;]*)(?:;\s*OOB (?P<oob>[^:\s]+):(?P<ip>[^<\s]+)<\d+>)?",
    "ib_none": r"^NET/IB ?: No device found",
    "socket_using": r"^NET/Socket ?: Using (?P<list>.*)$",
    "network": r"^Using (?:non-device )?network (?P<net>.*\S)",
    "init": r"(?:comm (?P<comm>0x[0-9a-f]+) )?rank (?P<rank>\d+) nranks (?P<nranks>\d+) cudaDev (?P<cudadev>\d+)"
            r"(?: nvmlDev (?P<nvml>\d+))?(?: busId (?P<busid>[0-9a-fA-F]+))?(?: commId (?P<commid>0x[0-9a-f]+))?"
            r"(?: localSize \d+)? - Init (?P<state>START|COMPLETE)",
    "nodes": r"rank (?P<rank>\d+) nRanks (?P<nranks>\d+) nNodes (?P<nnodes>\d+) localRanks (?P<local>\d+)",
    "env": r"^(?P<var>NCCL_\w+) set (?:by environment )?to (?P<value>.*)",
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
    "algo_choice": r"(?<!\d)(?P<bytes>\d+) Bytes -> Algo (?P<algo>\w+) proto (?P<proto>\w+) time (?P<time>[\d.]+)",
    "tuning_header": r"^\s*(?P<kind>Algorithm|Protocol|Latency/AlgBw)\s*\|(?P<cells>.*)$",
    "tuning_row": r"^\s*(?P<op>Broadcast|Reduce|AllGather|ReduceScatter|AllReduce)\s*\|(?P<cells>.*)$",
}.items()}

# A literal each message of that kind contains: a cheap test before the regex (NCCL logs run to millions of lines).
HINTS = {"bootstrap": "Bootstrap", "plugin_loaded": "NET/Plugin", "plugin_none": "NET/Plugin", "plugin_path": "Plugin Path", "ofi_version": "aws-ofi-nccl",
         "cuda_driver": "cudaDriverVersion", "ib_gid": " GID ", "ib_using": "NET/IB",
         "ib_none": "NET/IB", "socket_using": "NET/Socket", "network": "network ", "init": " - Init ", "nodes": "nNodes",
         "env": "NCCL_", "gdr": "GPU Direct RDMA", "p2p_off": "P2P is disabled", "nvls": "NVLS multicast",
         "channels": "coll channels", "edge": " via ", "ring": " : ", "trees": "Tree", "pattern": "Pattern ",
         "topo_net": "NET[", "algo_choice": "Bytes -> Algo", "tuning_header": "|", "tuning_row": "|"}

PATTERNS = {1: "balanced tree", 2: "split tree", 3: "tree", 4: "ring", 5: "NVLS", 6: "NVLS tree", 7: "CollNet direct",
            8: "CollNet chain"}
ALGOS = {"0": "Tree", "1": "Ring", "2": "CollNetDirect", "3": "CollNetChain", "4": "NVLS", "5": "NVLSTree", "6": "PAT"}
PROTOS = {"0": "LL", "1": "LL128", "2": "Simple"}


def _on_bootstrap(parsed, proc, m):
    proc.bootstrap = m["iface"]


def _on_plugin_loaded(parsed, proc, m):
    proc.plugin = m["name"]
    proc.plugin_version = proc.plugin_version or m["api"]


def _on_ofi_version(parsed, proc, m):
    proc.plugin_version = f"aws-ofi-nccl {m['version']}"


def _on_plugin_none(parsed, proc, m):
    proc.plugin = proc.plugin or "internal"


def _on_plugin_path(parsed, proc, m):
    proc.plugin_path = m["path"]


def _on_cuda_driver(parsed, proc, m):
    proc.cuda_driver = int(m["version"])


def _on_ib_gid(parsed, proc, m):
    proc.gids[int(m["index"])] = gid_scope_of_words(int(m["prefix"], 16), int(m["iid"], 16))


def gid_scope_of_words(prefix: int, iid: int) -> str:
    """'link-local', 'ipv4' or 'global' for a GID NCCL printed as two little-endian 64-bit words (the GID's
    bytes in order): fe80::/10 is link-local, ::ffff:a.b.c.d an IPv4-mapped (routable) address."""
    first, second = prefix & 0xFF, (prefix >> 8) & 0xFF
    if first == 0xFE and second & 0xC0 == 0x80:
        return "link-local"
    if prefix == 0 and iid & 0xFFFFFFFF == 0xFFFF0000:
        return "ipv4"
    return "global"


def _on_ib_using(parsed, proc, m):
    for idx, name, port, layer in re.findall(r"\[(\d+)\]([\w.\-]+):(\d+)/(IB|RoCE)", m["list"]):
        proc.ib_nics[int(idx)] = (name, int(port), layer)
    if m["oob"] and not proc.bootstrap:
        proc.bootstrap = m["oob"]


def _on_ib_none(parsed, proc, m):
    proc.ib_none = True


def _on_socket_using(parsed, proc, m):
    proc.socket_ifaces = [name for _, name in re.findall(r"\[(\d+)\]([^:\s\[]+):", m["list"])]


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
    value = m["value"].rstrip()  # trailing blanks and NCCL's full stop are cut here, not by a backtracking regex
    value = value[:-1] if value.endswith(".") else value
    proc.env[m["var"]] = redact(f"{m['var']}={value}").split("=", 1)[1]


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
    values = re.findall(r"(?<![\d.])([\d.]+)\s*/\s*([\d.]+)", m["cells"])
    best = None
    for (algo, proto), (lat, bw) in zip(parsed.tuning_pairs, values):
        if float(bw) > 0 and (best is None or float(bw) > best[2]):
            best = (algo, proto, float(bw), float(lat))
    if best and m["op"] not in parsed.tuning:
        parsed.tuning[m["op"]] = (f"{best[0]}/{best[1]}: highest modelled bandwidth {best[2]:g} GB/s "
                                  f"(latency {best[3]:g} us)")


# A message kind without its _on_<kind> handler fails here, at import, not on the first log that has one.
HANDLERS = {name: globals()[f"_on_{name}"] for name in MSG}
