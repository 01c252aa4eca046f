"""gpu_health — is each GPU of this node healthy? ECC, row remapping, XIDs, throttling, links, processes.

Read through NVML (nvidia-ml-py), not by parsing nvidia-smi text. XID events come from the kernel log
when it is readable. One verdict per GPU and one for the node. Runs in a child process: a wedged
driver can hang an NVML call, and the runner's timeout then kills it instead of the server.

By hand:
    python -m tools.gpu_health                     # this node
    srun --ntasks-per-node=1 python -m tools.gpu_health --json > health-$SLURM_JOB_ID.json   # every node
"""

import re
import shutil
import subprocess

from .engine.spec import Field, Params, Record, Result, ToolSpec

# XID codes and what they mean for the node (NVIDIA's XID catalog, docs.nvidia.com/deploy/xid-errors).
XID_MEANING = {
    13: ("warn", "graphics engine exception: usually an application bug (out-of-range access)"),
    31: ("warn", "GPU memory page fault: usually an application bug, sometimes a driver issue"),
    43: ("warn", "GPU stopped processing: a user application fault, the GPU recovers"),
    45: ("info", "preemptive cleanup after an application was killed"),
    48: ("fail", "double-bit (uncorrectable) ECC error: reset the GPU; drain the node if it repeats"),
    61: ("warn", "internal micro-controller breakpoint/warning"),
    62: ("fail", "internal micro-controller halt: reset the GPU"),
    63: ("warn", "ECC page retirement or row remapping recorded: reset the GPU to apply it"),
    64: ("fail", "ECC page retirement or row remap failure: drain the node and RMA the GPU"),
    74: ("fail", "NVLink error: check the link; drain if it repeats"),
    79: ("fail", "GPU has fallen off the bus: drain the node, check power, seating and PCIe"),
    92: ("warn", "high single-bit ECC error rate"),
    94: ("warn", "contained ECC error: the application was stopped, the GPU keeps working"),
    95: ("fail", "uncontained ECC error: reset the GPU, all applications on it are affected"),
    119: ("fail", "GSP RPC timeout: reset the GPU; update the driver if it repeats"),
    120: ("fail", "GSP error: reset the GPU"),
}

# Clock event ("throttle") reason bits as NVML defines them.
THROTTLE_BITS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting",
}
BAD_THROTTLE = {"hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown"}
XID_LINE = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+),(.*)")


class GpuHealthParams(Params):
    read_kernel_log: bool = Field(True, description="Look for NVIDIA XID events in the kernel log (dmesg / journal).")


