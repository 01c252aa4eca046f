"""What this node is made of: GPUs (NVML), their NVLinks and PCIe paths, NICs (sysfs).

Read by gpu_topology (which turns it into binding advice) and p2p_bandwidth (which names the link
each pair should reach). Pure helpers work on sysfs paths, so tests use a fake tree (MLENG_SYSFS).
"""

import glob
import os
import re
from pathlib import Path

from ..engine.data import load_data
from ..engine.spec import Field, Record

SYSFS = Path(os.environ.get("MLENG_SYSFS", "/sys"))  # tests point this at a fake tree
# Closest first; the names are nvidia-smi topo -m's.
PCIE_ORDER = ["PIX", "PXB", "PHB", "NODE", "SYS"]
ARCH_LINK = {"ampere": "nvlink3", "hopper": "nvlink4", "blackwell": "nvlink5"}


class GpuInfo(Record):
    index: int = Field(description="NVML index.")
    name: str = Field(description="GPU name.")
    pci: str = Field(description="PCI address (domain:bus:device.function).")
    numa_node: int | None = Field(None, description="NUMA node (None when the kernel does not say).")
    cpus: str = Field("", description="CPU list local to this GPU (sysfs local_cpulist).")
    nvlinks_active: int = Field(0, description="Active NVLinks.")
    best_nic: str | None = Field(None, description="Closest NIC.")
    best_nic_path: str | None = Field(None, description="PCIe path to it (PIX/PXB/PHB/NODE/SYS).")


class NicInfo(Record):
    name: str = Field(description="Device (mlx5_0) or interface (eth0) name.")
    kind: str = Field(description="infiniband | roce | ethernet | efa; rdma when read from pasted text (IB or RoCE unknown).")
    pci: str = Field(description="PCI address.")
    numa_node: int | None = Field(None, description="NUMA node.")
    rate_gbits: float | None = Field(None, description="Link rate, Gb/s.")
    state: str | None = Field(None, description="Port or interface state.")


# Pure helpers (tested with fake sysfs paths)

def pci_chain(pci_path: str) -> list[str]:
    """'/sys/devices/pci0000:17/0000:17:00.0/0000:18:00.0' -> ['pci0000:17', '0000:17:00.0', '0000:18:00.0']."""
    parts = [p for p in pci_path.split("/") if p]
    start = next((i for i, p in enumerate(parts) if p.startswith("pci")), len(parts))
    return parts[start:]


