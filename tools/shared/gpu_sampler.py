"""Sample a GPU's clocks, power, temperature and clock-event (throttle) reasons during a benchmark.

A background thread reads NVML every `interval_s`; summary() condenses the samples into figures a
result can carry. Without NVML (no driver, an AMD GPU, a CPU run) the sampler records nothing and
summary() says so: telemetry is a bonus, never a reason to fail a benchmark.
"""

import statistics
import threading

# NVML clock-event reason bits (nvmlClocksEventReason*, formerly nvmlClocksThrottleReason*).
REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting",
}
# Reasons that mean the card is being slowed by something wrong (heat, power delivery), as opposed to
# sw_power_cap, which is a card running at its power limit: normal under a long matmul.
BAD_REASONS = {"hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}


def decode_reasons(mask: int) -> list[str]:
    return [name for bit, name in REASONS.items() if mask & bit]


def nvml_handle_for_torch_device(index: int):
    """(pynvml module, handle) for torch's cuda:index, matched by UUID then PCI bus id; None if unavailable.

    torch's numbering follows CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER, NVML's does not, so the
    index alone would sample the wrong GPU on a shared node.
    """
    try:
        import pynvml
        import torch

        pynvml.nvmlInit()
    except Exception:
        return None
    props = torch.cuda.get_device_properties(index)
    uuid = str(getattr(props, "uuid", "") or "")
    candidates = []
    if uuid:
        candidates += [lambda: pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}"),
                       lambda: pynvml.nvmlDeviceGetHandleByUUID(uuid)]
    bus = getattr(props, "pci_bus_id", None)
    if bus is not None:
        domain, device = getattr(props, "pci_domain_id", 0), getattr(props, "pci_device_id", 0)
        candidates.append(lambda: pynvml.nvmlDeviceGetHandleByPciBusId(f"{domain:08x}:{bus:02x}:{device:02x}.0"))
    candidates.append(lambda: pynvml.nvmlDeviceGetHandleByIndex(index))
    for get in candidates:
        try:
            return pynvml, get()
        except Exception:
            continue
    return None


def quietly(fn):
    """fn() or None: a reading NVML cannot give (unsupported field, lost GPU) must not stop a benchmark."""
    try:
        return fn()
    except Exception:
        return None


class NvmlPoller:
    """A daemon thread calling self.poll() every interval_s while the `with` block runs (no NVML: no thread)."""

    def __init__(self, torch_index: int | None, interval_s: float):
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = None
        self._nvml = nvml_handle_for_torch_device(torch_index) if torch_index is not None else None

    def poll(self) -> None:
        raise NotImplementedError

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()

    def __enter__(self):
        if self._nvml:
            self._thread = threading.Thread(target=self._loop, name=type(self).__name__, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=2)
        return False


class GpuSampler(NvmlPoller):
    """with GpuSampler(torch_index) as s: ...   then s.summary()."""

    def __init__(self, torch_index: int | None, interval_s: float = 0.2):
        super().__init__(torch_index, interval_s)
        self.samples: list[dict] = []
        self.max_sm_clock_mhz = self.power_limit_w = None
        if self._nvml:
            nv, h = self._nvml
            self.max_sm_clock_mhz = quietly(lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM))
            limit = quietly(lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h))
            self.power_limit_w = limit / 1000 if limit else None
            getter = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
                nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
            self._reasons = (lambda: getter(h)) if getter else (lambda: None)

    def poll(self) -> None:
        nv, h = self._nvml
        power = quietly(lambda: nv.nvmlDeviceGetPowerUsage(h))
        self.samples.append({
            "sm_clock_mhz": quietly(lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
            "power_w": power / 1000 if power is not None else None,
            "temperature_c": quietly(lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
            "reasons": quietly(self._reasons),
        })

    def summary(self) -> dict:
        """Figures over the samples; {'available': False} without NVML."""
        return summarize(self.samples, self.max_sm_clock_mhz, self.power_limit_w, available=bool(self._nvml))


def summarize(samples: list[dict], max_sm_clock_mhz=None, power_limit_w=None, available=True) -> dict:
    out: dict = {"available": available and bool(samples), "samples": len(samples),
                 "max_sm_clock_mhz": max_sm_clock_mhz, "power_limit_w": power_limit_w}

    def values(key):
        return [s[key] for s in samples if s.get(key) is not None]

    clocks, power, temps = values("sm_clock_mhz"), values("power_w"), values("temperature_c")
    if clocks:
        out.update(sm_clock_min_mhz=min(clocks), sm_clock_median_mhz=statistics.median(clocks),
                   sm_clock_max_mhz=max(clocks))
    if power:
        out.update(power_mean_w=round(statistics.fmean(power), 1), power_max_w=round(max(power), 1))
    if temps:
        out.update(temperature_max_c=max(temps))
    masks = values("reasons")
    fractions: dict[str, float] = {}
    for mask in masks:
        for name in decode_reasons(int(mask)):
            fractions[name] = fractions.get(name, 0) + 1 / len(masks)
    out["reasons_fraction"] = {k: round(v, 3) for k, v in sorted(fractions.items())}
    out["throttled"] = any(fractions.get(r, 0) > 0.05 for r in BAD_REASONS)
    return out