class GpuReading(Record):
    index: int = Field(description="NVML index.")
    name: str = Field(description="GPU model as NVML reports it.")
    uuid: str = Field("", description="GPU UUID.")
    serial: str | None = Field(None, description="Board serial (None on consumer cards).")
    pci_bus_id: str = Field("", description="PCI bus id, e.g. 00000000:3B:00.0.")
    verdict: str = Field("ok", description="ok | warn | fail for this GPU.")
    problems: list[str] = Field(default_factory=list, description="What is wrong, one sentence each.")
    temperature_c: int | None = Field(None, description="GPU temperature, °C.")
    slowdown_temperature_c: int | None = Field(None, description="Temperature at which the GPU slows itself down, °C.")
    power_w: float | None = Field(None, description="Power draw, W.")
    power_limit_w: float | None = Field(None, description="Enforced power limit, W.")
    default_power_limit_w: float | None = Field(None, description="Default power limit, W.")
    sm_clock_mhz: int | None = Field(None, description="Current SM clock, MHz.")
    sm_clock_max_mhz: int | None = Field(None, description="Maximum SM clock, MHz.")
    utilization_pct: int | None = Field(None, description="GPU utilisation over the last sample period, %.")
    throttle_reasons: list[str] = Field(default_factory=list, description="Active clock-event (throttle) reasons.")
    memory_used_mib: float | None = Field(None, description="Device memory in use, MiB.")
    memory_total_mib: float | None = Field(None, description="Device memory, MiB.")
    ecc_enabled: bool | None = Field(None, description="ECC mode currently on.")
    ecc_uncorrected_volatile: int | None = Field(None, description="Uncorrectable ECC errors since the last reset.")
    ecc_uncorrected_aggregate: int | None = Field(None, description="Uncorrectable ECC errors over the GPU's life.")
    ecc_corrected_volatile: int | None = Field(None, description="Corrected ECC errors since the last reset.")
    remapped_rows_correctable: int | None = Field(None, description="Rows remapped for correctable errors (Ampere+).")
    remapped_rows_uncorrectable: int | None = Field(None, description="Rows remapped for uncorrectable errors (Ampere+).")
    remap_pending: bool | None = Field(None, description="A row remap waits for a GPU reset.")
    remap_failure: bool | None = Field(None, description="A row remap failed: the GPU needs replacing.")
    retired_pages: int | None = Field(None, description="Retired pages (pre-Ampere).")
    retired_pages_pending: bool | None = Field(None, description="Page retirement waits for a reset (pre-Ampere).")
    pcie_gen: int | None = Field(None, description="Current PCIe generation (drops at idle to save power).")
    pcie_gen_max: int | None = Field(None, description="Maximum PCIe generation of the GPU and slot.")
    pcie_width: int | None = Field(None, description="Current PCIe link width (lanes).")
    pcie_width_max: int | None = Field(None, description="Maximum PCIe link width (lanes).")
    nvlink_active: int | None = Field(None, description="NVLink links up.")
    nvlink_total: int | None = Field(None, description="NVLink links the GPU has.")
    nvlink_errors: dict[str, int] = Field(default_factory=dict, description="NVLink error counters summed over links (replay, recovery, crc).")
    processes: list[str] = Field(default_factory=list, description="Processes holding device memory: 'pid name MiB'.")
    xids: list[str] = Field(default_factory=list, description="XID events from the kernel log for this GPU.")


class GpuHealthResult(Result):
    gpus: list[GpuReading] = Field(default_factory=list, description="One reading per GPU.")
    gpu_count: int = Field(0, description="GPUs found.")
    driver: str | None = Field(None, description="Driver version.")
    kernel_log: str = Field("", description="Whether XID events could be read, and from where.")


# ---------------------------------------------------------------------------------------------------
# Judging a reading: pure, so it is tested with readings built by hand.

def assess(g: GpuReading) -> None:
    """Fill g.verdict and g.problems from its fields."""
    fail, warn = [], []
    if g.ecc_uncorrected_volatile:
        fail.append(f"{g.ecc_uncorrected_volatile} uncorrectable ECC error(s) since the last reset: results on this "
                    "GPU may be wrong; reset it, drain the node if they return")
    if g.remap_failure:
        fail.append("row remapping failed: the GPU has run out of spare rows; drain the node and replace the GPU")
    if g.remap_pending:
        warn.append("a row remap is pending: reset the GPU (or reboot) to apply it before running jobs")
    if g.retired_pages_pending:
        warn.append("page retirement is pending: reset the GPU to apply it")
    if g.ecc_uncorrected_aggregate and not g.ecc_uncorrected_volatile:
        warn.append(f"{g.ecc_uncorrected_aggregate} uncorrectable ECC error(s) in this GPU's history: watch it")
    if g.ecc_enabled is False:
        warn.append("ECC is off: memory errors go undetected (datacenter GPUs should run with ECC on)")
    bad = [r for r in g.throttle_reasons if r in BAD_THROTTLE]
    if bad:
        warn.append(f"clocks held down by {', '.join(bad)}: check cooling, power delivery and the power limit")
    if g.temperature_c is not None and g.slowdown_temperature_c and g.temperature_c >= g.slowdown_temperature_c - 5:
        warn.append(f"{g.temperature_c} °C, within 5 °C of its slowdown point ({g.slowdown_temperature_c} °C)")
    if g.power_limit_w and g.default_power_limit_w and g.power_limit_w < 0.9 * g.default_power_limit_w:
        warn.append(f"power limit set to {g.power_limit_w:.0f} W, below the default {g.default_power_limit_w:.0f} W:"
                    " expect lower clocks under load")
    if g.pcie_width and g.pcie_width_max and g.pcie_width < g.pcie_width_max:
        warn.append(f"PCIe link runs x{g.pcie_width} of x{g.pcie_width_max}: a downtrained link (reseat, check riser);"
                    " host-device copies will be slow")
    if g.nvlink_total and g.nvlink_active is not None and 0 < g.nvlink_active < g.nvlink_total:
        fail.append(f"only {g.nvlink_active} of {g.nvlink_total} NVLink links are up: GPU-GPU bandwidth is cut")
    if any(v > 0 for k, v in g.nvlink_errors.items() if k in ("recovery",)):
        warn.append(f"NVLink recovery errors {g.nvlink_errors}: a flaky link; run p2p_bandwidth")
    for x in g.xids:
        code = int(x.split()[1].rstrip(":")) if x.startswith("xid ") else None
        level, meaning = XID_MEANING.get(code, ("warn", "see NVIDIA's XID catalog"))
        (fail if level == "fail" else warn if level == "warn" else []).append(f"{x} — {meaning}")
    g.problems = fail + warn
    g.verdict = "fail" if fail else "warn" if warn else "ok"


