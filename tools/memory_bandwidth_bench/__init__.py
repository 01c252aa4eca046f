"""memory_bandwidth_bench — device memory (HBM/GDDR) bandwidth and host<->device copy bandwidth vs spec.

Device: copy (counted as bytes read + bytes written), read-only (a sum) and write-only (a fill) over
buffers far larger than L2 (1 GiB by default). Host link: host->device and device->host copies from
pinned and from pageable memory, judged against the PCIe link NVML reports (generation x width),
with the likely causes when they fall short (downtrained link, wrong NUMA node, pageable memory).
See tools/memory_bandwidth_bench/measure.py for how each figure is timed and how its bytes are counted.

By hand:
    mleng run memory_bandwidth_bench                      # GPU 0
    mleng run memory_bandwidth_bench --device 3 --size-mib 4096
    srun --ntasks-per-node=1 --gpus-per-node=1 mleng run memory_bandwidth_bench --json   # one per node
    mleng run memory_bandwidth_bench --device cpu --size-mib 64 --tests copy    # host memory, for tests
"""

import re
from typing import Annotated, Literal

from pydantic import ConfigDict, model_validator

from ..engine.figures import Figure, Measured, SweepContract
from ..engine.spec import SELF_EVIDENT, Field, Params, Record, Result, ToolFailure, ToolSpec, present

# PCIe payload rate per lane, per direction, GB/s (after line encoding): Gen1-2 8b/10b, Gen3-5
# 128b/130b, Gen6 PAM4 with FLIT framing. x16 Gen4 = 31.5 GB/s, x16 Gen5 = 63.0 GB/s.
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
HBM_OK, HBM_FAIL = 0.75, 0.55     # copy bandwidth / datasheet: ok above, fail below, warn between
LINK_OK = 0.5                     # pinned host<->device / link rate: warn below
TESTS = ("copy", "read", "write", "h2d", "d2h")


def pcie_link_gbps(gen: int | None, width: int | None) -> float | None:
    if not gen or not width or gen not in PCIE_LANE_GBPS:
        return None
    return round(PCIE_LANE_GBPS[gen] * width, 1)


def parse_pcie(text: str | None) -> tuple[int | None, int | None]:
    """'Gen5 x16' (accelerators.toml) -> (5, 16)."""
    m = re.search(r"gen\s*(\d)\D+x\s*(\d+)", (text or "").lower())
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


class MemoryBandwidthParams(Params):
    # device='cpu' (a test mode): host-memory tests only, at most 1024 MiB.
    model_config = ConfigDict(json_schema_extra={"anyOf": [
        {"not": present("device", const="cpu")},
        {"required": ["tests"],
         "properties": {"tests": {"items": {"enum": ["copy", "read", "write"]}}, "size_mib": {"maximum": 1024}}}]})

    device: Annotated[int, Field(ge=0)] | Literal["cpu"] = Field(0, description="GPU index, or 'cpu' (host copies, for tests).")
    size_mib: int = Field(1024, ge=1, le=65536, description="Device buffer, far above L2.")
    host_size_mib: int = Field(256, ge=1, le=16384, description="Host<->device transfer size.")
    tests: list[Literal["copy", "read", "write", "h2d", "d2h"]] = Field(
        default_factory=lambda: list(TESTS), min_length=1,
                json_schema_extra=SELF_EVIDENT, description="Measurements to run.")
    iterations: int = Field(20, ge=1, le=1000, json_schema_extra=SELF_EVIDENT, description="Timed per test.")
    warmup: int = Field(3, ge=0, le=100, json_schema_extra=SELF_EVIDENT, description="Untimed per test.")

    @model_validator(mode="after")
    def _cpu_limits(self):
        if self.device == "cpu" and ({"h2d", "d2h"} & set(self.tests)):
            raise ValueError("tests: h2d/d2h need a GPU; with device='cpu' use tests=['copy', 'read', 'write']")
        if self.device == "cpu" and self.size_mib > 1024:
            raise ValueError(f"size_mib: device='cpu' is for tests, at most 1024 MiB (got {self.size_mib})")
        return self


