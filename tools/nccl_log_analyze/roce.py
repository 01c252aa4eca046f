"""RoCE completion errors in an NCCL log and the GID index behind them.

"NET/IB : Got completion ... error 12" is IBV_WC_RETRY_EXC_ERR: the sending NIC retried until its retry count
ran out and the peer never acknowledged. On RoCE between hosts in different subnets the usual reason is the
GID index: index 0 (and 1) on mlx5 ports is the link-local fe80:: GID, which no router forwards. Sources and
the show_gids layout: knowledge/network/inter-node.md, "RoCE across subnets: the GID index".
"""

import re
from dataclasses import dataclass

RETRY_EXCEEDED = 12          # IBV_WC_RETRY_EXC_ERR in libibverbs' enum ibv_wc_status
MAX_ERRORS = 200

# 2.8: "Got completion with error 12, opcode 0, ..."; 2.10-2.12: "Got completion from peer 1.2.3.4<38560> with
# error 12, ..."; 2.18+: "... with status=12 opcode=0 ... localGid ::ffff:a.b.c.d remoteGids::ffff:..." and newer
# "status=IBV_WC_RETRY_EXC_ERR(12)".
_COMPLETION = re.compile(r"Got completion (?:from peer (?P<peer>[^\s<]+)(?:<\d+>)? )?with (?:error |status=)"
                         r"(?:\w+\()?(?P<status>\d+)")
_GIDS = re.compile(r"localGid ?(?P<local>[0-9a-fA-F:.]*)\s+remoteGids? ?(?P<remote>[0-9a-fA-F:.]*)")
_LINK_LOCAL = re.compile(r"^fe[89ab][0-9a-f]:", re.I)


@dataclass(frozen=True)
class CompletionError:
    host: str
    status: int
    peer: str | None
    local_gid: str | None
    remote_gid: str | None


def note_completion_error(parsed, host: str, msg: str) -> None:
    """Record a WARN line that reports a failed work completion (any NCCL wording)."""
    m = _COMPLETION.search(msg)
    if not m or len(parsed.completion_errors) >= MAX_ERRORS:
        return
    gids = _GIDS.search(msg)
    parsed.completion_errors.append(CompletionError(
        host, int(m["status"]), m["peer"], (gids["local"] or None) if gids else None,
        (gids["remote"] or None) if gids else None))


def gid_scope_of_text(gid: str | None) -> str | None:
    """'link-local' (fe80::/10), 'ipv4' (::ffff:a.b.c.d) or 'global' for a GID written as an IPv6 address."""
    if not gid or set(gid) <= {":", "0"}:
        return None
    if _LINK_LOCAL.match(gid):
        return "link-local"
    if gid.lower().startswith("::ffff:"):          # IPv4-mapped; cut short ("::ffff:") where a user redacted it
        return "ipv4" if gid.count(".") == 3 else None
    return "global"


SET_IT = ("Set NCCL_IB_GID_INDEX on every host to the index whose GID is RoCE v2 with the host's routable IPv4 "
          "address (typically 3; show_gids lists them, or paste its output to nic_health)")
WHY_12 = ("completion error 12 (IBV_WC_RETRY_EXC_ERR: the NIC retried until its retry count ran out, the peer "
          "never answered)")


def check_roce_gid(parsed, procs, rep, name_list) -> None:
    """Flag retry-exceeded completions on RoCE with what the log says about the GID index used."""
    errors = [e for e in parsed.completion_errors if e.status == RETRY_EXCEEDED]
    roce = any(nic[2] == "RoCE" for p in procs for nic in p.ib_nics.values())
    if not errors or not (roce or any(e.local_gid for e in errors)):
        return
    hosts = {e.host for e in errors if e.host != "?"} or {p.host for p in procs if p.host != "?" and
                                                         any(nic[2] == "RoCE" for nic in p.ib_nics.values())}
    peers = sorted({e.peer for e in errors if e.peer})
    where = (name_list(hosts) or "this log's hosts") + (f" (peer {', '.join(peers[:3])})" if peers else "")
    printed = {(i, scope) for p in procs for i, scope in p.gids.items()}
    seen = {gid_scope_of_text(e.local_gid) for e in errors} | {gid_scope_of_text(e.remote_gid) for e in errors}
    scopes = {s for _, s in printed} | (seen - {None})
    set_to = sorted({p.env["NCCL_IB_GID_INDEX"] for p in procs if "NCCL_IB_GID_INDEX" in p.env})
    head = f"RoCE {WHY_12} on {where}"
    if "link-local" in scopes or set(set_to) & {"0", "1"}:
        used = sorted({str(i) for i, s in printed if s == "link-local"}) or set_to or ["?"]
        rep.flag("roce_gid", "fail", f"{head}: NCCL used GID index {'/'.join(used)}, a link-local fe80:: GID (RoCE v1 "
                 "on index 0): link-local and RoCE v1 GIDs do not route between subnets, so hosts behind different "
                 f"switches or racks cannot reach each other. {SET_IT}.")
    elif scopes:
        gids = ", ".join(sorted({g for e in errors for g in (e.local_gid, e.remote_gid) if g})[:4]) or "see the GID lines"
        rep.flag("roce_unreachable", "fail", f"{head}, although the GIDs NCCL used are routable ({gids}): the GID "
                 "index is not the cause. The NICs cannot reach each other over RoCE: routing between the subnets, a "
                 "switch ACL, PFC/ECN or MTU; test the pair with ib_write_bw -x <that GID index> and check the switches.")
    elif set_to:
        rep.flag("roce_gid", "warn", f"{head} with NCCL_IB_GID_INDEX={'/'.join(set_to)}: check with show_gids on every "
                 "host that this index is RoCE v2 with the host's routable IPv4 address (indexes differ between "
                 "hosts in containers); if it is, the NICs cannot reach each other (routing, switch ACL, PFC).")
    else:
        rep.flag("roce_gid", "fail", f"{head}; NCCL_IB_GID_INDEX is not set and the log does not show the GID NCCL "
                 "used: NCCL releases whose default is 0 use the port's link-local fe80:: GID (RoCE v1), which does "
                 f"not route between subnets (hosts behind different switches or racks). {SET_IT}.")
