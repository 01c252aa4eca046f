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
    """fn(*args), or `default` when the call fails or this binding lacks the function (fn is None)."""
    if fn is None:
        return default
    try:
        return fn(*args)
    except Exception:
        return default


def text(v):
    return v.decode() if isinstance(v, bytes) else v


def read_basics(nv, h, g) -> None:
    g.temperature_c = attempt(getattr(nv, "nvmlDeviceGetTemperature", None), h, nv.NVML_TEMPERATURE_GPU)
    g.slowdown_temperature_c = attempt(getattr(nv, "nvmlDeviceGetTemperatureThreshold", None), h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
    mw = lambda v: None if v is None else round(v / 1000, 1)  # noqa: E731
    g.power_w = mw(attempt(getattr(nv, "nvmlDeviceGetPowerUsage", None), h))
    g.power_limit_w = mw(attempt(getattr(nv, "nvmlDeviceGetEnforcedPowerLimit", None), h))
    g.default_power_limit_w = mw(attempt(getattr(nv, "nvmlDeviceGetPowerManagementDefaultLimit", None), h))
    g.sm_clock_mhz = attempt(getattr(nv, "nvmlDeviceGetClockInfo", None), h, nv.NVML_CLOCK_SM)
    g.sm_clock_max_mhz = attempt(getattr(nv, "nvmlDeviceGetMaxClockInfo", None), h, nv.NVML_CLOCK_SM)
    util = attempt(getattr(nv, "nvmlDeviceGetUtilizationRates", None), h)
    g.utilization_pct = util.gpu if util is not None else None
    query = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
    reasons = attempt(query, h) if query else None
    if reasons is not None:
        g.throttle_reasons = [name for bit, name in THROTTLE_BITS.items() if reasons & bit]
    mem = attempt(getattr(nv, "nvmlDeviceGetMemoryInfo", None), h)
    if mem is not None:
        g.memory_used_mib, g.memory_total_mib = round(mem.used / 2**20, 1), round(mem.total / 2**20, 1)


def read_memory_health(nv, h, g) -> None:
    mode = attempt(getattr(nv, "nvmlDeviceGetEccMode", None), h)
    if mode is not None:
        g.ecc_enabled, g.ecc_pending = bool(mode[0]), bool(mode[1])
        unc, cor = nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED
        g.ecc_uncorrected_volatile = attempt(getattr(nv, "nvmlDeviceGetTotalEccErrors", None), h, unc, nv.NVML_VOLATILE_ECC)
        g.ecc_uncorrected_aggregate = attempt(getattr(nv, "nvmlDeviceGetTotalEccErrors", None), h, unc, nv.NVML_AGGREGATE_ECC)
        g.ecc_corrected_volatile = attempt(getattr(nv, "nvmlDeviceGetTotalEccErrors", None), h, cor, nv.NVML_VOLATILE_ECC)
    rows = attempt(getattr(nv, "nvmlDeviceGetRemappedRows", None), h)
    if rows is not None:
        g.remapped_rows_correctable, g.remapped_rows_uncorrectable = int(rows[0]), int(rows[1])
        g.remap_pending, g.remap_failure = bool(rows[2]), bool(rows[3])
        return
    pages = [attempt(getattr(nv, "nvmlDeviceGetRetiredPages", None), h, c) for c in
             (nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS, nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)]
    if any(p is not None for p in pages):   # pre-Ampere: page retirement
        g.retired_pages = sum(len(p) for p in pages if p)
        g.retired_pages_pending = bool(attempt(getattr(nv, "nvmlDeviceGetRetiredPagesPendingStatus", None), h, default=0))


def read_modes(nv, h, g) -> None:
    pm = attempt(getattr(nv, "nvmlDeviceGetPersistenceMode", None), h)
    g.persistence_mode = None if pm is None else bool(pm)
    mig = attempt(getattr(nv, "nvmlDeviceGetMigMode", None), h)
    if mig is not None:
        g.mig_enabled, g.mig_pending = bool(mig[0]), bool(mig[1])
    info = attempt(getattr(nv, "nvmlDeviceGetGpuFabricInfo", None), h)
    if info is not None:
        states = {getattr(nv, k, None): v for k, v in FABRIC_STATES.items()}
        g.fabric_state = states.get(getattr(info, "state", None))
        status = getattr(info, "status", 0)
        if g.fabric_state == "completed" and status not in (0, None):
            g.fabric_status = text(attempt(getattr(nv, "nvmlErrorString", None), status, default=str(status)))
        elif g.fabric_state == "completed":
            g.fabric_status = "success"
    g.pcie_gen_max = attempt(getattr(nv, "nvmlDeviceGetMaxPcieLinkGeneration", None), h)
    g.pcie_width_max = attempt(getattr(nv, "nvmlDeviceGetMaxPcieLinkWidth", None), h)
    g.pcie_gen = attempt(getattr(nv, "nvmlDeviceGetCurrPcieLinkGeneration", None), h)
    g.pcie_width = attempt(getattr(nv, "nvmlDeviceGetCurrPcieLinkWidth", None), h)


def nvlink_counters(nv, h) -> list[NvLinkCounters]:
    out = []
    names = {"replay": "NVML_NVLINK_ERROR_DL_REPLAY", "recovery": "NVML_NVLINK_ERROR_DL_RECOVERY",
             "crc_flit": "NVML_NVLINK_ERROR_DL_CRC_FLIT", "crc_data": "NVML_NVLINK_ERROR_DL_CRC_DATA"}
    for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
        state = attempt(getattr(nv, "nvmlDeviceGetNvLinkState", None), h, link)
        if state is None:       # a link this product does not have (fewer links than the maximum)
            continue
        c = NvLinkCounters(link=link, active=bool(state))
        for field, const in names.items():
            if hasattr(nv, const) and state:
                value = attempt(getattr(nv, "nvmlDeviceGetNvLinkErrorCounter", None), h, link, getattr(nv, const))
                setattr(c, field, None if value is None else int(value))
        out.append(c)
    return out


def clock_event_ns(nv, h) -> dict[str, int]:
    """Cumulative ns per clock-event reason (drivers that have these fields), else {}."""
    wanted = {k: getattr(nv, v) for k, v in EVENT_FIELDS.items() if v and hasattr(nv, v)}
    if not wanted or not hasattr(nv, "nvmlDeviceGetFieldValues"):
        return {}
    values = attempt(getattr(nv, "nvmlDeviceGetFieldValues", None), h, list(wanted.values()), default=[]) or []
    out = {}
    for name, v in zip(wanted, values):
        try:
            if v.nvmlReturn == 0:
                out[name] = int(v.value.ullVal)
        except (AttributeError, TypeError, ValueError):   # a binding without these fields: no durations
            continue
    return out


def pcie_replays(nv, h) -> int | None:
    return attempt(getattr(nv, "nvmlDeviceGetPcieReplayCounter", None), h)