def pcie_relation(chain_a: list[str], chain_b: list[str], numa_a: int | None, numa_b: int | None) -> str:
    """nvidia-smi's name for the PCIe path between two devices, from their sysfs chains."""
    if not chain_a or not chain_b or chain_a[0] != chain_b[0]:
        same_node = numa_a is not None and numa_a == numa_b and numa_a >= 0
        return "NODE" if same_node else "SYS"
    common = 0
    for x, y in zip(chain_a, chain_b):
        if x != y:
            break
        common += 1
    if common <= 1:  # only the host bridge (root complex) is shared
        return "PHB"
    # Below a shared bridge: one switch (up + down ports) is at most 2 levels on each side.
    return "PIX" if max(len(chain_a), len(chain_b)) - common <= 2 else "PXB"


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]."""
    cpus = []
    for part in filter(None, text.strip().split(",")):
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def nvml_busid_to_sysfs(bus_id: str) -> str:
    """NVML '00000000:18:00.0' -> sysfs '0000:18:00.0'."""
    bus_id = bus_id.lower()
    domain, rest = bus_id.split(":", 1)
    return f"{int(domain, 16):04x}:{rest}"


def read_attr(path: Path) -> str | None:
    """One sysfs attribute, stripped; None when it is absent or unreadable (EINVAL on a link that is down)."""
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


_read = read_attr


def _numa(pci: str) -> int | None:
    value = _read(SYSFS / "bus" / "pci" / "devices" / pci / "numa_node")
    return int(value) if value not in (None, "") else None


def chain_of(pci: str) -> list[str]:
    try:
        return pci_chain(os.path.realpath(SYSFS / "bus" / "pci" / "devices" / pci))
    except OSError:
        return []


def read_nics() -> list[NicInfo]:
    nics: dict[str, NicInfo] = {}
    for dev in sorted(glob.glob(str(SYSFS / "class" / "infiniband" / "*"))):
        pci = os.path.basename(os.path.realpath(os.path.join(dev, "device")))
        rate, state, layer = None, None, None
        for port in sorted(glob.glob(os.path.join(dev, "ports", "*"))):
            m = re.match(r"\s*([\d.]+)", _read(Path(port) / "rate") or "")
            rate = float(m.group(1)) if m else rate
            state = (_read(Path(port) / "state") or "").split(":")[-1].strip() or state
            layer = _read(Path(port) / "link_layer") or layer
        name = os.path.basename(dev)
        driver = os.path.basename(os.path.realpath(os.path.join(dev, "device", "driver")))
        kind = "efa" if driver == "efa" else "roce" if (layer or "").lower() == "ethernet" else "infiniband"
        nics[pci] = NicInfo(name=name, kind=kind, pci=pci, numa_node=_numa(pci), rate_gbits=rate, state=state)
    for iface in sorted(glob.glob(str(SYSFS / "class" / "net" / "*"))):
        if not os.path.exists(os.path.join(iface, "device")):
            continue  # virtual interfaces (lo, docker0, bridges) have no device
        pci = os.path.basename(os.path.realpath(os.path.join(iface, "device")))
        if not re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", pci) or pci in nics:
            continue
        speed = _read(Path(iface) / "speed")
        nics[pci] = NicInfo(name=os.path.basename(iface), kind="ethernet", pci=pci, numa_node=_numa(pci),
                            rate_gbits=int(speed) / 1000 if speed and speed.lstrip("-").isdigit() and int(speed) > 0 else None,
                            state=_read(Path(iface) / "operstate"))
    return list(nics.values())


def nvml_gpus(pynvml) -> tuple[list[GpuInfo], list[list[str]]]:
    count = pynvml.nvmlDeviceGetCount()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    gpus, remote = [], []
    for i, h in enumerate(handles):
        name = pynvml.nvmlDeviceGetName(h)
        name = name.decode() if isinstance(name, bytes) else name
        bus = pynvml.nvmlDeviceGetPciInfo(h).busId
        pci = nvml_busid_to_sysfs(bus.decode() if isinstance(bus, bytes) else bus)
        peers: dict[str, int] = {}
        active = 0
        for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                if pynvml.nvmlDeviceGetNvLinkState(h, link) != pynvml.NVML_FEATURE_ENABLED:
                    continue
            except pynvml.NVMLError:
                break
            active += 1
            try:
                # The _v2 name is missing from older nvidia-ml-py (13.610 on the H200 machine).
                remote_pci = getattr(pynvml, "nvmlDeviceGetNvLinkRemotePciInfo_v2", None) or \
                    pynvml.nvmlDeviceGetNvLinkRemotePciInfo
                rb = remote_pci(h, link).busId
                rb = nvml_busid_to_sysfs(rb.decode() if isinstance(rb, bytes) else rb)
            except pynvml.NVMLError:
                rb = "?"
            peers[rb] = peers.get(rb, 0) + 1
        remote.append(peers)
        gpus.append(GpuInfo(index=i, name=name, pci=pci, numa_node=_numa(pci), nvlinks_active=active,
                            cpus=_read(SYSFS / "bus" / "pci" / "devices" / pci / "local_cpulist") or ""))
    by_pci = {g.pci: g.index for g in gpus}
    matrix = []
    for a in gpus:
        row = []
        for b in gpus:
            if a.index == b.index:
                row.append("X")
                continue
            direct = remote[a.index].get(b.pci, 0)
            via_switch = sum(n for p, n in remote[a.index].items() if p not in by_pci)
            links = direct or (min(via_switch, b.nvlinks_active) if via_switch and b.nvlinks_active else 0)
            row.append(f"NV{links}" if links else pcie_relation(chain_of(a.pci), chain_of(b.pci), a.numa_node, b.numa_node))
        matrix.append(row)
    return gpus, matrix


def nvlink_record(gpu_name: str) -> dict | None:
    """interconnects.toml NVLink record for a GPU, from its architecture in accelerators.toml."""
    try:
        from .accelerators import match_accelerator

        accel = match_accelerator(gpu_name)
    except Exception:
        return None
    link_id = ARCH_LINK.get((accel or {}).get("arch", ""))
    return next((r for r in load_data("interconnects")["link"] if r["id"] == link_id), None)
