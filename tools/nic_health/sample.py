"""One reading of every NIC on the node, and what two readings say (the child side of nic_health)."""

from __future__ import annotations

import shutil

from ..shared import topology
from ..shared.actions import HealthFinding
from .read_netdev import chosen, ethtool_firmware, ethtool_stats, read_netdevs
from .read_rdma import rdma_present, read_ports
from .shaping import describe as describe_shaper, read as read_shaper
from .assess import judge_netdev, judge_peers, judge_port, judge_shaper
from .models import NetdevReading, NicAffinity, PortReading, Presence

PERFTEST = ("ib_write_bw", "ib_write_lat")


def snapshot(names: list[str] | None = None) -> dict:
    """{"ports": {(device, port): raw}, "netdevs": {name: raw}}; ethtool counters where ethtool exists.
    names: the interfaces chosen at the first reading (one that is down by the second is still read)."""
    every = read_netdevs()
    picked = chosen(every) if names is None else [d for d in every if d["name"] in names]
    netdevs = {d["name"]: d for d in picked}
    for d in netdevs.values():
        if d["kind"] == "physical" and d["source"] == "sysfs":
            d["ethtool"] = ethtool_stats(d["name"])
            d["firmware"] = ethtool_firmware(d["name"])
    return {"ports": {(p["device"], p["port"]): p for p in read_ports()}, "netdevs": netdevs}


def judge(first: dict, second: dict, window_s: float) -> tuple[list[PortReading], list[NetdevReading]]:
    """Readings of what the second snapshot holds, judged against the first (a port or interface that appeared
    during the window is judged on its totals alone)."""
    ports = [judge_port(first["ports"].get(key, {}), raw, window_s) for key, raw in sorted(second["ports"].items())]
    judge_peers(ports)
    netdevs = [judge_netdev(first["netdevs"].get(name, raw), raw, window_s)
               for name, raw in sorted(second["netdevs"].items())]
    for reading in netdevs:
        reading.root_qdisc, shaper = read_shaper(reading.name)
        if shaper:
            judge_shaper(reading, describe_shaper(shaper))
    gone = sorted(set(first["netdevs"]) - set(second["netdevs"]))
    for name in gone:  # an interface that vanished mid-window (driver reset, firmware loss) is news
        reading = judge_netdev(first["netdevs"][name], first["netdevs"][name], window_s)
        reading.operstate, reading.carrier = "gone", False
        reading.problems.append(HealthFinding(subject=name, action="drain_node", code="netdev_vanished",
                                              source=reading.source, text="the interface disappeared during the window "
                                              "(driver reset, firmware lost, or the device fell off the bus)"))
        reading.action, reading.verdict = "drain_node", "fail"
        netdevs.append(reading)
    return ports, netdevs


def presence() -> list[Presence]:
    found, detail = rdma_present()
    rows = [Presence(component="rdma_devices", present=found, detail=detail)]
    ethtool = shutil.which("ethtool")
    rows.append(Presence(component="ethtool", present=bool(ethtool),
                         detail=ethtool or "not present (not on PATH): driver error counters and firmware not read"))
    tools = {name: shutil.which(name) for name in PERFTEST}
    have = [p for p in tools.values() if p]
    rows.append(Presence(component="perftest", present=len(have) == len(PERFTEST),
                         detail=", ".join(have) if have else "not present (ib_write_bw, ib_write_lat not on PATH)"))
    return rows


def affinity() -> list[NicAffinity]:
    """Each GPU's closest NIC (RDMA devices first) by PCIe path; [] without NVML or GPUs."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return []
    try:
        gpus, _ = topology.nvml_gpus(pynvml)
    except Exception:
        return []
    finally:
        pynvml.nvmlShutdown()
    nics = topology.read_nics()
    rdma = [n for n in nics if n.kind != "ethernet"] or nics
    rows = []
    for gpu in gpus:
        paths = [(topology.pcie_relation(topology.chain_of(gpu.pci), topology.chain_of(n.pci), gpu.numa_node,
                                         n.numa_node), n.name) for n in rdma]
        if paths:
            path, name = min(paths, key=lambda p: topology.PCIE_ORDER.index(p[0]))
            rows.append(NicAffinity(gpu=gpu.index, gpu_pci=gpu.pci, nic=name, path=path))
    return rows
