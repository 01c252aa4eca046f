"""gpu_topology — how GPUs, CPUs and NICs are wired inside this node, and how to bind ranks to them.

GPU<->GPU links (NVLink count, or the PCIe path: PIX one switch, PXB several switches, PHB through a
host bridge, NODE across host bridges of one NUMA node, SYS across sockets), each GPU's NUMA node and
CPU list, NICs (InfiniBand/RoCE and Ethernet) with their NUMA node and PCIe path to each GPU. From NVML
and sysfs, plus `nvidia-smi topo -m` when present. Advice: CPUs to bind each local rank to, the NIC
each GPU should use, and what a mismatch costs. Reads only; needs no torch.

By hand:
    mleng run gpu_topology
    srun --ntasks-per-node=1 mleng run gpu_topology --json    # one per node, compare nodes
"""

import re
import shutil
import subprocess

from .engine.spec import Field, Params, Result, ToolFailure, ToolSpec
from .shared.topology import (PCIE_ORDER, GpuInfo, NicInfo, chain_of, nvlink_record, nvml_gpus, pcie_relation,
                              read_nics)

class GpuTopologyParams(Params):
    include_nvidia_smi: bool = Field(True, description="Also `nvidia-smi topo -m` as text.")
    text: str | None = Field(None, max_length=200_000, description=(
        "Pasted `nvidia-smi topo -m` to read instead."))


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
    rdma = [n for n in nics if n.kind in ("infiniband", "roce", "efa", "rdma")]
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

def _nvidia_smi_topo() -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout[:8000] if out.returncode == 0 else None


TOPO_EXPECTED = ("`nvidia-smi topo -m` output: a header line 'GPU0 GPU1 ... CPU Affinity' and one row per GPU "
                 "('GPU0  X  NV18 ... PIX ... 0-23,96-119  0')")
_CELL = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)$")


def read_topo_text(text: str) -> GpuTopologyResult:
    """Pasted `nvidia-smi topo -m`: GPU rows, NIC columns (named by the NIC legend where present)."""
    lines = text.splitlines()
    head = next((i for i, line in enumerate(lines) if re.match(r"\s*GPU0\s", line)), None)
    if head is None:
        raise ToolFailure(f"text: expected {TOPO_EXPECTED}; it starts with {(text.strip()[:60] or '(empty)')!r}")
    columns = lines[head].split()
    devices = columns[:next((i for i, c in enumerate(columns) if c == "CPU"), len(columns))]
    legend = dict(re.findall(r"^\s*(NIC\d+):\s*(\S+)\s*$", text, re.M))
    gpus, cells = [], []
    for line in lines[head + 1:]:
        parts = line.split()
        if not parts or not re.fullmatch(r"GPU\d+", parts[0]) or len(parts) < 1 + len(devices):
            continue
        row = parts[1:1 + len(devices)]
        if not all(_CELL.match(c) for c in row):
            continue
        rest = parts[1 + len(devices):]
        numa = int(rest[1]) if len(rest) > 1 and rest[1].isdigit() else None
        gpus.append(GpuInfo(index=int(parts[0][3:]), name="(pasted)", pci="", numa_node=numa,
                            cpus=rest[0] if rest else ""))
        cells.append(dict(zip(devices, row)))
    if not gpus:
        raise ToolFailure(f"text: expected {TOPO_EXPECTED}; found a header but no GPU rows under it")
    gpu_columns = [d for d in devices if d.startswith("GPU")]
    matrix = [[c.get(f"GPU{g.index}", "?") for g in gpus] for c in cells]
    nic_columns = [d for d in devices if not d.startswith("GPU")]
    nics = [NicInfo(name=legend.get(d, d), kind="rdma", pci="") for d in nic_columns]
    nic_paths = {legend.get(d, d): [c[d] for c in cells] for d in nic_columns}
    for k, g in enumerate(gpus):
        ranked = sorted((PCIE_ORDER.index(nic_paths[n.name][k]), n.name) for n in nics
                        if nic_paths[n.name][k] in PCIE_ORDER)
        if ranked:
            g.best_nic, g.best_nic_path = ranked[0][1], PCIE_ORDER[ranked[0][0]]
    binding, warns = binding_advice(gpus, nics)
    findings = [f"Read pasted `nvidia-smi topo -m`: {len(gpus)} GPU row(s), {len(nic_columns)} NIC column(s)."]
    if len(gpus) < len(gpu_columns):
        findings.append(f"The text has rows for {len(gpus)} of its {len(gpu_columns)} GPU columns (cut?): the missing "
                        "GPUs are left out.")
    if nic_columns and not legend:
        findings.append("No NIC legend (NIC0: mlx5_0 ...) in the text: NICs are named by their column.")
    return GpuTopologyResult(verdict="warn" if warns else "ok", gpu_count=len(gpus), gpus=gpus, links=matrix,
                             nics=nics, nic_paths=nic_paths, binding=binding, findings=findings + warns,
                             next=["p2p_bandwidth", "collective_bench", "knowledge://network/intra-node.md"])


def run(params: GpuTopologyParams, progress) -> GpuTopologyResult:
    if params.text is not None:
        return read_topo_text(params.text)
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
        gpus, matrix = nvml_gpus(pynvml)
    finally:
        pynvml.nvmlShutdown()
    if not gpus:
        raise ToolFailure("NVML started but reports 0 GPUs: check CUDA_VISIBLE_DEVICES is not hiding them and "
                          "that `nvidia-smi` lists them")
    nic_paths = {}
    for nic in nics:
        nic_paths[nic.name] = [pcie_relation(chain_of(g.pci), chain_of(nic.pci), g.numa_node, nic.numa_node) for g in gpus]
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
    link = nvlink_record(gpus[0].name)
    if link and gpus[0].nvlinks_active:
        out.append(f"{gpus[0].nvlinks_active} active NVLinks per GPU ({link['name']}, up to "
                   f"{gpus[0].nvlinks_active * link['per_link_unidir_gbps']:.0f} GB/s per direction per GPU).")
    if not nics:
        out.append("No network devices with a PCI address were found in sysfs.")
    else:
        out.append("NICs: " + ", ".join(f"{n.name} ({n.kind}, {n.rate_gbits:g} Gb/s, NUMA {n.numa_node})"
                                        if n.rate_gbits else f"{n.name} ({n.kind}, NUMA {n.numa_node})" for n in nics) + ".")
    return out


SPEC = ToolSpec(
    name="gpu_topology",
    summary="GPU<->GPU links (NVLink/PCIe/NUMA), GPU<->NIC<->CPU affinity, and rank binding advice.",
    description=(
        "GPU-GPU links (NVLink count or PCIe path), each GPU's NUMA node and CPUs, NICs (InfiniBand, RoCE, "
        "EFA) and their distance to each GPU, and which CPUs and NIC each local rank should use; or pasted "
        "`nvidia-smi topo -m` output (text=). Use when inter-GPU or inter-node bandwidth is low, to set CPU/NIC "
        "binding, or to compare nodes. Seconds, NVML and sysfs only. Measures nothing: p2p_bandwidth or "
        "collective_bench next."),
    Params=GpuTopologyParams, Result=GpuTopologyResult, run=run, runs="subprocess",
    read_only=True, destructive=False, idempotent=True, open_world=False, timeout_s=60,
)

if __name__ == "__main__":
    from .engine.cli import tool_main

    tool_main(SPEC)
