"""gpu_health — is each GPU of this node healthy, and what to do about it.

ECC and row remapping, Xids from the kernel log, NVLink per link and PCIe per hop of the PCI tree over a short
sampling window under a small load, clock events with their durations, persistence / ECC / MIG modes, fabric
state on NVSwitch systems, who holds the memory, and DCGM diagnostics where DCGM is installed. Read through
NVML (nvidia-ml-py) and sysfs, not by parsing nvidia-smi text. Every problem carries an action (none / monitor
/ reset_gpu / reboot_node / drain_node / replace); the worst one is the GPU's and the node's. Runs in a child
process: a wedged driver can hang an NVML call, and the runner's timeout then kills it.

By hand:
    mleng run gpu_health                     # this node
    mleng run gpu_health --dcgm-level 2      # plus `dcgmi diag -r 2` (about 2 minutes)
    mleng run gpu_health --text "$(nvidia-smi nvlink -s)"    # judge pasted output (no GPU needed)
    srun --ntasks-per-node=1 mleng run gpu_health --json > health-$SLURM_JOB_ID.json   # every node
"""

import time

from ..engine.spec import Field, Params, Record, Result, ToolFailure, ToolSpec, worst
from ..engine.data import load_data
from ..shared.safe_read import read_limited
from ..shared.actions import ACTION_FIELD, Action, HealthFinding, by_action, verdict_of, worst_action
from . import dcgm, holders, pasted, read
from .assess import assess
from .holders import MemoryHolder
from .models import XidSeen
from .pcie import PcieHop
from .sampling import NvLinkCounters
from .window import kernel_log, read_kernel_log, sample_window

# Deadline of a `dcgmi diag` run inside the tool's own deadline (SPEC.timeout_s): levels 1-3 fit; a level 4
# with memtest can take longer, run it by hand (`dcgmi diag -r 4 -j > diag.json`) and pass dcgm_file.
DCGM_TIMEOUT_S = 1700
DCGM_FILE_BYTES = 16 << 20   # `dcgmi diag -r 4 -j` on 8 GPUs is well under 1 MiB; anything bigger is not its output

__all__ = ["SPEC", "GpuHealthParams", "GpuReading", "GpuHealthResult", "XidSeen", "assess", "run", "summarise"]


class GpuHealthParams(Params):
    read_kernel_log: bool = Field(True, description="Look for Xid / SXid events in the kernel log.")
    sample_s: float = Field(2.0, ge=0, le=60, description=(
        "Window for NVLink, clock, PCIe counters (0: one reading)."))
    load: bool = Field(True, description=(
        "Small matmul load, so idle power saving is not taken for a downtrained link."))
    dcgm_level: int = Field(0, ge=0, le=4, description=(
        "dcgmi diag -r N (1 s, 2 ~2 min, 3 ~15 min, 4 hours; 3-4 fill every GPU)."))
    dcgm_file: str | None = Field(None, max_length=4096, description=(
        "Saved dcgmi diag output (-j or table) to read instead."))
    text: str | None = Field(None, max_length=1_000_000, description=(
        "Pasted `nvidia-smi nvlink -e / -s` or `dcgmi diag` output to judge instead."))