class BandwidthRow(Record):
    test: str = Field(description="copy | read | write | h2d_pinned | h2d_pageable | d2h_pinned | d2h_pageable")
    size_mib: float = Field(description="Buffer size, MiB.")
    bytes_per_iteration: int = Field(description="Bytes counted per iteration (copy counts read + write).")
    iterations: int = Field(description="Timed iterations.")
    mean_gbps: float = Field(description="Counted bytes / mean time, GB/s (1e9 bytes/s).")
    max_gbps: float = Field(description="Counted bytes / fastest iteration, GB/s.")


class MemoryBandwidthResult(Result):
    device: str | None = Field(None, description="'cuda:N' or 'cpu'.")
    device_name: str | None = Field(None, description="Device name as torch reports it.")
    accelerator_id: str | None = Field(None, description="Matching record in knowledge/data/accelerators.toml.")
    copy_tbps: float | None = Field(None, description="Device copy bandwidth, TB/s (1e12 bytes/s), counting bytes read + written.")
    read_tbps: float | None = Field(None, description="Read-only bandwidth, TB/s.")
    write_tbps: float | None = Field(None, description="Write-only bandwidth, TB/s.")
    spec_tbps: float | None = Field(None, description="Datasheet memory bandwidth, TB/s.")
    copy_efficiency_pct: float | None = Field(None, description="copy_tbps / spec_tbps, percent.")
    h2d_pinned_gbps: float | None = Field(None, description="Host->device from pinned memory, GB/s.")
    h2d_pageable_gbps: float | None = Field(None, description="Host->device from pageable memory, GB/s.")
    d2h_pinned_gbps: float | None = Field(None, description="Device->host into pinned memory, GB/s.")
    d2h_pageable_gbps: float | None = Field(None, description="Device->host into pageable memory, GB/s.")
    pcie_gen: int | None = Field(None, description="PCIe generation seen while the link was busy (NVML).")
    pcie_width: int | None = Field(None, description="PCIe lanes seen while the link was busy (NVML).")
    pcie_max_gen: int | None = Field(None, description="Highest generation the GPU and slot support (NVML).")
    pcie_max_width: int | None = Field(None, description="Widest link the GPU and slot support (NVML).")
    link_expected_gbps: float | None = Field(None, description="Payload rate of the full link, one direction, GB/s.")
    gpu_numa_node: int | None = Field(None, description="NUMA node of the GPU's PCIe slot.")
    cpus_on_gpu_node: bool | None = Field(None, description="Whether this process may only run on CPUs of the GPU's NUMA node.")
    measurements: list[BandwidthRow] = Field(default_factory=list, description="Every measurement.")


