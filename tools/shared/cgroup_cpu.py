"""A process's CPU cgroup and the quota that limits it (cgroup v1 cpu controller or v2 unified), read from /proc
and /sys/fs/cgroup: straggler_find names the quota that throttles a rank, fleet_sweep the one that bound its CPU
probe. Every reader returns None where the kernel offers no such file; nothing here writes.
"""

import time
from pathlib import Path
from typing import NamedTuple


def _read(path: str | Path) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def cgroup_lines(pid: int | str) -> list[tuple[str, str]]:
    """(controllers, path) for each line of /proc/PID/cgroup: "cpu,cpuacct" on a v1 line, "" on v2's unified one;
    [] once the process is gone. The one reader of that file (shared/process_origin.py reads whose a process is
    from it)."""
    lines = []
    for line in (_read(f"/proc/{pid}/cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            lines.append((parts[1], parts[2]))
    return lines


def cpu_cgroup_stat(pid: int) -> tuple[str, Path | None]:
    """(the cpu cgroup path, its cpu.stat file) for cgroup v1 (cpu controller) or v2 (unified)."""
    for names, path in cgroup_lines(pid):
        controllers = names.split(",")
        roots = ([f"/sys/fs/cgroup/{names}", "/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu"] if "cpu" in controllers
                 else ["/sys/fs/cgroup"] if names == "" else [])
        for root in roots:
            stat = Path(root + path) / "cpu.stat"
            if stat.is_file():
                return path, stat
    return "", None


def cpu_stat_chain(pid: int) -> list[tuple[str, Path]]:
    """(cgroup, its cpu.stat) for the process's cpu cgroup and each cgroup above it, its own first, the root ("/")
    last: a quota set on a parent (a SLURM node's or a container's cgroup, with the step in a child) throttles it."""
    path, stat = cpu_cgroup_stat(pid)
    if stat is None:
        return []
    parts = [p for p in path.split("/") if p]
    return [("/" + "/".join(parts[:depth]), stat.parents[len(parts) - depth] / "cpu.stat")
            for depth in range(len(parts), -1, -1)]


class CpuLimit(NamedTuple):
    """The tightest CPU quota over a process."""
    cpus: float                     # CPUs it allows: quota / period
    cgroup: str                     # the cgroup it is set on: "/mln/mln3"
    values: str                     # "cpu.cfs_quota_us 25000 / cpu.cfs_period_us 100000", "cpu.max 25000 100000"
    written_s_ago: float | None     # since the quota file was last written (its mtime: cgroupfs sets it on each
                                    # write, checked on this machine's v1 cpu controller); None if unreadable


def quota(folder: Path) -> tuple[float, str] | None:
    """(CPUs allowed, the files' values) of one cpu cgroup's own quota; None when it sets none."""
    found = _quota_file(folder)
    return found[:2] if found else None


def _quota_file(folder: Path) -> tuple[float, str, Path] | None:
    text = (_read(folder / "cpu.max") or "").split()                # cgroup v2: "25000 100000" or "max 100000"
    if len(text) == 2 and text[0].isdigit() and text[1].isdigit() and int(text[1]) > 0:
        return int(text[0]) / int(text[1]), f"cpu.max {text[0]} {text[1]}", folder / "cpu.max"
    quota_us = (_read(folder / "cpu.cfs_quota_us") or "").strip()
    period_us = (_read(folder / "cpu.cfs_period_us") or "").strip()
    if quota_us.isdigit() and period_us.isdigit() and int(period_us) > 0:   # v1: -1 (no limit) is not digits
        return (int(quota_us) / int(period_us), f"cpu.cfs_quota_us {quota_us} / cpu.cfs_period_us {period_us}",
                folder / "cpu.cfs_quota_us")
    return None


def cpu_limit(pid: int) -> CpuLimit | None:
    """The tightest CPU quota on the process's cpu cgroup or any above it; None: none. A quota set above the rank
    (a node's or a job's cgroup) throttles it as surely as its own."""
    best = None
    for name, stat in cpu_stat_chain(pid):          # its cgroup, each one above, the root
        found = _quota_file(stat.parent)
        if found and (best is None or found[0] < best.cpus):
            try:
                written = max(0.0, time.time() - found[2].stat().st_mtime)
            except OSError:
                written = None
            best = CpuLimit(round(found[0], 3), name, found[1], written)
    return best
