"""Interface state and counters from the kernel over rtnetlink (RTM_GETLINK), standard library only.

Why not only /sys/class/net: sysfs shows the network namespace of whoever MOUNTED it, not of the
reader. A process that joined a namespace without remounting /sys (`nsenter --net`, a SLURM node in a
network namespace, some container runtimes) reads another namespace's interfaces there. Netlink
answers for the caller's own namespace, so the reader uses it whenever the sysfs view is not ours.
Layouts: linux/netlink.h, linux/rtnetlink.h, linux/if_link.h (IFLA_* numbers, struct
rtnl_link_stats64).
"""

from __future__ import annotations

import os
import socket
import struct

RTM_NEWLINK, RTM_GETLINK = 16, 18
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
IFF_UP, IFF_LOOPBACK = 0x1, 0x8
IFLA = {3: "name", 4: "mtu", 16: "operstate", 33: "carrier", 35: "carrier_changes", 47: "carrier_up_count",
        48: "carrier_down_count"}
IFLA_LINKINFO, IFLA_INFO_KIND, IFLA_STATS64 = 18, 1, 23
# RFC 2863 operational states as the kernel numbers them (IF_OPER_*), named as sysfs `operstate` writes them.
OPERSTATE = {0: "unknown", 1: "notpresent", 2: "down", 3: "lowerlayerdown", 4: "testing", 5: "dormant", 6: "up"}
# struct rtnl_link_stats64, in order (u64 each); the error counters we keep are picked by name.
STATS64 = ("rx_packets", "tx_packets", "rx_bytes", "tx_bytes", "rx_errors", "tx_errors", "rx_dropped",
           "tx_dropped", "multicast", "collisions", "rx_length_errors", "rx_over_errors", "rx_crc_errors",
           "rx_frame_errors", "rx_fifo_errors", "rx_missed_errors", "tx_aborted_errors", "tx_carrier_errors",
           "tx_fifo_errors", "tx_heartbeat_errors", "tx_window_errors")


def _attrs(data: bytes):
    """(type, payload) of each rtattr in data (4-byte aligned, nested bit masked off)."""
    at = 0
    while at + 4 <= len(data):
        length, kind = struct.unpack_from("HH", data, at)
        if length < 4:
            return
        yield kind & 0x3FFF, data[at + 4:at + length]
        at += (length + 3) & ~3


def _link(payload: bytes) -> dict:
    """One RTM_NEWLINK message body -> {index, flags, name, mtu, operstate, carrier*, kind, stats}."""
    _family, _pad, _type, index, flags, _change = struct.unpack_from("BBHiII", payload)
    link: dict = {"index": index, "flags": flags, "kind": None, "stats": {}}
    for kind, value in _attrs(payload[16:]):
        if kind == 3:
            link["name"] = value.split(b"\0", 1)[0].decode(errors="replace")
        elif kind == 16:
            link["operstate"] = OPERSTATE.get(value[0], "unknown")
        elif kind == 33:
            link["carrier"] = value[0]
        elif kind in IFLA:
            link[IFLA[kind]] = struct.unpack_from("I", value)[0]
        elif kind == IFLA_LINKINFO:
            for sub, sub_value in _attrs(value):
                if sub == IFLA_INFO_KIND:
                    link["kind"] = sub_value.split(b"\0", 1)[0].decode(errors="replace")
        elif kind == IFLA_STATS64:
            count = min(len(value) // 8, len(STATS64))
            link["stats"] = dict(zip(STATS64, struct.unpack_from(f"{count}Q", value)))
    return link


def links(timeout_s: float = 5.0) -> list[dict]:
    """Every interface of the caller's network namespace; OSError when netlink is not available."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as sock:
        sock.settimeout(timeout_s)
        body = struct.pack("BBHiII", socket.AF_UNSPEC, 0, 0, 0, 0, 0)
        seq = os.getpid() & 0xFFFF
        sock.send(struct.pack("IHHII", 16 + len(body), RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body)
        out: list[dict] = []
        while True:
            data = sock.recv(1 << 16)
            at = 0
            while at + 16 <= len(data):
                length, kind, _flags, _seq, _pid = struct.unpack_from("IHHII", data, at)
                if kind == NLMSG_DONE:
                    return out
                if kind == NLMSG_ERROR:
                    code = struct.unpack_from("i", data, at + 16)[0]
                    if code:
                        raise OSError(-code, os.strerror(-code))
                elif kind == RTM_NEWLINK:
                    out.append(_link(data[at + 16:at + length]))
                if length < 16:
                    return out
                at += (length + 3) & ~3