def judge(res: MemoryBandwidthResult) -> None:
    """Fill verdict, findings and next from the measured figures (pure: tested with made-up numbers)."""
    findings, verdict, nxt = [], "info", []
    if res.copy_tbps is not None:
        line = (f"Device copy {res.copy_tbps:.3g} TB/s (bytes read + written), read {res.read_tbps or '-'} TB/s, "
                f"write {res.write_tbps or '-'} TB/s")
        if res.copy_efficiency_pct is not None:
            eff = res.copy_efficiency_pct / 100
            verdict = "ok" if eff >= HBM_OK else ("warn" if eff >= HBM_FAIL else "fail")
            line += f": {eff:.0%} of the {res.spec_tbps:g} TB/s datasheet figure"
            line += " (copies usually reach 80-92%)." if verdict == "ok" else (
                f", below the {HBM_OK:.0%} expected. Check clocks and memory errors with gpu_health "
                "(ECC, row remapping, a lowered memory clock).")
            if verdict != "ok":
                nxt.append("gpu_health")
        findings.append(line if line.endswith(".") else line + ".")
    pinned = [v for v in (res.h2d_pinned_gbps, res.d2h_pinned_gbps) if v is not None]
    if pinned:
        link = res.link_expected_gbps
        text = (f"Host->device {res.h2d_pinned_gbps} GB/s pinned / {res.h2d_pageable_gbps} GB/s pageable; device->host "
                f"{res.d2h_pinned_gbps} pinned / {res.d2h_pageable_gbps} pageable")
        if link:
            seen = f"Gen{res.pcie_gen} x{res.pcie_width}" if res.pcie_gen else "link state unknown"
            text += f"; the link runs {seen}, the full link (Gen{res.pcie_max_gen} x{res.pcie_max_width}) carries {link:g} GB/s per direction."
        findings.append(text if text.endswith(".") else text + ".")
        if link and max(pinned) < LINK_OK * link:
            verdict = "warn" if verdict in ("ok", "info") else verdict
            causes = []
            if res.pcie_gen and res.pcie_max_gen and res.pcie_gen < res.pcie_max_gen or (
                    res.pcie_width and res.pcie_max_width and res.pcie_width < res.pcie_max_width):
                causes.append(f"the link is downtrained (Gen{res.pcie_gen} x{res.pcie_width} instead of "
                              f"Gen{res.pcie_max_gen} x{res.pcie_max_width}: reseat the card or riser, check BIOS "
                              "PCIe settings; gpu_health shows it per GPU)")
            if res.cpus_on_gpu_node is False:
                causes.append(f"this process runs on CPUs outside the GPU's NUMA node {res.gpu_numa_node}, so "
                              "copies cross the socket interconnect (bind with numactl --cpunodebind)")
            causes.append("other traffic on the same PCIe switch (a NIC or another GPU busy at the same time)")
            findings.append(f"Pinned host<->device bandwidth {max(pinned):g} GB/s is below {LINK_OK:.0%} of the link's "
                            f"{link:g} GB/s. Likely: " + "; ".join(causes) + ".")
            nxt += ["gpu_topology", "gpu_health", "knowledge://cpu-memory/numa-binding.md"]
        pageable = [v for v in (res.h2d_pageable_gbps, res.d2h_pageable_gbps) if v is not None]
        if pageable and min(pageable) < 0.6 * max(pinned):
            findings.append(f"Pageable copies reach {min(pageable):g} GB/s against {max(pinned):g} pinned: the driver "
                            "stages them through a pinned buffer. Pin host buffers that feed the GPU "
                            "(DataLoader(pin_memory=True), tensor.pin_memory()).")
            nxt.append("knowledge://cpu-memory/pinned-memory.md")
    if res.device == "cpu":
        findings.append("device='cpu': host memory copy only, a check of the tool itself; no spec comparison.")
    elif res.accelerator_id is None:
        findings.append(f"No record in the accelerator table matches {res.device_name!r}: no datasheet figure to compare with.")
    res.verdict, res.findings = verdict, findings
    res.next = list(dict.fromkeys(nxt + ["knowledge://compute/accelerators.md", "matmul_bench"]))


def _torch_device(params: MemoryBandwidthParams):
    if params.device == "cpu":
        return "cpu", "cpu"
    try:
        import torch
    except ImportError:
        raise ToolFailure("memory_bandwidth_bench needs torch in this Python environment.") from None
    if not torch.cuda.is_available():
        raise ToolFailure(f"No GPU visible to torch {torch.__version__} (torch.cuda.is_available() is False). "
                          "memory_bandwidth_bench needs an NVIDIA or AMD GPU; check nvidia-smi and "
                          "CUDA_VISIBLE_DEVICES, or run env_report.")
    if params.device >= torch.cuda.device_count():
        raise ToolFailure(f"device={params.device} does not exist: torch sees {torch.cuda.device_count()} GPU(s).")
    torch.cuda.set_device(params.device)
    return torch.device("cuda", params.device), torch.cuda.get_device_name(params.device)