class GpuReading(Record):
    index: int = Field(description="NVML index.")
    name: str = Field(description="GPU model as NVML reports it.")
    uuid: str = Field("", description="GPU UUID.")
    serial: str | None = Field(None, description="Board serial (None on consumer cards).")
    pci_bus_id: str = Field("", description="PCI bus id, e.g. 00000000:3B:00.0.")
    verdict: str = Field("ok", description="ok | warn | fail for this GPU.")
    action: Action = Field("none", description="The strongest action its problems call for. " + ACTION_FIELD)
    problems: list[HealthFinding] = Field(default_factory=list, description="What is wrong, with an action each.")
    temperature_c: int | None = Field(None, description="GPU temperature, °C.")
    slowdown_temperature_c: int | None = Field(None, description="Temperature at which the GPU slows itself down, °C.")
    power_w: float | None = Field(None, description="Power draw, W.")
    power_limit_w: float | None = Field(None, description="Enforced power limit, W.")
    default_power_limit_w: float | None = Field(None, description="Default power limit, W.")
    sm_clock_mhz: int | None = Field(None, description="Current SM clock, MHz.")
    sm_clock_max_mhz: int | None = Field(None, description="Maximum SM clock, MHz.")
    utilization_pct: int | None = Field(None, description="GPU utilisation over the last sample period, %.")
    throttle_reasons: list[str] = Field(default_factory=list, description="Clock-event reasons active at the reading.")
    clock_event_s: dict[str, float] = Field(default_factory=dict, description="Seconds each clock-event reason was active during the window.")
    memory_used_mib: float | None = Field(None, description="Device memory in use, MiB.")
    memory_total_mib: float | None = Field(None, description="Device memory, MiB.")
    ecc_enabled: bool | None = Field(None, description="ECC mode currently on.")
    ecc_pending: bool | None = Field(None, description="ECC mode after the next reboot.")
    ecc_uncorrected_volatile: int | None = Field(None, description="Uncorrectable ECC errors since the last reset.")
    ecc_uncorrected_aggregate: int | None = Field(None, description="Uncorrectable ECC errors over the GPU's life.")
    ecc_corrected_volatile: int | None = Field(None, description="Corrected ECC errors since the last reset.")
    remapped_rows_correctable: int | None = Field(None, description="Rows remapped for correctable errors (Ampere+).")
    remapped_rows_uncorrectable: int | None = Field(None, description="Rows remapped for uncorrectable errors (Ampere+).")
    remap_pending: bool | None = Field(None, description="A row remap waits for a GPU reset.")
    remap_failure: bool | None = Field(None, description="A row remap failed.")
    retired_pages: int | None = Field(None, description="Retired pages (pre-Ampere).")
    retired_pages_pending: bool | None = Field(None, description="Page retirement waits for a reset (pre-Ampere).")
    persistence_mode: bool | None = Field(None, description="Persistence mode on.")
    mig_enabled: bool | None = Field(None, description="MIG mode now.")
    mig_pending: bool | None = Field(None, description="MIG mode after the next GPU reset.")
    fabric_state: str | None = Field(None, description="NVSwitch fabric registration: completed | in_progress | not_started (None: no NVSwitch fabric).")
    fabric_status: str | None = Field(None, description="'success' or the error Fabric Manager reported.")
    pcie_gen: int | None = Field(None, description="PCIe generation now (drops at idle to save power).")
    pcie_gen_max: int | None = Field(None, description="Highest PCIe generation of the GPU.")
    pcie_width: int | None = Field(None, description="PCIe link width now (lanes).")
    pcie_width_max: int | None = Field(None, description="Widest PCIe link of the GPU (lanes).")
    pcie_chain: list[PcieHop] = Field(default_factory=list, description="The GPU and each bridge above it (sysfs), last reading.")
    pcie_note: str = Field("", description="Why the link runs below the GPU's own maximum when that is expected.")
    pcie_replays: int | None = Field(None, description="PCIe replay counter (total since the driver loaded).")
    pcie_replays_window: int | None = Field(None, description="PCIe replays during the window.")
    nvlink_active: int | None = Field(None, description="NVLink links up.")
    nvlink_total: int | None = Field(None, description="NVLink links the GPU has (links that answer; a product may have fewer than the maximum).")
    nvlink_links: list[NvLinkCounters] = Field(default_factory=list, description="Per-link state and error totals at the end of the window.")
    holders: list[MemoryHolder] = Field(default_factory=list, description="Processes holding device memory.")
    xids: list[XidSeen] = Field(default_factory=list, description="Xid events of this GPU from the kernel log.")

    @property
    def subject(self) -> str:
        return f"GPU {self.index}" + (f" ({self.pci_bus_id})" if self.pci_bus_id else "")


class GpuHealthResult(Result):
    gpus: list[GpuReading] = Field(default_factory=list, description="One reading per GPU.")
    gpu_count: int = Field(0, description="GPUs found.")
    driver: str | None = Field(None, description="Driver version.")
    action: Action = Field("none", description="The node's action: the worst of its GPUs' and DCGM's. " + ACTION_FIELD)
    actions: dict[str, list[str]] = Field(default_factory=dict, description="{action: [GPUs]} worst first (for fleet summaries).")
    window_s: float = Field(0.0, description="Length of the sampling window, s.")
    load: str = Field("", description="Whether a load ran during the window, or why not.")
    kernel_log: str = Field("", description="Whether Xid events could be read, and from where.")
    switch_events: list[HealthFinding] = Field(default_factory=list, description="NVSwitch SXid events (not tied to one GPU).")
    dcgm: list[HealthFinding] = Field(default_factory=list, description="DCGM diagnostic results that are not a clean pass.")
    dcgm_note: str = Field("", description="What DCGM ran (level and its cost), or why it did not.")


