"""RoCE GID tables pasted as `show_gids` or `ibv_devinfo -v` output: which index NCCL should use, and whether
the index in use (NCCL_IB_GID_INDEX in the paste) is that one.

Every IP address of a RoCE port's netdev gives two GIDs, one RoCE v1 and one RoCE v2; the fe80:: link-local
one and RoCE v1 ones do not route between subnets. The index to use between racks is the RoCE v2 GID of the
routable (IPv4-mapped ::ffff:a.b.c.d, or global IPv6) address: 3 on a plain mlx5 port, other numbers in
containers. Sources: knowledge/network/inter-node.md, "RoCE across subnets: the GID index".
"""

from __future__ import annotations

import ipaddress
import re

from ..engine.spec import SELF_EVIDENT, Field, Record

# show_gids (MLNX_OFED): DEV PORT INDEX GID IPv4 VER DEV, the IPv4 column empty for non-IPv4 GIDs.
_SHOW_GIDS = re.compile(r"^\s*(?P<dev>[\w.\-]+)\s+(?P<port>\d+)\s+(?P<index>\d+)\s+(?P<gid>[0-9a-fA-F:]{15,39})\s+"
                        r"(?:(?P<ipv4>\d{1,3}(?:\.\d{1,3}){3})\s+)?(?P<ver>v[12])\b(?:\s+(?P<netdev>\S+))?")
# ibv_devinfo -v: "GID[  3]:  ::ffff:200.0.209.6, RoCE v2" (the type suffix since rdma-core PR #682).
_DEVINFO_GID = re.compile(r"^\s*GID\[\s*(?P<index>\d+)\]:\s*(?P<gid>[0-9a-fA-F:.]+)(?:,\s*(?:RoCE (?P<ver>v[12])|IB))?")
_HCA = re.compile(r"^\s*hca_id:\s*(?P<dev>\S+)")
_PORT = re.compile(r"^\s*port:\s*(?P<port>\d+)\s*$")
# The index in use: the setting, or NCCL's own QP line ("NET/IB: ... qpn 1234 mtu 5 GID 3 (0/...)").
_IN_USE = re.compile(r"NCCL_IB_GID_INDEX(?:=|\s+set by environment to\s+|\s+set to\s+)(?P<index>-?\d+)|"
                     r"\bqpn \d+ mtu \d+ .{0,80}?GID (?P<qp_index>\d+) \(")


class GidRow(Record):
    table: int = Field(1, json_schema_extra=SELF_EVIDENT, description="Which pasted table (one per host) it is in.")
    device: str = Field(json_schema_extra=SELF_EVIDENT, description="RDMA device ('?' where the paste does not say).")
    port: int = Field(json_schema_extra=SELF_EVIDENT, description="Port number.")
    index: int = Field(json_schema_extra=SELF_EVIDENT, description="GID index (what NCCL_IB_GID_INDEX selects).")
    gid: str = Field(json_schema_extra=SELF_EVIDENT, description="The GID as pasted.")
    roce: str | None = Field(None, description="RoCE version: v1 | v2 (None: not printed).")
    scope: str = Field(description="link-local (fe80::) | ipv4 (::ffff:a.b.c.d) | global (routable IPv6).")
    address: str | None = Field(None, json_schema_extra=SELF_EVIDENT, description="The IP address the GID carries.")


def _row(device: str, port: int, index: int, gid: str, ver: str | None) -> GidRow | None:
    try:
        addr = ipaddress.IPv6Address(gid)
    except ValueError:
        return None
    if addr.is_unspecified:
        return None
    mapped = addr.ipv4_mapped
    scope = "link-local" if addr.is_link_local else "ipv4" if mapped else "global"
    return GidRow(device=device, port=port, index=index, gid=gid, roce=ver, scope=scope,
                  address=str(mapped) if mapped else addr.compressed)