def parse_xids(log_text: str) -> dict[str, list[str]]:
    """Kernel log -> {pci bus id (lowercase, short form 'bb:dd.f'): ['xid 79: <rest of line>', ...]}."""
    out: dict[str, list[str]] = {}
    for m in XID_LINE.finditer(log_text):
        bus = _short_bus(m.group(1))
        out.setdefault(bus, []).append(f"xid {m.group(2)}: {m.group(3).strip()[:160]}")
    return out


def _short_bus(bus_id: str) -> str:
    """'00000000:3B:00.0' and '0000:3b:00' -> '3b:00'."""
    parts = bus_id.lower().split(":")
    return ":".join(parts[-2:]).split(".")[0] if len(parts) >= 2 else bus_id.lower()


def read_kernel_log() -> tuple[str, str]:
    """(text, where it came from or why it could not be read)."""
    for cmd in (["dmesg", "--ctime"], ["journalctl", "-k", "--no-pager", "-n", "20000"]):
        if not shutil.which(cmd[0]):
            continue
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        except subprocess.TimeoutExpired:
            continue
        if out.returncode == 0 and out.stdout:
            return out.stdout, f"read with `{' '.join(cmd)}`"
    for path in ("/var/log/kern.log", "/var/log/messages"):
        try:
            with open(path, errors="replace") as f:
                return f.read()[-20_000_000:], f"read from {path}"
        except OSError:
            continue
    return "", ("kernel log not readable (dmesg needs root or kernel.dmesg_restrict=0): XID events not checked; "
                "run `sudo dmesg | grep -i xid` yourself")


# ---------------------------------------------------------------------------------------------------
# Reading NVML: every query may be unsupported on some GPU or driver, so each is guarded.

def _try(fn, *args, default=None):
    try:
        return fn(*args)
    except Exception:
        return default


