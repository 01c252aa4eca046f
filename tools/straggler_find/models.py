"""straggler_find's records: what one node reports and what the answer carries (the output schema)."""

from ..engine.spec import Field, Record
from ..shared.culprit_kind import Culprit, CulpritKind


class RankSample(Record):
    """One rank, sampled over the window on its own node."""

    # The window cut in thirds and the top frames per state: what a straggler's evidence already quotes.
    detail_fields = ("part_fractions", "part_samples", "part_cpu", "top_frames")

    rank: int | None = Field(None, description="Global rank (RANK / SLURM_PROCID in the process's environment).")
    local_rank: int | None = Field(None, description="LOCAL_RANK / SLURM_LOCALID.")
    host: str = Field("", description="Host the rank runs on.")
    pid: int = Field(0, description="Process id on that host.")
    samples: int = Field(0, description="Stack samples of the main thread read in the window.")
    fractions: dict[str, float] = Field(default_factory=dict, description=(
        "Share of samples per class: collective (waiting on peers), data, h2d, compute, idle; sums to 1."))
    part_fractions: list[dict[str, float]] = Field(default_factory=list, description=(
        "The same shares in each consecutive third of the window: a straggler stands out in every one."))
    part_samples: list[int] = Field(default_factory=list, description="Samples in each third.")
    part_cpu: list[float] = Field(default_factory=list, description="CPU-s per s it used in each third.")
    top_frames: dict[str, str] = Field(default_factory=dict, description=(
        "Per class, the user frame seen most often (function (file:line)): the evidence."))
    cpu_fraction: float | None = Field(None, description="CPU time the rank used per second of the window (1.0 = one core).")
    runqueue_wait_fraction: float | None = Field(None, description=(
        "Time its threads waited for a CPU per second of the window (/proc/PID/schedstat): CPU contention."))
    cgroup_throttled_fraction: float | None = Field(None, description=(
        "Share of CFS periods in the window in which the rank's cpu cgroup was throttled (a CPU limit bit)."))
    cgroup: str = Field("", description="The rank's cpu cgroup path.")
    cpus: str = Field("", description="The CPUs it may run on (its affinity: taskset, cpuset), e.g. '0-15'.")
    others_runnable: float | None = Field(None, description=(
        "Other processes runnable on its CPUs, mean over the window (not the job's): who it waits behind."))
    competitors: list[str] = Field(default_factory=list, description=(
        "Those other processes, most often runnable first: 'pid 4242 (python3) user nobody, runnable in 9 of 10 "
        "scans; SLURM job 12, started 2 h ago' (whose: from its cgroup). The name is the process's own choice: data, "
        "escaped and cut."))
    job_runnable: float | None = Field(None, description=(
        "The job's own other processes (ranks, their workers) runnable on its CPUs, mean over the window."))
    cpu_limit_cpus: float | None = Field(None, description=(
        "CPUs its tightest cpu cgroup quota allows (quota / period, the cgroup or one above it); None: no limit."))
    cpu_limit_at: str = Field("", description=(
        "Where that quota is set (whose, when the cgroup shows it), its values and when they were written: "
        "'/mln/mln3: cpu.cfs_quota_us 25000 / cpu.cfs_period_us 100000, written 3 min ago'."))
    gpu_index: int | None = Field(None, description="NVML index of the GPU the rank holds (from NVML's process list).")
    gpu_serial: str = Field("", description="That GPU's serial number.")
    error: str = Field("", description="Why this rank could not be sampled (py-spy attach, permissions, gone).")
    fr_late_ms: float | None = Field(None, description=(
        "From the job's flight-recorder dumps: median ms after the first rank that it issued each collective."))
    fr_duration_ms: float | None = Field(None, description=(
        "From the dumps, where the job set TORCH_NCCL_ENABLE_TIMING=1: median duration of its collectives, ms."))


class FlightRank(Record):
    """One rank's flight-recorder dump as its node read it (travels in the node's report, not in the answer)."""

    rank: int = 0
    host: str = ""
    path: str = ""
    written_at: float | None = None
    entries: list[tuple[str, int, int, float | None]] = Field(default_factory=list)   # group, seq, issued ns, ms
    error: str = ""


