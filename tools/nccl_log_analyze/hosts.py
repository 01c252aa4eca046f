"""The NCCL log read host by host: what each host ran (NCCL, CUDA driver, net plugin, transport, NICs,
GPUDirect RDMA, RoCE GID index) and the host whose set-up differs from the rest.

A net plugin loaded on some hosts only is a cause, not a detail: in NVIDIA/nccl #1634 every pair of a host
that loaded HPC-X's libnccl-net.so and one that fell back to NCCL's internal IB hung right after init.
"""

import re
from collections import Counter, defaultdict
from dataclasses import dataclass

from ..engine.spec import SELF_EVIDENT, Field, Record
from .parse import Parsed, Proc


class HostRow(Record):
    host: str = Field(json_schema_extra=SELF_EVIDENT, description="Host name as NCCL printed it.")
    processes: int = Field(json_schema_extra=SELF_EVIDENT, description="Processes of this host in the log.")
    nccl_version: str | None = Field(None, json_schema_extra=SELF_EVIDENT, description="NCCL version.")
    cuda_driver: str | None = Field(None, json_schema_extra=SELF_EVIDENT, description="CUDA driver API version (12.4).")
    net_plugin: str | None = Field(None, description="External net plugin (name, else its path), or 'internal' when "
                                   "NCCL fell back to its own IB/Socket.")
    net_plugin_version: str | None = Field(None, json_schema_extra=SELF_EVIDENT, description=(
        "The plugin's version (aws-ofi-nccl 1.6.0) or its API (v8)."))
    transport: str | None = Field(None, description="IB | RoCE | Socket | the plugin's network (IBext_v8, ...).")
    nics: list[str] = Field(default_factory=list, json_schema_extra=SELF_EVIDENT, description="NICs NCCL listed.")
    nics_used: list[str] = Field(default_factory=list, description=(
        "NICs the channels went through (NET/IB/<n> lines), when fewer than those listed."))
    gdr: str = Field("n/a", json_schema_extra=SELF_EVIDENT, description="GPUDirect RDMA: on | off | partial | n/a.")
    gid_index: str | None = Field(None, description="RoCE GID index (NCCL_IB_GID_INDEX or NCCL's QP lines) and kind.")
    completion_errors: int = Field(0, json_schema_extra=SELF_EVIDENT, description="'Got completion ... error' WARNs.")
    differs_in: list[str] = Field(default_factory=list, json_schema_extra=SELF_EVIDENT, description=(
        "Fields in which this host differs from the rest."))


@dataclass(frozen=True)
class Compared:
    """A host field compared across hosts, and how much a difference weighs."""
    field: str
    words: str
    severity: str
    problem: str


COMPARED = (Compared("net_plugin", "NCCL net plugin", "fail", "net_plugin_mismatch"),
            Compared("transport", "network transport", "fail", "transport_mismatch"),
            Compared("gid_index", "RoCE GID index", "fail", "gid_mismatch"),
            Compared("net_plugin_version", "net plugin version", "warn", "plugin_version_mismatch"),
            Compared("cuda_driver", "CUDA driver", "warn", "driver_mismatch"))


def _plugin(procs: list[Proc]) -> str | None:
    loaded = Counter(p.plugin for p in procs if p.plugin and p.plugin != "internal")
    paths = Counter(p.plugin_path for p in procs if p.plugin_path)
    if loaded or paths:
        return (loaded.most_common(1)[0][0] if loaded else paths.most_common(1)[0][0])
    return "internal" if any(p.plugin == "internal" for p in procs) else None


def _plugin_version(procs: list[Proc]) -> str | None:
    versions = Counter(p.plugin_version for p in procs if p.plugin_version)
    return versions.most_common(1)[0][0] if versions else None


