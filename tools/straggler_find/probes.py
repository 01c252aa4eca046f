"""Host counters a node's sampler reads at the start and end of the window (Linux /proc and /sys).

Each reader returns None (or empty) where the kernel does not offer the file: a missing counter is
said, never guessed. Nothing here writes anything or changes the job.
"""

import os
import pwd
import re
from collections import Counter
from pathlib import Path

from ..engine.printable import printable
from ..shared.cgroup_cpu import cpu_cgroup_stat
from ..shared.process_origin import origin
from ..shared.process_targets import cpu_seconds
from ..shared.tc import SHAPING_KINDS, tc_output


def read(path: str | Path) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def runqueue_wait_s(pid: int) -> float | None:
    """Seconds the process's threads waited on a run queue (schedstat field 2, ns), summed over threads."""
    total, seen = 0, False
    for task in Path(f"/proc/{pid}/task").glob("*"):
        text = read(task / "schedstat")
        if text and len(text.split()) >= 2:
            total += int(text.split()[1])
            seen = True
    return total / 1e9 if seen else None


def throttle_counts(stat: Path | None) -> tuple[int, int] | None:
    """(CFS periods, periods throttled) so far."""
    text = read(stat) if stat else None
    if not text:
        return None
    values = dict(line.split()[:2] for line in text.splitlines() if len(line.split()) >= 2)
    if "nr_periods" not in values:
        return None
    return int(values["nr_periods"]), int(values.get("nr_throttled", 0))


def cpu_times() -> list[int] | None:
    """The aggregate `cpu` line of /proc/stat (user nice system idle iowait irq softirq steal ...)."""
    text = read("/proc/stat") or ""
    first = text.splitlines()[0].split() if text else []
    return [int(x) for x in first[1:]] if first and first[0] == "cpu" else None


def psi_some_avg10(resource: str) -> float | None:
    text = read(f"/proc/pressure/{resource}")
    m = re.search(r"^some avg10=([\d.]+)", text or "", re.M)
    return float(m.group(1)) if m else None


def mem_available_fraction() -> float | None:
    text = read("/proc/meminfo") or ""
    values = {k: int(v.split()[0]) for k, v in re.findall(r"^(\w+):\s+(\d+ ?\w*)", text, re.M)}
    if values.get("MemTotal") and "MemAvailable" in values:
        return round(values["MemAvailable"] / values["MemTotal"], 3)
    return None


def tcp_retrans() -> int | None:
    """TCP RetransSegs of this network namespace."""
    lines = [line.split() for line in (read("/proc/net/snmp") or "").splitlines() if line.startswith("Tcp:")]
    if len(lines) == 2 and "RetransSegs" in lines[0]:
        return int(lines[1][lines[0].index("RetransSegs")])
    return None


def tx_bytes() -> int | None:
    """Bytes sent on every interface but loopback."""
    total, seen = 0, False
    for line in (read("/proc/net/dev") or "").splitlines()[2:]:
        name, _, rest = line.partition(":")
        if name.strip() and name.strip() != "lo" and len(rest.split()) >= 9:
            total += int(rest.split()[8])
            seen = True
    return total if seen else None


QDISC = re.compile(r"qdisc (\S+) \S+ (?:dev (\S+) )?[^\n]{0,300}?\n\s*Sent \d+ bytes \d+ pkt \(dropped (\d+), overlimits (\d+)", re.S)


def qdisc_counters() -> dict[str, tuple[str, int, int]]:
    """Per interface with a shaping qdisc: (kind, drops, overlimits) so far, from `tc -s qdisc show`."""
    found = {}
    for block in re.split(r"\n(?=qdisc )", tc_output("-s", "qdisc", "show")):
        m = QDISC.search(block)
        if m and m.group(1) in SHAPING_KINDS and m.group(2) and m.group(2) != "lo":
            kind, dev, drops, over = m.groups()
            found[f"{dev}:{kind}"] = (kind, int(drops), int(over))
    return found


def snapshot_node() -> dict:
    return {"cpu": cpu_times(), "retrans": tcp_retrans(), "tx": tx_bytes(), "qdisc": qdisc_counters()}


def snapshot_rank(pid: int) -> dict:
    path, stat = cpu_cgroup_stat(pid)
    return {"cpu_s": cpu_seconds(pid), "runq_s": runqueue_wait_s(pid), "cgroup": path,
            "stat": str(stat) if stat else "", "throttle": throttle_counts(stat)}


def cpus_allowed(pid: int) -> frozenset[int] | None:
    """The CPUs the kernel lets the process run on (its affinity: taskset, cpuset)."""
    try:
        return frozenset(os.sched_getaffinity(pid))
    except OSError:
        return None