def parse(text: str) -> list[GidRow]:
    """Every GID in pasted show_gids or ibv_devinfo -v output (both may be in one paste). Tables of several hosts
    pasted one after the other are told apart: a device, port and index seen again starts the next table."""
    rows, device, port, table, seen = [], "?", 1, 1, set()
    for line in text.splitlines()[:100_000]:
        line = line[:400]
        if m := _SHOW_GIDS.match(line):
            row = _row(m["dev"], int(m["port"]), int(m["index"]), m["gid"], m["ver"])
        elif m := _HCA.match(line):
            device, port, row = m["dev"], 1, None
        elif m := _PORT.match(line):
            port, row = int(m["port"]), None
        elif m := _DEVINFO_GID.match(line):
            row = _row(device, port, int(m["index"]), m["gid"], m["ver"])
        else:
            row = None
        if row:
            if (row.device, row.port, row.index) in seen:
                table, seen = table + 1, set()
            seen.add((row.device, row.port, row.index))
            rows.append(row.model_copy(update={"table": table}))
    return rows


def index_in_use(text: str) -> int | None:
    m = _IN_USE.search(text[:1_000_000])
    return int(m["index"] or m["qp_index"]) if m else None


def best_index(rows: list[GidRow]) -> GidRow | None:
    """The GID to use between subnets: RoCE v2 with an IPv4-mapped address, else RoCE v2 global IPv6."""
    for scope in ("ipv4", "global"):
        for r in rows:
            if r.roce == "v2" and r.scope == scope:
                return r
    return None


def _describe(r: GidRow) -> str:
    kind = {"link-local": "a link-local fe80:: GID", "ipv4": f"IPv4 {r.address}", "global": f"IPv6 {r.address}"}[r.scope]
    return f"index {r.index} ({kind}, RoCE {r.roce or 'version not shown'})"


def judge(rows: list[GidRow], in_use: int | None) -> tuple[str, list[str]]:
    """(verdict, findings) for the GID tables, the answer first."""
    ports: dict[tuple[int, str, int], list[GidRow]] = {}
    for r in rows:
        ports.setdefault((r.table, r.device, r.port), []).append(r)
    tables = len({r.table for r in rows})
    verdict, out = "info", []
    for (number, dev, port), table in ports.items():
        where = (f"table {number} of {tables}, " if tables > 1 else "") + (f"{dev} port {port}" if dev != "?"
                                                                             else f"port {port}")
        best = best_index(table)
        used = next((r for r in table if r.index == in_use), None) if in_use is not None else None
        local = sorted(r.index for r in table if r.scope == "link-local" or r.roce == "v1")
        why = (f"; indexes {', '.join(map(str, local))} are link-local or RoCE v1 GIDs, which do not route between "
               "subnets" if local else "")
        if all(r.roce is None for r in table):
            out.append(f"{where}: {len(table)} GID(s) but no RoCE version printed (ibv_devinfo before rdma-core 29 "
                       "omits it); paste `show_gids` to see which index is RoCE v2" + why + ".")
        elif best is None:
            verdict = "fail"
            out.append(f"{where}: no RoCE v2 GID with a routable address ({len(table)} GID(s)): RoCE cannot cross "
                       "subnets from this port; give its netdev an IP address (the GID table is filled from it)" + why + ".")
        elif in_use == -1:       # NCCL 2.21+ picks a GID itself (RoCE v2, the address family of NCCL_SOCKET_FAMILY)
            out.append(f"{where}: NCCL_IB_GID_INDEX=-1 lets NCCL (2.21 and later) choose the GID itself; older NCCL "
                       f"takes index 0. If RoCE still fails between subnets, set NCCL_IB_GID_INDEX={best.index}, "
                       f"{_describe(best)}{why}.")
        elif in_use is not None and (used is None or used.roce != "v2" or used.scope == "link-local"):
            verdict = "fail"
            now = _describe(used) if used else f"index {in_use} (no GID there)"
            out.append(f"{where}: NCCL_IB_GID_INDEX={in_use} is wrong: {now}. Set NCCL_IB_GID_INDEX={best.index}, "
                       f"{_describe(best)}{why}.")
        elif in_use is not None:
            verdict = "ok" if verdict == "info" else verdict
            out.append(f"{where}: NCCL_IB_GID_INDEX={in_use} is right: {_describe(used)}.")
        else:
            out.append(f"{where}: use NCCL_IB_GID_INDEX={best.index}, {_describe(best)}{why}; the same index must "
                       "be right on every host (compare their tables).")
    wrong = [line for line in out if " is wrong: " in line or ": no RoCE v2 GID " in line]
    return verdict, wrong + [line for line in out if line not in wrong]     # what fails is the headline