def run(params: MemoryBandwidthParams, progress) -> MemoryBandwidthResult:
    from . import measure as mm
    from ..shared.accelerators import match_accelerator

    device, name = _torch_device(params)
    tests = set(params.tests)
    res = MemoryBandwidthResult(device=str(device), device_name=name)
    progress(0.05, f"device copy/read/write, {params.size_mib} MiB buffers")
    rows = mm.device_tests(device, params.size_mib << 20, params.iterations, params.warmup, tests)
    if device != "cpu" and tests & {"h2d", "d2h"}:
        progress(0.5, f"host<->device copies, {params.host_size_mib} MiB, pinned and pageable")
        with mm.PcieWatcher(params.device) as link:
            rows += mm.host_link_tests(device, params.host_size_mib << 20, params.iterations, params.warmup, tests)
        res.pcie_gen, res.pcie_width, res.pcie_max_gen, res.pcie_max_width = link.gen, link.width, link.max_gen, link.max_width
        placement = mm.numa_placement(link.bus_id or mm.torch_bus_id(params.device))
        res.gpu_numa_node, res.cpus_on_gpu_node = placement["gpu_numa_node"], placement["cpus_on_gpu_node"]
    by_test = {r["test"]: r["mean_gbps"] for r in rows}
    for t in ("copy", "read", "write"):
        if t in by_test:
            setattr(res, f"{t}_tbps", round(by_test[t] / 1000, 3))
    for t in ("h2d_pinned", "h2d_pageable", "d2h_pinned", "d2h_pageable"):
        setattr(res, f"{t}_gbps", by_test.get(t))
    rec = match_accelerator(name) if device != "cpu" else None
    if rec:
        res.accelerator_id, res.spec_tbps = rec["id"], rec.get("memory_bandwidth_tbps")
        if res.copy_tbps and res.spec_tbps:
            res.copy_efficiency_pct = round(100 * res.copy_tbps / res.spec_tbps, 1)
        if not res.pcie_max_gen:
            res.pcie_max_gen, res.pcie_max_width = parse_pcie(rec.get("pcie"))
    res.link_expected_gbps = pcie_link_gbps(res.pcie_max_gen, res.pcie_max_width)
    res.measurements = [BandwidthRow(**r) for r in rows]
    judge(res)
    if device != "cpu":
        import torch

        l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0)
        if l2 and (params.size_mib << 20) < 8 * l2:
            res.findings.append(f"size_mib={params.size_mib} is under 8x this GPU's {l2 / 2**20:.0f} MiB L2 cache: part "
                                "of each pass hits the cache and the figures overstate memory bandwidth.")
    progress(1.0, "done")
    return res


COPY = Figure("copy_tbps", "TB/s", "higher", per_gpu=True)
SWEEP = SweepContract(figures=(COPY,), read=lambda res: [Measured(
    COPY, res.copy_tbps, gpu=int(res.device.rpartition(":")[2]) if res.device and res.device != "cpu" else None,
    group=res.device_name)])

SPEC = ToolSpec(
    name="memory_bandwidth_bench",
    summary="Device memory bandwidth (copy/read/write) and host<->device copy bandwidth, pinned and pageable, vs spec.",
    description=(
        "Measures a GPU's memory bandwidth and speed (HBM/GDDR copy, read, write over 1 GiB buffers, TB/s, "
        "like STREAM) against its datasheet, and host<->device copies from pinned and pageable memory against "
        "the PCIe link. Use for 'is HBM as fast as it should be', slow data loading or CPU offload, a "
        "downtrained PCIe link, wrong NUMA binding. One GPU, ~10 s. Not for GPU-to-GPU links (p2p_bandwidth) "
        "or matmul speed (matmul_bench)."),
    Params=MemoryBandwidthParams, Result=MemoryBandwidthResult, run=run, runs="subprocess", needs_torch=True, timeout_s=300,
    gpu_devices=lambda p: [] if p.device == "cpu" else [p.device], metric="copy_tbps", higher_is_better=True, sweep=SWEEP,
    doctor=lambda ctx: {} if ctx["gpu_count"] else None, doctor_order=65,
)
