"""gpu_topology — how GPUs, CPUs and NICs are wired inside this node, and how to bind ranks to them.

GPU<->GPU links (NVLink count, or the PCIe path: PIX one switch, PXB several switches, PHB through a
host bridge, NODE across host bridges of one NUMA node, SYS across sockets), each GPU's NUMA node and
CPU list, NICs (InfiniBand/RoCE and Ethernet) with their NUMA node and PCIe path to each GPU. From NVML
and sysfs, plus `nvidia-smi topo -m` when present. Advice: CPUs to bind each local rank to, the NIC
each GPU should use, and what a mismatch costs. Reads only; needs no torch.

By hand:
    python -m tools.gpu_topology
    srun --ntasks-per-node=1 python -m tools.gpu_topology --json    # one per node, compare nodes
"""

import glob
import os
import re
import shutil
import subprocess
from pathlib import Path

from pydantic import BaseModel

from tools.harness import Field, Params, Result, ToolFailure, ToolSpec, load_data

SYSFS = Path(os.environ.get("MLENG_SYSFS", "/sys"))  # tests point this at a fake tree
# Closest first; the names are nvidia-smi topo -m's.
PCIE_ORDER = ["PIX", "PXB", "PHB", "NODE", "SYS"]
ARCH_LINK = {"ampere": "nvlink3", "hopper": "nvlink4", "blackwell": "nvlink5"}


class GpuTopologyParams(Params):
    include_nvidia_smi: bool = Field(True, description="Also return `nvidia-smi topo -m` as text when it exists.")


class GpuInfo(BaseModel):
    index: int = Field(description="NVML index.")
    name: str = Field(description="GPU name.")
    pci: str = Field(description="PCI address (domain:bus:device.function).")
    numa_node: int | None = Field(None, description="NUMA node (None when the kernel does not say).")
    cpus: str = Field("", description="CPU list local to this GPU (sysfs local_cpulist).")
    nvlinks_active: int = Field(0, description="Active NVLinks.")
    best_nic: str | None = Field(None, description="Closest NIC.")
    best_nic_path: str | None = Field(None, description="PCIe path to it (PIX/PXB/PHB/NODE/SYS).")


class NicInfo(BaseModel):
    name: str = Field(description="Device (mlx5_0) or interface (eth0) name.")
    kind: str = Field(description="infiniband | roce | ethernet | efa.")
    pci: str = Field(description="PCI address.")
    numa_node: int | None = Field(None, description="NUMA node.")
    rate_gbits: float | None = Field(None, description="Link rate, Gb/s.")
    state: str | None = Field(None, description="Port or interface state.")


class GpuTopologyResult(Result):
    gpu_count: int = Field(0, description="GPUs NVML sees.")
    gpus: list[GpuInfo] = Field(default_factory=list, description="Per GPU.")
    links: list[list[str]] = Field(default_factory=list, description="GPU x GPU matrix: X, NV<n>, PIX, PXB, PHB, NODE or SYS.")
    nics: list[NicInfo] = Field(default_factory=list, description="Network devices with a PCI address.")
    nic_paths: dict[str, list[str]] = Field(default_factory=dict, description="NIC -> PCIe path from each GPU.")
    binding: list[str] = Field(default_factory=list, description="Per local rank: CPUs and NIC to use.")
    nvidia_smi_topo: str | None = Field(None, description="`nvidia-smi topo -m` output, when present.")


# ---------------------------------------------------------------------------------------------------
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


def binding_advice(gpus: list[GpuInfo], nics: list[NicInfo]) -> tuple[list[str], list[str]]:
    """(per-rank binding lines, warnings) from the GPUs' NUMA/CPU locality and their closest NICs."""
    lines, warns = [], []
    for g in gpus:
        nic = f", NIC {g.best_nic} ({g.best_nic_path})" if g.best_nic else ""
        lines.append(f"local rank {g.index} -> GPU {g.index}: CPUs {g.cpus or '?'} (NUMA {g.numa_node}){nic}")
        if g.best_nic and g.best_nic_path == "SYS":
            warns.append(f"GPU {g.index} has no NIC on its own socket (closest {g.best_nic} is SYS): its network "
                         "traffic crosses the CPU interconnect, and NCCL may not use GPUDirect RDMA at that "
                         "distance (NCCL_NET_GDR_LEVEL), which costs inter-node bandwidth.")
    users: dict[str, list[int]] = {}
    for g in gpus:
        if g.best_nic:
            users.setdefault(g.best_nic, []).append(g.index)
    rdma = [n for n in nics if n.kind in ("infiniband", "roce", "efa")]
    if rdma and len(rdma) < len(gpus):
        shared = {n: u for n, u in users.items() if len(u) > 1}
        if shared:
            warns.append("GPUs share NICs (" + "; ".join(f"{n}: GPUs {u}" for n, u in shared.items())
                         + "): inter-node bandwidth per GPU is the NIC's divided among them.")
    numas = {g.numa_node for g in gpus if g.numa_node is not None and g.numa_node >= 0}
    if len(numas) > 1:
        warns.append(f"GPUs sit on {len(numas)} NUMA nodes: bind each rank to its GPU's CPUs (torchrun does "
                     "not; use numactl/taskset in the rank, or srun --cpu-bind). A rank on the far "
                     "socket pays a cross-socket hop on every host-device copy and data-loader batch.")
    return lines, warns


# ---------------------------------------------------------------------------------------------------
# Reading the machine

def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _numa(pci: str) -> int | None:
    value = _read(SYSFS / "bus" / "pci" / "devices" / pci / "numa_node")
    return int(value) if value not in (None, "") else None


