"""Pasted `ibstat`, `ibv_devinfo` and `perfquery` output -> the same port records nic_health reads from sysfs, judged by
the same rules (one reading: totals only, no window). Formats: rdma-core infiniband-diags ibstat(8),
perfquery(8) and libibverbs' ibv_devinfo(1) as they print them."""

from __future__ import annotations

import re

from ..shared.pasted_numbers import count, decimal, lines_of

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


# One line each (cut by capped_lines); values are taken whole and trimmed in code, never by a lazy `(.+?)\s*$`.
IBSTAT_CA = re.compile(r"\s*CA '([^']+)'")
IBSTAT_FW = re.compile(r"\s*Firmware version:\s*(\S+)")
IBSTAT_PORT = re.compile(r"\s*Port (\d+):\s*$")
IBSTAT_FIELD = re.compile(r"\s*(State|Physical state|Rate|Link layer):(.*)$")
DEVINFO_HCA = re.compile(r"\s*hca_id:\s*(\S+)")
DEVINFO_FW = re.compile(r"\s*fw_ver:\s*(\S+)")
DEVINFO_PORT = re.compile(r"\s*port:\s*(\d+)\s*$")
DEVINFO_STATE = re.compile(r"\s*state:\s*PORT_(\w+)")
DEVINFO_LINK_LAYER = re.compile(r"\s*link_layer:\s*(\S+)")
PERFQUERY_PORT = re.compile(r"#\s*Port (?:extended )?counters:\s*Lid (\S+) port (\d+)")
PERFQUERY_COUNTER = re.compile(r"(\w+):\.+\s*(\d+)\s*$")
MAX_PORTS = 256          # ports judged in one paste (a node has up to ~16)
NUMERIC = re.compile(r"[\d.]+")     # a rate made of digits and dots must be one number; a word ("Unknown") is none


def _port(device: str, number: int) -> dict:
    return {"device": device, "port": number, "pci": "", "fw_ver": None, "state": None, "phys_state": None,
            "rate": None, "rate_gbits": None, "link_layer": None, "gids": None, "counters": {}, "hw_counters": {}}


def parse_ibstat(text: str) -> list[dict]:
    ports, device, fw, current = [], None, None, None
    with lines_of(text) as lines:
        for line in lines:
            if m := IBSTAT_CA.match(line):
                device, fw, current = m.group(1), None, None
            elif m := IBSTAT_FW.match(line):
                fw = m.group(1)
            elif (m := IBSTAT_PORT.match(line)) and device:
                current = _port(device, count(m.group(1), "Port"))
                current["fw_ver"] = fw
                ports.append(current)
            elif current and (m := IBSTAT_FIELD.match(line)) and (value := m.group(2).strip()):
                key = m.group(1)
                if key == "State":
                    current["state"] = value.upper()
                elif key == "Physical state":
                    current["phys_state"] = value
                elif key == "Link layer":
                    current["link_layer"] = value
                else:
                    current["rate_gbits"] = decimal(value, "Rate (Gb/sec)") if NUMERIC.fullmatch(value) else None
                    current["rate"] = f"{value} Gb/sec"
    return ports


def parse_ibv_devinfo(text: str) -> list[dict]:
    ports, device, fw, current = [], None, None, None
    with lines_of(text) as lines:
        for line in lines:
            if m := DEVINFO_HCA.match(line):
                device, fw, current = m.group(1), None, None
            elif m := DEVINFO_FW.match(line):
                fw = m.group(1)
            elif device and (m := DEVINFO_PORT.match(line)):
                current = _port(device, count(m.group(1), "port"))
                current["fw_ver"] = fw
                ports.append(current)
            elif current and (m := DEVINFO_STATE.match(line)):
                current["state"] = m.group(1)
            elif current and (m := DEVINFO_LINK_LAYER.match(line)):
                current["link_layer"] = m.group(1)
    return ports


def parse_perfquery(text: str) -> list[dict]:
    ports, current = [], None
    with lines_of(text) as lines:
        for line in lines:
            if m := PERFQUERY_PORT.match(line):
                current = _port(f"lid {m.group(1)}", count(m.group(2), "port"))
                current["state"] = None
                ports.append(current)
            elif current and (m := PERFQUERY_COUNTER.match(line)) and m.group(1) in PERFQUERY_NAMES:
                current["counters"][PERFQUERY_NAMES[m.group(1)]] = count(m.group(2), m.group(1))
    return ports


def parse(text: str) -> tuple[str, list[dict]]:
    """(format, ports); ValueError naming the formats accepted when the text is neither, or naming the line of
    a number the tool would not print."""
    for name, reader in (("ibstat", parse_ibstat), ("ibv_devinfo", parse_ibv_devinfo), ("perfquery", parse_perfquery)):
        ports = reader(text)
        if len(ports) > MAX_PORTS:   # judging is per port: 49,000 ports took 6 s
            raise ValueError(f"text: {len(ports):,} {name} ports, more than the {MAX_PORTS} judged from one paste; "
                             "paste one node's output")
        if ports:
            return name, ports
    head = text.strip().splitlines()[0][:80] if text.strip() else "(empty)"
    raise ValueError(f"text: not a format nic_health reads; expected {EXPECTED}; it starts with {head!r}")