def owner(pid: int) -> str:
    """The user a process runs as (the kernel's record: /proc/PID's owner), or its uid; '?' once it is gone."""
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return "?"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def runnable_tasks() -> list[tuple[int, int, int, str]]:
    """Every runnable thread on this node, as (process id, parent process id, CPU it is queued on, command)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            tasks = list((proc / "task").iterdir())
        except OSError:
            continue
        for task in tasks:
            text = read(task / "stat") or ""
            head, _, tail = text.rpartition(")")
            fields = tail.split()
            # fields[0] is the state (field 3 of stat), fields[1] the parent, fields[36] the CPU last run on
            if len(fields) > 36 and fields[0] == "R":
                found.append((int(proc.name), int(fields[1]), int(fields[36]), head.partition("(")[2]))
    return found


class RunnableWatch:
    """Other processes with a runnable thread on each rank's CPUs, counted every `interval_s` while the window runs.

    A rank that shares its CPUs with busy processes waits on the run queue: the count says how many it waits
    behind, `competitors` who (pid, name, owner, from the same scans). The job's ranks and their children
    (dataloader workers) are counted apart; not counted: this sampler and its py-spy children (by name: a
    sampler run in-process, by hand, may have other children that do count). One scan of /proc costs ~1 ms per
    100 threads, so it runs a few times a window.
    """

    def __init__(self, pids: list[int], interval_s: float):
        import threading

        self.job = set(pids)
        self.ours = os.getpid()
        self.allowed = {p: cpus_allowed(p) for p in pids}
        self.counts: dict[int, list[int]] = {p: [] for p in pids}
        self.job_counts: dict[int, list[int]] = {p: [] for p in pids}
        self.seen: dict[int, Counter] = {p: Counter() for p in pids}     # other pid -> scans it was runnable in
        self.who: dict[int, tuple[str, str, str | None]] = {}             # other pid -> (name, owner, origin), at first sight
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "RunnableWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.scan()

    def scan(self) -> None:
        tasks = runnable_tasks()
        others = [(tgid, cpu, command) for tgid, ppid, cpu, command in tasks
                  if not ({tgid, ppid} & self.job) and tgid != self.ours and not (ppid == self.ours and command == "py-spy")]
        job = [(tgid, cpu) for tgid, ppid, cpu, _ in tasks if {tgid, ppid} & self.job]
        for pid, cpus in self.allowed.items():
            if cpus is not None:
                here = {tgid: command for tgid, cpu, command in others if cpu in cpus}
                self.counts[pid].append(len(here))
                self.job_counts[pid].append(len({tgid for tgid, cpu in job if cpu in cpus and tgid != pid}))
                self.seen[pid].update(here.keys())
                for tgid, command in here.items():
                    if tgid not in self.who:        # read once: a busy neighbour is seen in most scans
                        self.who[tgid] = (command, owner(tgid), origin(tgid))

    def others_runnable(self, pid: int) -> float | None:
        """Mean count of other runnable processes on the rank's CPUs over the scans; None without a scan."""
        seen = self.counts.get(pid) or []
        return round(sum(seen) / len(seen), 1) if seen else None

    def job_runnable(self, pid: int) -> float | None:
        """Mean count of the job's own other processes runnable on the rank's CPUs; None without a scan."""
        seen = self.job_counts.get(pid) or []
        return round(sum(seen) / len(seen), 1) if seen else None

    def competitors(self, pid: int, most: int = 3) -> list[str]:
        """The other processes most often runnable on the rank's CPUs: 'pid 4242 (name) user nobody, runnable in 9 of
        10 scans; SLURM job 12, started 2 h ago'. The name is what the process set for itself (comm): escaped and cut,
        never trusted; whose it is comes from its cgroup (shared/process_origin.py)."""
        scans = len(self.counts.get(pid) or [])
        out = []
        for tgid, n in self.seen.get(pid, Counter()).most_common(most):
            name, user, whose = self.who.get(tgid, ("?", "?", None))
            out.append(f"pid {tgid} ({printable(name[:32], newlines=False)}) user {user}, runnable in {n} of {scans} scans"
                       + (f"; {whose}" if whose else ""))
        return out

    def cpus(self, pid: int) -> str:
        """The rank's CPUs as a list of ranges: '1', '0-15', '0-3,8-11'."""
        ranges: list[list[int]] = []
        for cpu in sorted(self.allowed.get(pid) or ()):
            if ranges and cpu == ranges[-1][1] + 1:
                ranges[-1][1] = cpu
            else:
                ranges.append([cpu, cpu])
        return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in ranges)
