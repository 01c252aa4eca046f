"""RDMA ports from /sys/class/infiniband (the kernel's documented ABI, Documentation/ABI/stable/sysfs-class-infiniband).

One snapshot is a dict per port: its attributes and every counter file present. The sysfs root is
shared/topology.SYSFS (MLENG_SYSFS): fixtures of real devices go through this same code.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..shared import topology

# 'fe80:0000:...' with every group zero is an empty GID slot.
_EMPTY_GID = re.compile(r"^[0:]*$")


def _int(text: str | None) -> int | None:
    try:
        return int(text, 0) if text is not None else None
    except ValueError:
        return None


def _state(text: str | None) -> str | None:
    """'4: ACTIVE' -> 'ACTIVE' (sysfs prefixes the number)."""
    return text.split(":", 1)[-1].strip() if text else None


def _gids(port: Path) -> int:
    """Non-empty GID table entries; the table can have 256 slots, so stop at the first empty run of 8."""
    found, empty = 0, 0
    for index in range(256):
        value = topology.read_attr(port / "gids" / str(index))
        if value is None:
            break
        if _EMPTY_GID.match(value):
            empty += 1
            if empty >= 8:
                break
        else:
            found, empty = found + 1, 0
    return found


def _counters(folder: Path) -> dict[str, int]:
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return {}
    values = {name: _int(topology.read_attr(folder / name)) for name in names}
    return {k: v for k, v in values.items() if v is not None}


def read_ports() -> list[dict]:
    """Every port of every RDMA device: [] when there are none (or no /sys/class/infiniband)."""
    root = topology.SYSFS / "class" / "infiniband"
    try:
        devices = sorted(os.listdir(root))
    except OSError:
        return []
    ports = []
    for device in devices:
        base = root / device
        pci = os.path.basename(os.path.realpath(base / "device"))
        for number in sorted(os.listdir(base / "ports") if (base / "ports").is_dir() else [], key=lambda p: int(p) if p.isdigit() else 0):
            port = base / "ports" / number
            rate = topology.read_attr(port / "rate")
            m = re.match(r"\s*([\d.]+)", rate or "")
            ports.append({
                "device": device, "port": _int(number) or 0, "pci": pci if pci != "device" else "",
                "fw_ver": topology.read_attr(base / "fw_ver"),
                "state": _state(topology.read_attr(port / "state")),
                "phys_state": _state(topology.read_attr(port / "phys_state")),
                "rate": rate, "rate_gbits": float(m.group(1)) if m else None,
                "link_layer": topology.read_attr(port / "link_layer"), "gids": _gids(port),
                "counters": _counters(port / "counters"), "hw_counters": _counters(port / "hw_counters"),
            })
    return ports


def rdma_present() -> tuple[bool, str]:
    root = topology.SYSFS / "class" / "infiniband"
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return False, f"not present ({root} does not exist: no RDMA driver loaded)"
    return (bool(names), f"{len(names)} device(s): {', '.join(names)}" if names else f"not present ({root} is empty)")
