"""Measurements behind memory_bandwidth_bench (imports torch: call from run(), in the child process).

How bytes are counted (decimal units: GB = 1e9 bytes, TB = 1e12):
- copy:  dst.copy_(src) of S bytes moves 2*S bytes (S read + S written);
- read:  a sum over S bytes reads S bytes (the one-element result is negligible);
- write: a fill of S bytes writes S bytes;
- h2d / d2h: one copy of S bytes across the host link moves S bytes in one direction.
Each iteration is timed alone with CUDA events around the operation only; the figure is the total
bytes over the mean time, and the best iteration is reported beside it.
"""

import os
import statistics
from pathlib import Path

from ..shared.gpu_sampler import NvmlPoller, quietly
from ..shared.timing import iteration_times


def time_op(op, iterations: int, warmup: int, device) -> list[float]:
    """Seconds per iteration of op() after `warmup` untimed runs."""
    for _ in range(warmup):
        op()
    if str(device) != "cpu":
        import torch

        torch.cuda.synchronize(device)
    return iteration_times(op, iterations, device)


def figure(test: str, bytes_per_iter: int, times_s: list[float], size_bytes: int) -> dict:
    mean = statistics.fmean(times_s)
    return {"test": test, "size_mib": round(size_bytes / 2**20, 1), "bytes_per_iteration": bytes_per_iter,
            "iterations": len(times_s), "mean_gbps": round(bytes_per_iter / mean / 1e9, 1),
            "max_gbps": round(bytes_per_iter / min(times_s) / 1e9, 1)}


def device_tests(device, size_bytes: int, iterations: int, warmup: int, tests: set[str]) -> list[dict]:
    """copy / read / write on device memory, buffers of size_bytes each."""
    import torch

    n = size_bytes // 4
    src = torch.rand(n, device=device, dtype=torch.float32)  # random: no compressible patterns
    dst = torch.empty_like(src)
    out = torch.empty(1, device=device, dtype=torch.float32)
    kernels = {
        "copy": (lambda: dst.copy_(src), 2 * n * 4),
        "read": (lambda: torch.sum(src, dim=(0,), keepdim=True, out=out), n * 4),
        "write": (lambda: dst.fill_(1.5), n * 4),
    }
    return [figure(test, nbytes, time_op(op, iterations, warmup, device), n * 4)
            for test, (op, nbytes) in kernels.items() if test in tests]


def _host_copies(device, dev, host, pinned: bool, iterations: int, warmup: int, tests: set[str]) -> list[dict]:
    kind, nbytes = ("pinned" if pinned else "pageable"), host.numel() * host.element_size()
    ops = {f"h2d_{kind}": ("h2d", lambda: dev.copy_(host, non_blocking=pinned)),
           f"d2h_{kind}": ("d2h", lambda: host.copy_(dev, non_blocking=pinned))}
    return [figure(name, nbytes, time_op(op, iterations, warmup, device), nbytes)
            for name, (test, op) in ops.items() if test in tests]


def host_link_tests(device, size_bytes: int, iterations: int, warmup: int, tests: set[str]) -> list[dict]:
    """h2d / d2h with pinned and pageable host memory."""
    import torch

    n = size_bytes // 4
    dev = torch.rand(n, device=device, dtype=torch.float32)
    rows = []
    for pinned in (True, False):
        host = torch.rand(n, dtype=torch.float32)
        rows += _host_copies(device, dev, host.pin_memory() if pinned else host, pinned, iterations, warmup, tests)
    return rows


class PcieWatcher(NvmlPoller):
    """Highest PCIe generation/width NVML reports while the link is busy (idle links drop to Gen1)."""

    def __init__(self, torch_index: int):
        super().__init__(torch_index, interval_s=0.05)
        self.gen = self.width = self.max_gen = self.max_width = self.bus_id = None
        if self._nvml:
            nv, h = self._nvml
            # The most this GPU *in this slot* can do (not the GPU alone): a Gen5 card in a Gen4 slot is not downtrained.
            self.max_gen = quietly(lambda: nv.nvmlDeviceGetMaxPcieLinkGeneration(h))
            self.max_width = quietly(lambda: nv.nvmlDeviceGetMaxPcieLinkWidth(h))
            bus = quietly(lambda: nv.nvmlDeviceGetPciInfo(h).busId)
            self.bus_id = bus.decode() if isinstance(bus, bytes) else bus

    def poll(self) -> None:
        nv, h = self._nvml
        gen = quietly(lambda: nv.nvmlDeviceGetCurrPcieLinkGeneration(h))
        width = quietly(lambda: nv.nvmlDeviceGetCurrPcieLinkWidth(h))
        self.gen = max(filter(None, (self.gen, gen)), default=None)
        self.width = max(filter(None, (self.width, width)), default=None)


def torch_bus_id(index: int) -> str | None:
    """PCI address of torch's cuda:index as sysfs writes it ('0000:18:00.0'), when NVML cannot say."""
    import torch

    props = torch.cuda.get_device_properties(index)
    if getattr(props, "pci_bus_id", None) is None:
        return None
    return f"{getattr(props, 'pci_domain_id', 0):04x}:{props.pci_bus_id:02x}:{getattr(props, 'pci_device_id', 0):02x}.0"


def parse_cpulist(text: str) -> set[int]:
    """'0-3,8,10-11' -> {0, 1, 2, 3, 8, 10, 11} (the kernel's cpulist format)."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if "-" in part:
            lo, hi = part.split("-")
            cpus.update(range(int(lo), int(hi) + 1))
        elif part:
            cpus.add(int(part))
    return cpus


def numa_placement(bus_id: str | None, sys_root: Path = Path("/sys")) -> dict:
    """The GPU's NUMA node and whether this process may only run on that node's CPUs (None: unknown)."""
    out = {"gpu_numa_node": None, "cpus_on_gpu_node": None}
    if not bus_id:
        return out
    bus = bus_id.lower()
    if len(bus.split(":")[0]) == 8:  # NVML pads the domain to 8 digits, sysfs to 4
        bus = bus[4:]
    try:
        node = int((sys_root / "bus/pci/devices" / bus / "numa_node").read_text())
    except (OSError, ValueError):
        return out
    if node < 0:  # single-node machine or firmware that does not say
        return out
    out["gpu_numa_node"] = node
    try:
        node_cpus = parse_cpulist((sys_root / f"devices/system/node/node{node}/cpulist").read_text())
        out["cpus_on_gpu_node"] = set(os.sched_getaffinity(0)) <= node_cpus
    except (OSError, ValueError, AttributeError):
        pass
    return out
