"""Reading NVML: every query may be unsupported on some GPU or driver, so each is guarded."""

from .sampling import NvLinkCounters

# Clock event ("throttle") reason bits as NVML defines them.
THROTTLE_BITS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting",
}
# NVML field ids holding the cumulative time (ns) each clock-event reason was active.
EVENT_FIELDS = {"sw_power_cap": "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP",
                "hw_slowdown": None,
                "hw_thermal_slowdown": "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN",
                "hw_power_brake_slowdown": "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN",
                "sw_thermal_slowdown": "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN"}
FABRIC_STATES = {"NVML_GPU_FABRIC_STATE_NOT_SUPPORTED": None, "NVML_GPU_FABRIC_STATE_NOT_STARTED": "not_started",
                 "NVML_GPU_FABRIC_STATE_IN_PROGRESS": "in_progress", "NVML_GPU_FABRIC_STATE_COMPLETED": "completed"}


def attempt(fn, *args, default=None):
    try:
        return fn(*args)
    except Exception:
        return default


def text(v):
    return v.decode() if isinstance(v, bytes) else v


def read_basics(nv, h, g) -> None:
    g.temperature_c = attempt(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
    g.slowdown_temperature_c = attempt(nv.nvmlDeviceGetTemperatureThreshold, h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
    mw = lambda v: None if v is None else round(v / 1000, 1)  # noqa: E731
    g.power_w = mw(attempt(nv.nvmlDeviceGetPowerUsage, h))
    g.power_limit_w = mw(attempt(nv.nvmlDeviceGetEnforcedPowerLimit, h))
    g.default_power_limit_w = mw(attempt(nv.nvmlDeviceGetPowerManagementDefaultLimit, h))
    g.sm_clock_mhz = attempt(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
    g.sm_clock_max_mhz = attempt(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM)
    util = attempt(nv.nvmlDeviceGetUtilizationRates, h)
    g.utilization_pct = util.gpu if util is not None else None
    reasons = attempt(getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", nv.nvmlDeviceGetCurrentClocksThrottleReasons), h)
    if reasons is not None:
        g.throttle_reasons = [name for bit, name in THROTTLE_BITS.items() if reasons & bit]
    mem = attempt(nv.nvmlDeviceGetMemoryInfo, h)
    if mem is not None:
        g.memory_used_mib, g.memory_total_mib = round(mem.used / 2**20, 1), round(mem.total / 2**20, 1)


def read_memory_health(nv, h, g) -> None:
    mode = attempt(nv.nvmlDeviceGetEccMode, h)
    if mode is not None:
        g.ecc_enabled, g.ecc_pending = bool(mode[0]), bool(mode[1])
        unc, cor = nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED
        g.ecc_uncorrected_volatile = attempt(nv.nvmlDeviceGetTotalEccErrors, h, unc, nv.NVML_VOLATILE_ECC)
        g.ecc_uncorrected_aggregate = attempt(nv.nvmlDeviceGetTotalEccErrors, h, unc, nv.NVML_AGGREGATE_ECC)
        g.ecc_corrected_volatile = attempt(nv.nvmlDeviceGetTotalEccErrors, h, cor, nv.NVML_VOLATILE_ECC)
    rows = attempt(nv.nvmlDeviceGetRemappedRows, h)
    if rows is not None:
        g.remapped_rows_correctable, g.remapped_rows_uncorrectable = int(rows[0]), int(rows[1])
        g.remap_pending, g.remap_failure = bool(rows[2]), bool(rows[3])
        return
    pages = [attempt(nv.nvmlDeviceGetRetiredPages, h, c) for c in
             (nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS, nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)]
    if any(p is not None for p in pages):   # pre-Ampere: page retirement
        g.retired_pages = sum(len(p) for p in pages if p)
        g.retired_pages_pending = bool(attempt(nv.nvmlDeviceGetRetiredPagesPendingStatus, h, default=0))


def read_modes(nv, h, g) -> None:
    pm = attempt(nv.nvmlDeviceGetPersistenceMode, h)
    g.persistence_mode = None if pm is None else bool(pm)
    mig = attempt(nv.nvmlDeviceGetMigMode, h)
    if mig is not None:
        g.mig_enabled, g.mig_pending = bool(mig[0]), bool(mig[1])
    info = attempt(nv.nvmlDeviceGetGpuFabricInfo, h)
    if info is not None:
        states = {getattr(nv, k, None): v for k, v in FABRIC_STATES.items()}
        g.fabric_state = states.get(getattr(info, "state", None))
        status = getattr(info, "status", 0)
        if g.fabric_state == "completed" and status not in (0, None):
            g.fabric_status = text(attempt(nv.nvmlErrorString, status, default=str(status)))
        elif g.fabric_state == "completed":
            g.fabric_status = "success"
    g.pcie_gen_max = attempt(nv.nvmlDeviceGetMaxPcieLinkGeneration, h)
    g.pcie_width_max = attempt(nv.nvmlDeviceGetMaxPcieLinkWidth, h)
    g.pcie_gen = attempt(nv.nvmlDeviceGetCurrPcieLinkGeneration, h)
    g.pcie_width = attempt(nv.nvmlDeviceGetCurrPcieLinkWidth, h)


def nvlink_counters(nv, h) -> list[NvLinkCounters]:
    out = []
    names = {"replay": "NVML_NVLINK_ERROR_DL_REPLAY", "recovery": "NVML_NVLINK_ERROR_DL_RECOVERY",
             "crc_flit": "NVML_NVLINK_ERROR_DL_CRC_FLIT", "crc_data": "NVML_NVLINK_ERROR_DL_CRC_DATA"}
    for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
        state = attempt(nv.nvmlDeviceGetNvLinkState, h, link)
        if state is None:       # a link this product does not have (fewer links than the maximum)
            continue
        c = NvLinkCounters(link=link, active=bool(state))
        for field, const in names.items():
            if hasattr(nv, const) and state:
                value = attempt(nv.nvmlDeviceGetNvLinkErrorCounter, h, link, getattr(nv, const))
                setattr(c, field, None if value is None else int(value))
        out.append(c)
    return out


def clock_event_ns(nv, h) -> dict[str, int]:
    """Cumulative ns per clock-event reason (drivers that have these fields), else {}."""
    wanted = {k: getattr(nv, v) for k, v in EVENT_FIELDS.items() if v and hasattr(nv, v)}
    if not wanted or not hasattr(nv, "nvmlDeviceGetFieldValues"):
        return {}
    values = attempt(nv.nvmlDeviceGetFieldValues, h, list(wanted.values()), default=[]) or []
    out = {}
    for name, v in zip(wanted, values):
        if getattr(v, "nvmlReturn", 1) == 0:
            out[name] = int(v.value.ullVal)
    return out


def pcie_replays(nv, h) -> int | None:
    return attempt(nv.nvmlDeviceGetPcieReplayCounter, h)