def _transport(procs: list[Proc]) -> str | None:
    # "IBext" and "IBext_v8" are one plugin network printed by different NCCL releases
    nets = Counter(re.sub(r"_v\d+$", "", n) for p in procs for n in p.networks)
    if not nets:
        return None
    net = nets.most_common(1)[0][0]
    layers = {nic[2] for p in procs for nic in p.ib_nics.values()}
    return "RoCE" if net == "IB" and layers == {"RoCE"} else net


def _gdr(procs: list[Proc]) -> str:
    edges, gdr = sum(p.ib_edges for p in procs), sum(p.ib_gdr_edges for p in procs)
    return "n/a" if not edges else "on" if gdr == edges else "off" if not gdr else "partial"


GID_SETTING = "NCCL_IB_GID_INDEX"
MAX_VALUES_SHOWN = 8     # values of one field quoted in a finding (a host each, at worst)


def _gid(procs: list[Proc]) -> str | None:
    setting = next((p.env["NCCL_IB_GID_INDEX"] for p in procs if "NCCL_IB_GID_INDEX" in p.env), None)
    printed = sorted({(i, s) for p in procs for i, s in p.gids.items()})
    if printed:
        return ", ".join(f"{i} ({s})" for i, s in printed[:3])
    return f"{setting} ({GID_SETTING})" if setting is not None else None


def _driver(procs: list[Proc]) -> str | None:
    versions = Counter(p.cuda_driver for p in procs if p.cuda_driver)
    if not versions:
        return None
    v = versions.most_common(1)[0][0]
    return f"{v // 1000}.{v % 1000 // 10}"


def host_rows(parsed: Parsed, procs: list[Proc]) -> list[HostRow]:
    by_host: dict[str, list[Proc]] = defaultdict(list)
    for p in procs:
        if p.host != "?":
            by_host[p.host].append(p)
    errors = Counter(e.host for e in parsed.completion_errors)
    if len(by_host) == 1 and errors.get("?"):      # a WARN without its host prefix, in a log of one host: that host's
        errors[next(iter(by_host))] += errors.pop("?")
    rows = []
    for host, ps in sorted(by_host.items()):
        versions = Counter(p.version for p in ps if p.version)
        nics = sorted({n[0] for p in ps for n in p.ib_nics.values()} or {i for p in ps for i in p.socket_ifaces})
        used = {p.ib_nics[i][0] for p in ps for i in p.net_devs_used if i in p.ib_nics}
        rows.append(HostRow(host=host, processes=len(ps), nccl_version=versions.most_common(1)[0][0] if versions else None,
                            cuda_driver=_driver(ps), net_plugin=_plugin(ps),
                            net_plugin_version=_plugin_version(ps), transport=_transport(ps), nics=nics,
                            nics_used=sorted(used) if used and used < set(nics) else [], gdr=_gdr(ps), gid_index=_gid(ps), completion_errors=errors[host]))
    return rows


def _groups(values: dict[str, str]) -> dict[str, list[str]]:
    """value -> the hosts that have it, in one pass."""
    groups: dict[str, list[str]] = defaultdict(list)
    for host, value in values.items():
        groups[value].append(host)
    return groups


def odd_hosts(values: dict[str, str]) -> list[str]:
    """Hosts whose value fewer hosts share; on a tie (1 against 1) the one that fell back to 'internal' or
    uses a link-local GID."""
    groups = _groups(values)
    if len(groups) < 2:
        return []
    largest = max(len(h) for h in groups.values())
    odd = [h for hs in groups.values() if len(hs) < largest for h in hs]
    if not odd:
        odd = [h for v, hs in groups.items() if v == "internal" or "link-local" in v for h in hs]
        odd = odd if len(odd) < len(values) else []
    return sorted(odd)


# Why the host odd_hosts picks on a tie is the likelier odd one, by compared field: it is the one that fell back.
TIE_REASON = {"net_plugin": "its NCCL printed that it found no net plugin and used its internal one, where the "
                            "other loaded one",
              "transport": "it fell back to NCCL's internal network",
              "gid_index": "it uses a link-local GID, which does not route between subnets"}


