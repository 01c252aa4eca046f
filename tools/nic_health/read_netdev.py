"""Network interfaces: state, carrier changes, speed, MTU and error counters, per interface.

From /sys/class/net when that view is this process's own network namespace (always for a fixture
tree under MLENG_SYSFS), else from rtnetlink (tools/nic_health/netlink.py says why). `ethtool -S` /
`-i` add the driver's own error counters and the firmware version where ethtool is installed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from ..shared import topology
from .netlink import IFF_LOOPBACK, IFF_UP, links

ARPHRD_LOOPBACK = 772
# The kernel statistics that count faults (struct rtnl_link_stats64 / sysfs statistics/*), not traffic.
ERROR_STATS = ("rx_errors", "tx_errors", "rx_crc_errors", "rx_frame_errors", "rx_length_errors",
               "rx_missed_errors", "rx_over_errors", "rx_fifo_errors", "tx_carrier_errors", "tx_aborted_errors")
# `ethtool -S` names vary by driver; these parts mark an error counter (mlx5 rx_symbol_err_phy,
# rx_crc_errors_phy, rx_out_of_buffer, link_down_events_phy; bnxt rx_discards; ice rx_crc_errors).
ETHTOOL_ERROR_PARTS = ("err", "crc", "symbol", "discard", "out_of_buffer", "link_down")
ETHTOOL_TIMEOUT_S = 5


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _pci(device: Path) -> str:
    """The PCI address the interface's device link resolves to ('' for virtio and other non-PCI parents)."""
    name = os.path.basename(os.path.realpath(device))
    return name if re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", name) else ""


def _hex(text: str | None) -> int:
    try:
        return int(text or "0", 16)
    except ValueError:
        return 0


def _from_sysfs(path: Path) -> dict:
    flags = _hex(topology.read_attr(path / "flags"))
    device = path / "device"
    has_device = os.path.exists(device)
    speed = _int(topology.read_attr(path / "speed"))
    carrier = topology.read_attr(path / "carrier")
    stats = {name: _int(topology.read_attr(path / "statistics" / name)) for name in ERROR_STATS}
    return {
        "name": path.name, "index": _int(topology.read_attr(path / "ifindex")), "flags": flags,
        "loopback": _int(topology.read_attr(path / "type")) == ARPHRD_LOOPBACK,
        "kind": "physical" if has_device else "virtual",
        "pci": _pci(device) if has_device else "",
        "driver": os.path.basename(os.path.realpath(device / "driver")) if os.path.exists(device / "driver") else None,
        "operstate": topology.read_attr(path / "operstate"), "carrier": None if carrier is None else carrier == "1",
        "carrier_changes": _int(topology.read_attr(path / "carrier_changes")),
        "speed_mbps": speed if speed is not None and speed > 0 else None,
        "mtu": _int(topology.read_attr(path / "mtu")), "stats": {k: v for k, v in stats.items() if v is not None},
        "source": "sysfs",
    }


def _from_netlink(link: dict) -> dict:
    return {
        "name": link.get("name", f"if{link['index']}"), "index": link["index"], "flags": link["flags"],
        "loopback": bool(link["flags"] & IFF_LOOPBACK),
        "kind": link.get("kind") or "physical", "pci": "", "driver": None,
        "operstate": link.get("operstate"), "carrier": None if "carrier" not in link else bool(link["carrier"]),
        "carrier_changes": link.get("carrier_changes"), "speed_mbps": None, "mtu": link.get("mtu"),
        "stats": {k: v for k, v in link.get("stats", {}).items() if k in ERROR_STATS}, "source": "netlink",
    }


def sysfs_is_ours(links: list[dict] | None) -> bool:
    """True when /sys/class/net shows this process's own interfaces (same names, same ifindex)."""
    if os.environ.get("MLENG_SYSFS") or links is None:
        return True
    base = topology.SYSFS / "class" / "net"
    return all(_int(topology.read_attr(base / link.get("name", "?") / "ifindex")) == link["index"] for link in links)


def read_netdevs() -> list[dict]:
    """Every interface of this namespace but loopback, as plain dicts (one snapshot)."""
    try:
        found_links = links()
    except OSError:
        found_links = None
    if sysfs_is_ours(found_links):
        base = topology.SYSFS / "class" / "net"
        names = sorted(os.listdir(base)) if base.is_dir() else []
        found = [_from_sysfs(base / name) for name in names]
    else:
        found = [_from_netlink(link) for link in found_links or []]
    return [d for d in found if not d["loopback"]]


def chosen(netdevs: list[dict]) -> list[dict]:
    """The interfaces that carry the node's traffic: physical ones; where there are none (a container or
    network namespace whose only link is a veth), the virtual ones that are administratively up.
    Container veths and bridges on a real host come and go with containers: never judged there."""
    physical = [d for d in netdevs if d["kind"] == "physical"]
    return physical or [d for d in netdevs if d["flags"] & IFF_UP]


def ethtool_stats(name: str) -> dict[str, int]:
    """The error counters of `ethtool -S name` ({} when it has none or fails)."""
    out = _ethtool("-S", name)
    found = {}
    for line in out.splitlines():
        m = re.match(r"\s*([\w.\[\]-]+):\s*(\d+)\s*$", line)
        if m and any(part in m.group(1).lower() for part in ETHTOOL_ERROR_PARTS):
            found[f"ethtool:{m.group(1)}"] = int(m.group(2))
    return found


def ethtool_firmware(name: str) -> str | None:
    m = re.search(r"^firmware-version:\s*(\S.*)$", _ethtool("-i", name), re.M)
    return m.group(1).strip() if m else None


def _ethtool(flag: str, name: str) -> str:
    exe = shutil.which("ethtool")
    if not exe or not re.fullmatch(r"[\w.:@-]{1,15}", name):
        return ""
    try:
        return subprocess.run([exe, flag, name], capture_output=True, text=True, timeout=ETHTOOL_TIMEOUT_S).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