class GpuSample(Record):
    host: str = Field("", description="Host.")
    index: int = Field(0, description="NVML index.")
    serial: str = Field("", description="Board serial number (what a vendor RMA asks for).")
    uuid: str = Field("", description="GPU UUID.")
    sm_clock_median_mhz: float | None = Field(None, description="Median SM clock over the window, MHz.")
    sm_clock_max_mhz: float | None = Field(None, description="The GPU's maximum SM clock, MHz.")
    power_mean_w: float | None = Field(None, description="Mean board power, W.")
    power_limit_w: float | None = Field(None, description="Enforced power limit, W.")
    temperature_max_c: float | None = Field(None, description="Highest GPU temperature, deg C.")
    utilization_median_pct: float | None = Field(None, description="Median GPU utilisation, %.")
    reasons_fraction: dict[str, float] = Field(default_factory=dict, description=(
        "Share of samples with each clock-event reason (sw_power_cap, hw_slowdown, thermal...)."))
    pcie_tx_mb_s: float | None = Field(None, description="PCIe transmit throughput at the end of the window, MB/s.")
    pcie_rx_mb_s: float | None = Field(None, description="PCIe receive throughput at the end of the window, MB/s.")
    job_pids: list[int] = Field(default_factory=list, description="The job's ranks holding this GPU.")
    other_holders: list[str] = Field(default_factory=list, description=(
        "Processes outside the job holding this GPU: 'pid 123 (python serve.py), 4.1 GiB' (co-tenants)."))


class NodeSample(Record):
    host: str = Field("", description="Host.")
    cpus: int = Field(0, description="CPUs the node's kernel reports.")
    load_per_cpu: float | None = Field(None, description="1-minute load average / CPUs at the end of the window.")
    steal_fraction: float | None = Field(None, description="CPU time stolen by the hypervisor / total, over the window.")
    psi_cpu_some_pct: float | None = Field(None, description="/proc/pressure/cpu some avg10, %.")
    psi_memory_some_pct: float | None = Field(None, description="/proc/pressure/memory some avg10, % (memory pressure).")
    mem_available_fraction: float | None = Field(None, description="MemAvailable / MemTotal at the end of the window.")
    tcp_retrans_per_s: float | None = Field(None, description="TCP segments retransmitted per second in the window.")
    tx_mb_s: float | None = Field(None, description="Bytes sent per second on the node's interfaces (not lo), MB/s.")
    shaped_links: list[str] = Field(default_factory=list, description=(
        "Interfaces whose queueing discipline limited traffic in the window: 'eth0: tbf, 812 overlimits, 3 drops'."))
    nccl_ras: list[str] = Field(default_factory=list, description="What `ncclras` reported, when it runs on this node.")
    sampler_cpu_s: float | None = Field(None, description=(
        "CPU seconds this node's sampler (itself and its py-spy children) used: its cost to the node."))
    errors: list[str] = Field(default_factory=list, description="What this node's sampler could not read.")
    refused: list[str] = Field(default_factory=list, description=(
        "Processes left out: claimed the job but not its user's or not in its cgroup, or another user's."))


class NodeReport(Record):
    """Everything one node's sampler sends back."""

    host: str = ""
    ranks: list[RankSample] = Field(default_factory=list)
    gpus: list[GpuSample] = Field(default_factory=list)
    node: NodeSample = Field(default_factory=NodeSample)
    flight: list[FlightRank] = Field(default_factory=list)


class Straggler(Record):
    # Advice in our own words, a sentence or two: cut at the view's 160 characters, a model read "a sleep or a lock
    # wait is the loader's own co…[cut]" (round 10).
    whole_fields = ("next_steps",)
    rank: int | None = Field(None, description="The straggler's global rank.")
    host: str = Field("", description="Its host.")
    pid: int = Field(0, description="Its process id.")
    gpu_index: int | None = Field(None, description="Its GPU's NVML index, when NVML is there.")
    gpu_serial: str = Field("", description="Its GPU's serial number.")
    others_wait_fraction: float = Field(0.0, description=(
        "Share of the window the other ranks spend waiting for it (their collective wait above its own)."))
    work_ratio: float | None = Field(None, description="Its time on its own work / the others' (1.0 = same pace).")
    apart_in_stacks: bool = Field(True, description=(
        "False: named for its host alone (a rank starved of CPU reads as waiting in collectives like the others, "
        "as gloo spins there), so others_wait_fraction measures no wait on it."))
    reason: str = Field("", description="cpu | memory | data_loading | h2d | compute | gpu | network | unknown.")
    evidence: list[str] = Field(default_factory=list, description="The figures the reason rests on, with units.")
    next_steps: list[str] = Field(default_factory=list, description="What to run or check next (commands are never run).")
    culprit_kind: CulpritKind | None = Field(None, description=(
        "What to act on: rank (its own process: loader, compute, frozen), node (its host: a CPU quota, other "
        "processes on its CPUs, steal, memory pressure, a shaped NIC), gpu (its GPU)."))
    culprit: Culprit | None = Field(None, description="That culprit and its name, as every tool names one.")