def check_hosts(rows: list[HostRow], rep, name_list, severity: str) -> list[str]:
    """Flag every compared field of this severity in which hosts differ, naming the odd host(s); returns the
    odd hosts of the fields that fail."""
    culprits: list[str] = []
    for c in (c for c in COMPARED if c.severity == severity):
        values = {r.host: getattr(r, c.field) for r in rows if getattr(r, c.field) is not None}
        if c.field == "gid_index":      # the GIDs NCCL printed decide; a setting alone is compared with settings only
            printed = {h: v for h, v in values.items() if not v.endswith(f"({GID_SETTING})")}
            values = printed or values
        if len(set(values.values())) < 2:
            continue
        odd = odd_hosts(values)
        odd_set = set(odd)
        for r in rows:
            if r.host in odd_set:
                r.differs_in.append(c.field)
        groups = _groups(values)      # one pass: a scan per value was quadratic (16,000 hosts: 61 s)
        shown = sorted(groups)[:MAX_VALUES_SHOWN]
        by_value = "; ".join(f"{_shown(v)} on {name_list(groups[v])}" for v in shown) + (
            f"; and {len(groups) - len(shown)} more values" if len(groups) > len(shown) else "")
        sizes = {len(hosts) for hosts in groups.values()}
        if odd and len(sizes) == 1:     # no majority (one host against one): the odd one is only the likelier one
            text = (f"The hosts differ in the {c.words} ({by_value}), with no majority: {name_list(odd)} is the "
                    f"likelier odd one ({TIE_REASON.get(c.field, TIE_REASON['transport'])}); check this line on "
                    "every node. ")
        else:
            who = f"{name_list(odd)} differ{'s' if len(odd) == 1 else ''} from the other hosts" if odd else "Hosts differ"
            text = f"{who} in the {c.words} ({by_value}). "
        rep.flag(c.problem, c.severity, text + _consequence(c))
        if c.severity == "fail":
            culprits += [h for h in odd if h not in culprits]
    return culprits


def hosts_match(rows: list[HostRow]) -> str | None:
    """'The 2 hosts (...) are set up alike: ...' when several hosts were read and no compared field differs."""
    if len(rows) < 2:
        return None
    same = []
    for c in COMPARED:
        values = {getattr(r, c.field) for r in rows} - {None}
        if len(values) > 1:
            return None
        same += [f"{c.words} {_shown(v)}" for v in values]
    shown = ", ".join(r.host for r in rows[:6]) + (f" and {len(rows) - 6} more" if len(rows) > 6 else "")
    return (f"The {len(rows)} hosts ({shown}) are set up alike"
            + (f": {'; '.join(same)}." if same else ".") + " No host differs in what NCCL printed.")


def _shown(value: str) -> str:
    return "NCCL's internal IB/Socket (no plugin loaded)" if value == "internal" else value


def _consequence(c: Compared) -> str:
    if c.field in ("net_plugin", "transport"):
        return ("A mismatch is a cause: hosts on different net plugins or transports cannot connect, and collectives "
                "hang right after 'Init COMPLETE' (NVIDIA/nccl #1634). Make the net plugin the same on every host: "
                "install the same libnccl-net.so (e.g. HPC-X's nccl-rdma-sharp-plugins, aws-ofi-nccl) where it is "
                "missing, or set NCCL_NET_PLUGIN=none on every host to use NCCL's internal IB.")
    if c.field == "gid_index":
        return ("A mismatch is a cause: both ends of a RoCE connection must use a GID of the same kind. Set "
                "NCCL_IB_GID_INDEX to the RoCE v2 routable index on every host (show_gids).")
    if c.field == "net_plugin_version":
        return "Another release of the same plugin: install one release everywhere to rule it out."
    return "Different drivers rarely hang NCCL by themselves; install the same driver everywhere to rule it out."