def _chain(pci: str) -> list[str]:
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


def _nvml_gpus(pynvml) -> tuple[list[GpuInfo], list[list[str]]]:
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
            row.append(f"NV{links}" if links else pcie_relation(_chain(a.pci), _chain(b.pci), a.numa_node, b.numa_node))
        matrix.append(row)
    return gpus, matrix


def _nvidia_smi_topo() -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout[:8000] if out.returncode == 0 else None


def run(params: GpuTopologyParams, progress) -> GpuTopologyResult:
    progress(0.1, "reading NICs from sysfs")
    nics = read_nics()
    try:
        import pynvml
    except ImportError:
        raise ToolFailure("the NVML Python binding is missing: pip install nvidia-ml-py (gpu_topology reads "
                          "GPU links and PCI addresses through NVML)") from None
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        rdma = [n.name for n in nics if n.kind != "ethernet"]
        return GpuTopologyResult(
            verdict="info", nics=nics,
            findings=[f"No NVIDIA GPUs visible: NVML could not start ({exc}). Nothing to map on this machine "
                      "(no driver, or a CPU-only node)."
                      + (f" RDMA NICs present: {', '.join(rdma)}." if rdma else "")],
            next=["env_report", "gpu_health"])
    try:
        progress(0.4, "reading GPUs and NVLinks from NVML")
        gpus, matrix = _nvml_gpus(pynvml)
    finally:
        pynvml.nvmlShutdown()
    if not gpus:
        raise ToolFailure("NVML started but reports 0 GPUs: check CUDA_VISIBLE_DEVICES is not hiding them and "
                          "that `nvidia-smi` lists them")
    nic_paths = {}
    for nic in nics:
        nic_paths[nic.name] = [pcie_relation(_chain(g.pci), _chain(nic.pci), g.numa_node, nic.numa_node) for g in gpus]
    for g in gpus:
        ranked = sorted((PCIE_ORDER.index(nic_paths[n.name][g.index]), n.kind == "ethernet", n.name) for n in nics)
        if ranked:
            g.best_nic, g.best_nic_path = ranked[0][2], PCIE_ORDER[ranked[0][0]]
    binding, warns = binding_advice(gpus, nics)
    return GpuTopologyResult(
        verdict="warn" if warns else "ok", gpu_count=len(gpus), gpus=gpus, links=matrix, nics=nics,
        nic_paths=nic_paths, binding=binding, findings=summary_findings(gpus, matrix, nics) + warns,
        nvidia_smi_topo=_nvidia_smi_topo() if params.include_nvidia_smi else None,
        next=["p2p_bandwidth", "collective_bench", "knowledge://network/intra-node.md",
              "knowledge://cpu-memory/numa-binding.md"])


def summary_findings(gpus: list[GpuInfo], matrix: list[list[str]], nics: list[NicInfo]) -> list[str]:
    kinds: dict[str, int] = {}
    for i, row in enumerate(matrix):
        for j, cell in enumerate(row):
            if j > i:
                kinds[cell] = kinds.get(cell, 0) + 1
    pairs = ", ".join(f"{n} pair(s) {k}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1]))
    out = [f"{len(gpus)} x {gpus[0].name}" + (f": GPU pairs {pairs}." if pairs else ".")]
    link = _link_for(gpus[0].name)
    if link and gpus[0].nvlinks_active:
        out.append(f"{gpus[0].nvlinks_active} active NVLinks per GPU ({link['name']}, up to "
                   f"{gpus[0].nvlinks_active * link['per_link_unidir_gbps']:.0f} GB/s per direction per GPU).")
    if not nics:
        out.append("No network devices with a PCI address were found in sysfs.")
    else:
        out.append("NICs: " + ", ".join(f"{n.name} ({n.kind}, {n.rate_gbits:g} Gb/s, NUMA {n.numa_node})"
                                        if n.rate_gbits else f"{n.name} ({n.kind}, NUMA {n.numa_node})" for n in nics) + ".")
    return out


def _link_for(gpu_name: str) -> dict | None:
    """interconnects.toml NVLink record for a GPU, from its architecture in accelerators.toml."""
    try:
        from tools.accelerator_specs import match_accelerator

        accel = match_accelerator(gpu_name)
    except Exception:
        return None
    link_id = ARCH_LINK.get((accel or {}).get("arch", ""))
    return next((r for r in load_data("interconnects")["link"] if r["id"] == link_id), None)


SPEC = ToolSpec(
    name="gpu_topology",
    summary="GPU<->GPU links (NVLink/PCIe/NUMA), GPU<->NIC<->CPU affinity, and rank binding advice.",
    description=(
        "Use when inter-GPU or inter-node bandwidth is lower than expected, when setting up CPU/NIC binding for "
        "a launcher, or to compare nodes: maps NVLink counts and PCIe paths between GPUs, each GPU's NUMA node "
        "and CPUs, NICs (InfiniBand/RoCE/EFA/Ethernet) and their distance to each GPU, then says which CPUs and "
        "NIC each local rank should use and what a mismatch costs. Reads NVML and sysfs only (seconds, no GPU "
        "work, no torch). Does not measure bandwidth: follow with p2p_bandwidth or collective_bench."),
    Params=GpuTopologyParams, Result=GpuTopologyResult, run=run, runs="subprocess",
    read_only=True, destructive=False, idempotent=True, open_world=False, timeout_s=60,
)

if __name__ == "__main__":
    from tools.harness import main

    main(SPEC)