def read_gpu(pynvml, index: int) -> GpuReading:
    h = pynvml.nvmlDeviceGetHandleByIndex(index)
    s = lambda v: v.decode() if isinstance(v, bytes) else v  # noqa: E731
    g = GpuReading(index=index, name=s(pynvml.nvmlDeviceGetName(h)), uuid=s(_try(pynvml.nvmlDeviceGetUUID, h, default="")),
                   serial=s(_try(pynvml.nvmlDeviceGetSerial, h)))
    pci = _try(pynvml.nvmlDeviceGetPciInfo, h)
    g.pci_bus_id = s(pci.busId) if pci is not None else ""
    g.temperature_c = _try(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU)
    g.slowdown_temperature_c = _try(pynvml.nvmlDeviceGetTemperatureThreshold, h, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
    mw = lambda v: None if v is None else round(v / 1000, 1)  # noqa: E731
    g.power_w = mw(_try(pynvml.nvmlDeviceGetPowerUsage, h))
    g.power_limit_w = mw(_try(pynvml.nvmlDeviceGetEnforcedPowerLimit, h))
    g.default_power_limit_w = mw(_try(pynvml.nvmlDeviceGetPowerManagementDefaultLimit, h))
    g.sm_clock_mhz = _try(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM)
    g.sm_clock_max_mhz = _try(pynvml.nvmlDeviceGetMaxClockInfo, h, pynvml.NVML_CLOCK_SM)
    util = _try(pynvml.nvmlDeviceGetUtilizationRates, h)
    g.utilization_pct = util.gpu if util is not None else None
    reasons = _try(getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", pynvml.nvmlDeviceGetCurrentClocksThrottleReasons), h)
    if reasons is not None:
        g.throttle_reasons = [name for bit, name in THROTTLE_BITS.items() if reasons & bit]
    mem = _try(pynvml.nvmlDeviceGetMemoryInfo, h)
    if mem is not None:
        g.memory_used_mib, g.memory_total_mib = round(mem.used / 2**20, 1), round(mem.total / 2**20, 1)
    mode = _try(pynvml.nvmlDeviceGetEccMode, h)
    if mode is not None:
        g.ecc_enabled = bool(mode[0])
        unc, cor = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
        g.ecc_uncorrected_volatile = _try(pynvml.nvmlDeviceGetTotalEccErrors, h, unc, pynvml.NVML_VOLATILE_ECC)
        g.ecc_uncorrected_aggregate = _try(pynvml.nvmlDeviceGetTotalEccErrors, h, unc, pynvml.NVML_AGGREGATE_ECC)
        g.ecc_corrected_volatile = _try(pynvml.nvmlDeviceGetTotalEccErrors, h, cor, pynvml.NVML_VOLATILE_ECC)
    rows = _try(pynvml.nvmlDeviceGetRemappedRows, h)
    if rows is not None:
        g.remapped_rows_correctable, g.remapped_rows_uncorrectable = int(rows[0]), int(rows[1])
        g.remap_pending, g.remap_failure = bool(rows[2]), bool(rows[3])
    else:  # pre-Ampere: page retirement
        cause_sbe = pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
        cause_dbe = pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
        pages = [_try(pynvml.nvmlDeviceGetRetiredPages, h, c) for c in (cause_sbe, cause_dbe)]
        if any(p is not None for p in pages):
            g.retired_pages = sum(len(p) for p in pages if p)
            g.retired_pages_pending = bool(_try(pynvml.nvmlDeviceGetRetiredPagesPendingStatus, h, default=0))
    g.pcie_gen = _try(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, h)
    g.pcie_gen_max = _try(pynvml.nvmlDeviceGetMaxPcieLinkGeneration, h)
    g.pcie_width = _try(pynvml.nvmlDeviceGetCurrPcieLinkWidth, h)
    g.pcie_width_max = _try(pynvml.nvmlDeviceGetMaxPcieLinkWidth, h)
    _read_nvlink(pynvml, h, g)
    procs = _try(pynvml.nvmlDeviceGetComputeRunningProcesses, h, default=[]) or []
    g.processes = [_describe_process(p) for p in procs]
    return g


def _read_nvlink(pynvml, h, g: GpuReading) -> None:
    states = [_try(pynvml.nvmlDeviceGetNvLinkState, h, link) for link in range(pynvml.NVML_NVLINK_MAX_LINKS)]
    present = [s for s in states if s is not None]
    if not present:
        return
    g.nvlink_total, g.nvlink_active = len(present), sum(1 for s in present if s)
    counters = {"replay": pynvml.NVML_NVLINK_ERROR_DL_REPLAY, "recovery": pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
                "crc_flit": pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT}
    for name, counter in counters.items():
        values = [_try(pynvml.nvmlDeviceGetNvLinkErrorCounter, h, link, counter)
                  for link, s in enumerate(states) if s]
        values = [v for v in values if v is not None]
        if values:
            g.nvlink_errors[name] = int(sum(values))


def _describe_process(p) -> str:
    import psutil

    try:
        name = psutil.Process(p.pid).name()
    except Exception:
        name = "?"  # in a container the pid may belong to another namespace
    used = getattr(p, "usedGpuMemory", None)
    return f"{p.pid} {name} {used / 2**20:.0f} MiB" if used else f"{p.pid} {name}"


def _amd_note() -> str | None:
    for tool in ("amd-smi", "rocm-smi"):
        if shutil.which(tool):
            return (f"No NVIDIA GPU, but {tool} is installed: AMD GPUs are not read by gpu_health yet. Run "
                    f"`{tool} {'metric' if tool == 'amd-smi' else '--showallinfo'}` for ECC, temperature and clocks.")
    return None


def run(params: GpuHealthParams, progress) -> GpuHealthResult:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as e:
        return GpuHealthResult(verdict="info", findings=[_amd_note() or f"No NVIDIA GPU here: NVML is not available ({e})."
                                                         " Nothing to check on this machine."],
                               next=["env_report"])
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
        count = pynvml.nvmlDeviceGetCount()
        gpus = []
        for i in range(count):
            progress(i / max(count, 1), f"reading GPU {i}")
            gpus.append(read_gpu(pynvml, i))
    finally:
        pynvml.nvmlShutdown()
    log_note = "not read (read_kernel_log=false)"
    if params.read_kernel_log:
        text, log_note = read_kernel_log()
        xids = parse_xids(text)
        for g in gpus:
            g.xids = xids.get(_short_bus(g.pci_bus_id), [])[-10:]
    for g in gpus:
        assess(g)
    return summarise(gpus, driver, log_note)


def summarise(gpus: list[GpuReading], driver: str | None, log_note: str) -> GpuHealthResult:
    result = GpuHealthResult(gpus=gpus, gpu_count=len(gpus), driver=driver, kernel_log=log_note)
    if not gpus:
        result.verdict, result.findings = "info", ["NVML works but reports no GPUs."]
        return result
    bad = [g for g in gpus if g.verdict != "ok"]
    result.verdict = "fail" if any(g.verdict == "fail" for g in gpus) else "warn" if bad else "ok"
    names = sorted({g.name for g in gpus})
    result.findings = [f"{len(gpus)} GPU(s) ({', '.join(names)}), driver {driver}: "
                       + ("all healthy." if not bad else f"{len(bad)} need attention.")]
    for g in bad:
        result.findings += [f"GPU {g.index} ({g.pci_bus_id}, serial {g.serial}): {p}." for p in g.problems]
    busy = [g for g in gpus if g.processes]
    if busy:
        result.findings.append("Processes hold GPU memory: " + "; ".join(
            f"GPU {g.index}: {', '.join(g.processes)}" for g in busy) + " (a leftover job can cause OOMs and slow benchmarks).")
    temps = [g.temperature_c for g in gpus if g.temperature_c is not None]
    if temps:
        result.findings.append(f"Temperatures {min(temps)}–{max(temps)} °C; SM clocks "
                               + ", ".join(f"{g.sm_clock_mhz}/{g.sm_clock_max_mhz}" for g in gpus) + " MHz (now/max).")
    if not log_note.startswith("read"):
        result.findings.append(f"XID check: {log_note}.")
    result.next = (["knowledge://compute/gpu-faults.md", "matmul_bench"] if result.verdict == "fail" else
                   ["knowledge://compute/throttling-and-clocks.md", "matmul_bench"] if bad else
                   ["matmul_bench", "p2p_bandwidth"])
    return result


SPEC = ToolSpec(
    name="gpu_health",
    summary="Per-GPU health through NVML: ECC, row remapping, XIDs, throttling, temperature, power, PCIe, NVLink.",
    description=(
        "Check whether each GPU of this node is healthy, through NVML: uncorrectable ECC errors, remapped rows "
        "(pending / failed), retired pages, XID events from the kernel log (48, 63, 64, 74, 79, 94, 95...), clock "
        "throttle reasons (thermal, power brake), temperature vs slowdown point, power vs limit, SM clock vs max, PCIe "
        "link generation/width vs max (downtrained links), NVLink links down and error counters, and processes "
        "holding GPU memory. Verdict per GPU and for the node, with the serial to report. Use for 'is this GPU "
        "healthy', Xid messages in logs, a node slower than its peers, ECC errors, or before blaming software. "
        "~1-3 s, read-only, NVIDIA GPUs (AMD: not yet). Not a performance test (matmul_bench, p2p_bandwidth)."),
    Params=GpuHealthParams, Result=GpuHealthResult, run=run, runs="subprocess", timeout_s=60,
    doctor=lambda ctx: {}, doctor_order=15,
)

if __name__ == "__main__":
    from .engine.cli import tool_main

    tool_main(SPEC)