def read_gpu(nv, index: int):
    """(handle, reading) for GPU `index`: identity, clocks, memory health, modes, memory holders."""
    h = nv.nvmlDeviceGetHandleByIndex(index)
    g = GpuReading(index=index, name=read.text(nv.nvmlDeviceGetName(h)), uuid=read.text(read.attempt(getattr(nv, "nvmlDeviceGetUUID", None), h, default="")),
                   serial=read.text(read.attempt(getattr(nv, "nvmlDeviceGetSerial", None), h)))
    pci = read.attempt(getattr(nv, "nvmlDeviceGetPciInfo", None), h)
    g.pci_bus_id = read.text(pci.busId) if pci is not None else ""
    read.read_basics(nv, h, g)
    read.read_memory_health(nv, h, g)
    read.read_modes(nv, h, g)
    now = time.time()
    procs = read.attempt(getattr(nv, "nvmlDeviceGetComputeRunningProcesses", None), h, default=[]) or []
    g.holders = [holders.describe(p.pid, getattr(p, "usedGpuMemory", None), now) for p in procs]
    return h, g


def _dcgm(params: GpuHealthParams) -> tuple[list[HealthFinding], str]:
    if params.dcgm_file:
        try:
            text = read_limited(params.dcgm_file, DCGM_FILE_BYTES, "dcgm_file").decode("utf-8", "replace")
            note = f"read {params.dcgm_file}"
        except OSError as e:
            return [], f"dcgm_file {params.dcgm_file!r} could not be read: {e.strerror}"
    elif params.dcgm_level:
        level = load_data("dcgm_errors")["level"][str(params.dcgm_level)]
        text, note = dcgm.run_diag(params.dcgm_level, timeout_s=DCGM_TIMEOUT_S)
        note = f"{note}; level {params.dcgm_level} = {level['name']}, {level['cost']}"
        if text is None:
            return [], note
    else:
        return [], "DCGM diagnostics not run (dcgm_level=0)"
    try:
        results, version = dcgm.parse(text)
    except ValueError as e:
        return [], f"{note}; could not read it: {e}"
    found = [f for f in (dcgm.judge(r) for r in results) if f]
    return found, f"{note}; DCGM {version or '?'}: {len(results)} results, {len(found)} not a clean pass"


def run(params: GpuHealthParams, progress) -> GpuHealthResult:
    if params.text is not None:
        return read_pasted(params.text)
    try:
        import pynvml as nv

        nv.nvmlInit()
    except Exception as e:
        return _no_nvml(e, *(_dcgm(params) if params.dcgm_file else ([], "")))
    try:
        driver = read_text_driver(nv)
        pairs = [read_gpu(nv, i) for i in range(nv.nvmlDeviceGetCount())]
        handles, gpus = [h for h, _ in pairs], [g for _, g in pairs]
        progress(0.2, f"sampling {len(gpus)} GPU(s) for {params.sample_s:g} s")
        window, load_note, window_s = sample_window(nv, handles, gpus, params.sample_s, params.load)
    finally:
        nv.nvmlShutdown()
    log_note, switch = "not read (read_kernel_log=false)", []
    if params.read_kernel_log:
        text, log_note = read_kernel_log()
        switch = kernel_log(gpus, text)
    for g in gpus:
        assess(g, window.get(g.index, []))
    progress(0.8, "DCGM" if params.dcgm_level or params.dcgm_file else "summary")
    found, dcgm_note = _dcgm(params)
    return summarise(gpus, driver, log_note, window_s=window_s, load_note=load_note, switch=switch,
                     dcgm=found, dcgm_note=dcgm_note)


