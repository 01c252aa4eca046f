"""Pasted `ibstat`, `ibv_devinfo` and `perfquery` output -> the same port records nic_health reads from sysfs, judged by
the same rules (one reading: totals only, no window). Formats: rdma-core infiniband-diags ibstat(8),
perfquery(8) and libibverbs' ibv_devinfo(1) as they print them."""

from __future__ import annotations

import re

# perfquery's names -> the kernel's sysfs counter names (Documentation/ABI/stable/sysfs-class-infiniband).
PERFQUERY_NAMES = {
    "SymbolErrorCounter": "symbol_error", "LinkErrorRecoveryCounter": "link_error_recovery",
    "LinkDownedCounter": "link_downed", "PortRcvErrors": "port_rcv_errors",
    "PortRcvRemotePhysicalErrors": "port_rcv_remote_physical_errors",
    "PortRcvSwitchRelayErrors": "port_rcv_switch_relay_errors", "PortXmitDiscards": "port_xmit_discards",
    "PortXmitConstraintErrors": "port_xmit_constraint_errors", "PortRcvConstraintErrors": "port_rcv_constraint_errors",
    "LocalLinkIntegrityErrors": "local_link_integrity_errors",
    "ExcessiveBufferOverrunErrors": "excessive_buffer_overrun_errors", "VL15Dropped": "VL15_dropped",
    "PortXmitData": "port_xmit_data", "PortRcvData": "port_rcv_data", "PortXmitWait": "port_xmit_wait",
}
EXPECTED = ("`ibv_devinfo` output (\"hca_id: mlx5_0\" blocks with \"port: 1\", state, link_layer), "
            "`ibstat` output (\"CA 'mlx5_0'\" then \"Port 1:\" blocks with State / Physical state / Rate / Link layer), "
            "`perfquery` output (\"# Port counters: Lid L port P\" then \"SymbolErrorCounter:....N\" lines), "
            "or `ibdiagnet` output (its Summary table \"-I- Stage  Warnings  Errors\" with one row per check, or "
            "'<port> - \"<counter>\" increased during the run' lines)")


def _port(device: str, number: int) -> dict:
    return {"device": device, "port": number, "pci": "", "fw_ver": None, "state": None, "phys_state": None,
            "rate": None, "rate_gbits": None, "link_layer": None, "gids": None, "counters": {}, "hw_counters": {}}


def parse_ibstat(text: str) -> list[dict]:
    ports, device, fw, current = [], None, None, None
    for line in text.splitlines():
        if m := re.match(r"\s*CA '([^']+)'", line):
            device, fw, current = m.group(1), None, None
        elif m := re.match(r"\s*Firmware version:\s*(\S+)", line):
            fw = m.group(1)
        elif (m := re.match(r"\s*Port (\d+):\s*$", line)) and device:
            current = _port(device, int(m.group(1)))
            current["fw_ver"] = fw
            ports.append(current)
        elif current and (m := re.match(r"\s*(State|Physical state|Rate|Link layer):\s*(.+?)\s*$", line)):
            key, value = m.groups()
            if key == "State":
                current["state"] = value.upper()
            elif key == "Physical state":
                current["phys_state"] = value
            elif key == "Link layer":
                current["link_layer"] = value
            else:
                current["rate_gbits"] = float(value) if re.fullmatch(r"[\d.]+", value) else None
                current["rate"] = f"{value} Gb/sec"
    return ports


def parse_ibv_devinfo(text: str) -> list[dict]:
    ports, device, fw, current = [], None, None, None
    for line in text.splitlines():
        if m := re.match(r"\s*hca_id:\s*(\S+)", line):
            device, fw, current = m.group(1), None, None
        elif m := re.match(r"\s*fw_ver:\s*(\S+)", line):
            fw = m.group(1)
        elif device and (m := re.match(r"\s*port:\s*(\d+)\s*$", line)):
            current = _port(device, int(m.group(1)))
            current["fw_ver"] = fw
            ports.append(current)
        elif current and (m := re.match(r"\s*state:\s*PORT_(\w+)", line)):
            current["state"] = m.group(1)
        elif current and (m := re.match(r"\s*link_layer:\s*(\S+)", line)):
            current["link_layer"] = m.group(1)
    return ports


def parse_perfquery(text: str) -> list[dict]:
    ports, current = [], None
    for line in text.splitlines():
        if m := re.match(r"#\s*Port (?:extended )?counters:\s*Lid (\S+) port (\d+)", line):
            current = _port(f"lid {m.group(1)}", int(m.group(2)))
            current["state"] = None
            ports.append(current)
        elif current and (m := re.match(r"(\w+):\.+\s*(\d+)\s*$", line)) and m.group(1) in PERFQUERY_NAMES:
            current["counters"][PERFQUERY_NAMES[m.group(1)]] = int(m.group(2))
    return ports


def parse(text: str) -> tuple[str, list[dict]]:
    """(format, ports); ValueError naming the formats accepted when the text is neither."""
    for name, reader in (("ibstat", parse_ibstat), ("ibv_devinfo", parse_ibv_devinfo), ("perfquery", parse_perfquery)):
        ports = reader(text)
        if ports:
            return name, ports
    head = text.strip().splitlines()[0][:80] if text.strip() else "(empty)"
    raise ValueError(f"text: not a format nic_health reads; expected {EXPECTED}; it starts with {head!r}")
