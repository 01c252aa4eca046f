"""Every GPU of a node over the window, through NVML: clocks, power, heat, utilisation, who holds it.

A background thread reads each GPU every interval; at the end each GPU gets its serial and UUID,
its PCIe throughput, and the processes holding it, split into the job's ranks and everything else
(a co-tenant: the 'holder' of a shared GPU). No NVML (no driver, a CPU node): no rows, and the answer
says the GPU side was not seen.
"""

import statistics

from .models import GpuSample, RankSample
from ..shared.gpu_sampler import NvmlPoller, quietly, summarize


def _nvml():
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:
        return None


class GpuWatch(NvmlPoller):
    """Every GPU of the node (NvmlPoller's thread, which watches one torch device, is reused for all)."""

    def __init__(self, host: str, interval_s: float = 0.5):
        super().__init__(None, interval_s)
        self.host = host
        self.nv = _nvml()
        self.handles = []
        if self.nv:
            count = quietly(self.nv.nvmlDeviceGetCount) or 0
            self.handles = [h for h in (quietly(lambda i=i: self.nv.nvmlDeviceGetHandleByIndex(i)) for i in range(count)) if h]
        self.samples: list[list[dict]] = [[] for _ in self.handles]
        self._nvml = (self.nv, None) if self.handles else None      # what NvmlPoller starts its thread on

    def poll(self) -> None:
        nv = self.nv
        getter = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        for h, rows in zip(self.handles, self.samples):
            power = quietly(lambda: nv.nvmlDeviceGetPowerUsage(h))
            util = quietly(lambda: nv.nvmlDeviceGetUtilizationRates(h))
            rows.append({"sm_clock_mhz": quietly(lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
                         "power_w": power / 1000 if power is not None else None,
                         "temperature_c": quietly(lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
                         "reasons": quietly(lambda: getter(h)) if getter else None,
                         "util_pct": util.gpu if util is not None else None})

    def summary(self, ranks: dict[int, RankSample]) -> list[GpuSample]:
        """One row per GPU; marks each rank's GPU (index, serial) in `ranks` along the way."""
        out = []
        for index, (h, rows) in enumerate(zip(self.handles, self.samples)):
            out.append(self._one(index, h, rows, ranks))
        if self.nv:
            quietly(self.nv.nvmlShutdown)
        return out

    def _one(self, index: int, h, rows: list[dict], ranks: dict[int, RankSample]) -> GpuSample:
        nv = self.nv
        limit = quietly(lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h))
        s = summarize(rows, quietly(lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM)),
                      limit / 1000 if limit else None)
        util = [r["util_pct"] for r in rows if r.get("util_pct") is not None]
        row = GpuSample(host=self.host, index=index, serial=str(quietly(lambda: nv.nvmlDeviceGetSerial(h)) or ""),
                        uuid=str(quietly(lambda: nv.nvmlDeviceGetUUID(h)) or ""),
                        sm_clock_median_mhz=s.get("sm_clock_median_mhz"), sm_clock_max_mhz=s.get("max_sm_clock_mhz"),
                        power_mean_w=s.get("power_mean_w"), power_limit_w=s.get("power_limit_w"),
                        temperature_max_c=s.get("temperature_max_c"), reasons_fraction=s.get("reasons_fraction", {}),
                        utilization_median_pct=statistics.median(util) if util else None)
        for attr, counter in (("pcie_tx_mb_s", "NVML_PCIE_UTIL_TX_BYTES"), ("pcie_rx_mb_s", "NVML_PCIE_UTIL_RX_BYTES")):
            kb = quietly(lambda c=counter: nv.nvmlDeviceGetPcieThroughput(h, getattr(nv, c)))
            setattr(row, attr, round(kb / 1000, 1) if kb is not None else None)   # NVML gives KB/s
        self._holders(row, h, ranks)
        return row

    def _holders(self, row: GpuSample, h, ranks: dict[int, RankSample]) -> None:
        from ..shared.occupancy import GPU_UTIL_BUSY_PCT, others_sm_util
        from ..shared.process_targets import describe

        procs = []
        for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            procs += quietly(lambda f=fn: getattr(self.nv, f)(h)) or []
        procs = {p.pid: p for p in procs}
        # A process that only holds memory (a notebook, a finished job's cache) takes nothing from the rank.
        active = others_sm_util(self.nv, h, set(procs) - set(ranks))
        for p in procs.values():
            if p.pid in ranks:
                row.job_pids.append(p.pid)
                ranks[p.pid].gpu_index, ranks[p.pid].gpu_serial = row.index, row.serial
                continue
            command, parent, _, _ = describe(p.pid)
            if parent in ranks:
                continue                                    # a rank's own worker: still the job
            if active is not None and active.get(p.pid, 0) <= GPU_UTIL_BUSY_PCT:
                continue                                    # holds memory, computes nothing
            used = getattr(p, "usedGpuMemory", None)
            mem = f", {used / 2**30:.1f} GiB" if isinstance(used, int) and used > 0 else ""
            row.other_holders.append(f"pid {p.pid} ({command[:80] or 'not visible from here'}){mem}")