def read_pasted(text: str) -> GpuHealthResult:
    """Pasted NVLink (-e / -s) or dcgmi diag output, judged as on a node; ToolFailure naming the formats otherwise."""
    try:
        kinds, every = pasted.parse_nvlink(text)
    except ValueError as e:     # a crafted number or too many lines, named by line
        raise ToolFailure(f"text: {e}; expected {pasted.EXPECTED}") from None
    blocks = [b for b in every if b.links]
    if blocks:
        gpus = [GpuReading(index=b.index, name=b.name, uuid=b.uuid, nvlink_links=sorted(b.links.values(), key=lambda c: c.link))
                for b in blocks]
        for g, b in zip(gpus, blocks):
            if b.status_read:
                g.nvlink_active, g.nvlink_total = sum(c.active for c in g.nvlink_links), len(g.nvlink_links)
        found = pasted.judge(blocks, lambda b: f"GPU {b.index}")
        for g in gpus:
            assess(g, found[g.index])
        result = summarise(gpus, None, "not read (pasted text)")
        result.findings.insert(1, f"Read pasted {' and '.join(kinds)} output: {len(gpus)} GPU(s), "
                                  f"{sum(len(g.nvlink_links) for g in gpus)} link(s); one reading.")
        result.findings += [f"GPU {b.index}: no link lines under its header (the paste ends there?): not judged."
                            for b in every if not b.links]
        result.findings += [f"GPU {b.index} is read twice in the paste: its last reading is judged (totals; "
                            "gpu_health on the node judges the change over its window)." for b in blocks if b.read_twice]
        if shared := pasted.same_inactive_everywhere(blocks):
            result.findings.insert(2, f"Links {shared} are inactive on every GPU of the paste: the system's wiring "
                                      "(a product that uses a subset of its links), not a fault.")
        return result
    try:
        results, version = dcgm.parse(text)
    except ValueError as e:
        head = text.strip().splitlines()[0][:80] if text.strip() else "(empty)"
        raise ToolFailure(f"text: not a format gpu_health reads; expected {pasted.EXPECTED}; it starts with "
                          f"{head!r} ({e})") from None
    found = [f for f in (dcgm.judge(r) for r in results) if f]
    note = f"read pasted dcgmi diag output; DCGM {version or '?'}: {len(results)} results, {len(found)} not a clean pass"
    return _dcgm_answer("Read pasted `dcgmi diag` output.", found, note, verdict="ok")


def _no_nvml(error: Exception, found: list[HealthFinding], note: str) -> GpuHealthResult:
    """No NVIDIA GPU readable here: say so; a saved DCGM output is still read and judged."""
    return _dcgm_answer(f"No NVIDIA GPU here: NVML is not available ({error}). Nothing to check on this machine.",
                        found, note, verdict="info")


def _dcgm_answer(first: str, found: list[HealthFinding], note: str, verdict: str) -> GpuHealthResult:
    """A result made of DCGM findings alone (no GPU read here); `verdict` when none is a problem."""
    result = GpuHealthResult(verdict=verdict, findings=[first], next=["env_report"], dcgm=found, dcgm_note=note)
    if found:
        result.action, result.actions = worst_action(f.action for f in found), by_action(found)
        result.verdict = worst(verdict_of(f.action) for f in found)
        result.findings = [first] + [f"{f.subject}: {f.text} [{f.action}]." for f in found] + [f"DCGM: {note}."]
        result.next = ["knowledge://compute/gpu-faults.md"]
    return result


def read_text_driver(nv) -> str:
    return read.text(nv.nvmlSystemGetDriverVersion())


def summarise(gpus: list[GpuReading], driver: str | None, log_note: str, *, window_s: float = 0.0, load_note: str = "",
              switch: list[HealthFinding] = (), dcgm: list[HealthFinding] = (), dcgm_note: str = "") -> GpuHealthResult:
    result = GpuHealthResult(gpus=gpus, gpu_count=len(gpus), driver=driver, kernel_log=log_note, window_s=window_s,
                             load=load_note, switch_events=list(switch), dcgm=list(dcgm), dcgm_note=dcgm_note)
    if not gpus:
        result.verdict, result.findings = "info", ["NVML works but reports no GPUs."]
        return result
    every = [f for g in gpus for f in g.problems] + result.switch_events + result.dcgm
    result.action = worst_action(f.action for f in every)
    result.actions = by_action(every)
    result.verdict = worst([g.verdict for g in gpus] + [verdict_of(f.action) for f in result.switch_events + result.dcgm])
    bad = [g for g in gpus if g.verdict != "ok"]
    names = sorted({g.name for g in gpus})
    result.findings = [f"{len(gpus)} GPU(s) ({', '.join(names)})" + (f", driver {driver}" if driver else "") + ": "
                       + ("all healthy" if not bad else f"{len(bad)} need attention")
                       + f"; action for the node: {result.action}."]
    for g in gpus:
        result.findings += [f"GPU {g.index}" + (f" ({g.pci_bus_id}, serial {g.serial})" if g.pci_bus_id else "")
                            + f": {p.text} [{p.action}]."
                            for p in g.problems]
    result.findings += [f"{f.subject}: {f.text} [{f.action}]." for f in result.switch_events + result.dcgm]
    result.findings += _holder_sentences(gpus) + _context(gpus, window_s, load_note, log_note, dcgm_note)
    result.next = (["knowledge://compute/gpu-faults.md", "matmul_bench"] if result.verdict == "fail" else
                   ["knowledge://compute/throttling-and-clocks.md", "matmul_bench"] if bad else
                   ["matmul_bench", "p2p_bandwidth"])
    return result


def _holder_sentences(gpus: list[GpuReading]) -> list[str]:
    return [f"GPU {g.index}: {holders.judge(g.subject, h).text}." for g in gpus for h in g.holders]


def _context(gpus, window_s, load_note, log_note, dcgm_note) -> list[str]:
    out = []
    temps = [g.temperature_c for g in gpus if g.temperature_c is not None]
    if temps:
        out.append(f"Temperatures {min(temps)}–{max(temps)} °C; SM clocks "
                   + ", ".join(f"{g.sm_clock_mhz}/{g.sm_clock_max_mhz}" for g in gpus) + " MHz (now/max).")
    notes = sorted({g.pcie_note for g in gpus if g.pcie_note})
    out += [f"PCIe: {n}." for n in notes]
    if window_s and any(not g.pcie_chain or g.pcie_chain[0].gen is None for g in gpus):
        out.append("PCIe: the PCI tree above some GPUs is not readable in /sys/bus/pci (a container?): their links "
                   "are judged from NVML alone (width against the GPU's own maximum).")
    elif window_s and any(len(g.pcie_chain) == 1 for g in gpus):
        out.append("PCIe: some GPUs sit directly on a root bus with no bridge or switch above them in this "
                   "machine's view (typical of a virtual machine): their links are judged against the GPU's own "
                   "maximum.")
    if window_s:
        out.append(f"Sampled {window_s:g} s; {load_note}.")
    if not log_note.startswith("read"):
        out.append(f"Xid check: {log_note}.")
    if dcgm_note and "dcgm_level=0" not in dcgm_note:
        out.append(f"DCGM: {dcgm_note}.")
    return out


def _gpus_used(params: GpuHealthParams) -> list[int]:
    """The GPUs a run occupies (its small load, or DCGM's tests), so that mleng's benchmarks do not run beside it."""
    if params.text is not None or not ((params.load and params.sample_s > 0) or params.dcgm_level >= 2):
        return []   # pasted text touches no GPU
    from ..engine.processes import local_gpu_count

    return list(range(local_gpu_count()))


SPEC = ToolSpec(
    name="gpu_health",
    summary="Per-GPU health and what to do about it: ECC, row remapping, Xids, NVLink/PCIe links, clocks, modes, DCGM.",
    description=(
        "Is each GPU of this node healthy, and what to do (none, monitor, reset_gpu, reboot_node, drain_node, "
        "replace): uncorrectable ECC, remapped rows, Xid / SXid events (kernel log, NVIDIA's catalog), NVLink "
        "CRC and replay counters, PCIe width and generation per hop under load, PCIe replays and AER errors, "
        "clock-event reasons (power brake, thermal), modes, NVSwitch fabric state, who holds GPU memory (yours, "
        "another user's, a zombie), DCGM diagnostics (dcgm_level); pasted nvlink -e/-s or dcgmi diag (text=). "
        "Use for 'is this GPU ok', Xids in this node's kernel log (a pasted dmesg: log_triage), 'GPU has fallen "
        "off the bus', 'Unable to determine the device handle', 'uncorrectable ECC error encountered', a GPU "
        "lost in training, a node slower than its peers. ~5-15 s. Not a performance test (matmul_bench)."),
    Params=GpuHealthParams, Result=GpuHealthResult, run=run, runs="subprocess", timeout_s=1800,
    gpu_devices=_gpus_used, doctor=lambda ctx: {}, doctor_order=15,
)
