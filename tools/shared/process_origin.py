"""Whose another process is, as the kernel records it: the cgroup it runs in (a SLURM job, a Kubernetes pod, a
container, a systemd service or login session) and how long ago it started.

fleet_sweep names the processes that kept a CPU or GPU busy while it measured, straggler_find those queued on a
rank's CPUs; in three model rounds (6, 9, 10) the agent then asked which job such a pid belongs to and since when,
and no tool could say. The cgroup is chosen by what started the process (slurmstepd, the container runtime,
systemd), not by the process's own words; a SLURM job is read only from the trees slurmstepd creates, which a user
cannot make folders in. It is still another user's text: shown, bounded and escaped, never judged.
"""

from __future__ import annotations

import re
import time

from ..engine.printable import printable
from .cgroup_cpu import CpuLimit, cgroup_lines

SHOWN_PATH_CHARS = 80        # a cgroup path with no known owner is shown by its last part, this long at most

# slurmstepd's cgroup trees, from the root (a user may name folders anything below a subtree delegated to them):
# v2 "/system.slice/slurmstepd.scope/job_123/step_0/user/task_0" ("NODE_slurmstepd.scope" with several slurmd on a
# host), v1 "/slurm/uid_1000/job_123/step_0/task_0" (https://slurm.schedmd.com/cgroup_v2.html, cgroups.html)
SLURM_JOB = re.compile(r"^(?:(?:/system\.slice)?/(?:[\w.-]{1,64}_)?slurmstepd\.scope|/slurm(?:_[\w.-]{1,64})?/uid_\d{1,10})"
                       r"/job_(\d{1,12})(?:/|$)")
K8S_POD = re.compile(r"^/kubepods\.slice/(?:kubepods-[a-z]{1,16}\.slice/)?kubepods-(?:[a-z]{1,16}-)?pod([0-9a-f_]{8,40})\.slice"
                     r"|^/kubepods/(?:[a-z]{1,16}/)?pod([0-9a-f-]{8,40})(?:/|$)")
CONTAINER = re.compile(r"(?:docker|cri-containerd|crio|libpod)-([0-9a-f]{12})[0-9a-f]{0,52}\.scope"
                       r"|/(?:docker|lxc)/([0-9a-f]{12})[0-9a-f]{0,52}(?:/|$)")
SESSION = re.compile(r"/user-(\d{1,10})\.slice/session-([\w]{1,16})\.scope")
SERVICE = re.compile(r"/([\w@.-]{1,64}\.service)(?:/|$)")


def cgroup_paths(pid: int | str) -> list[str]:
    """The process's cgroups, the unified (v2) one first, then v1's cpu controller's, then the other controllers'
    (SLURM's v1 plugins may place a job in a few controllers only); [] once the process is gone."""
    ranked = sorted(cgroup_lines(pid), key=lambda line: 0 if line[0] == "" else 1 if "cpu" in line[0].split(",") else 2)
    return list(dict.fromkeys(path for _, path in ranked))


def owner_of_cgroups(paths: list[str]) -> str:
    """'SLURM job 123', 'Kubernetes pod 1a2b3c4d-5e6f', 'container 0123456789ab', 'login session 4 of uid 1000',
    'systemd service cron.service' (the first any path shows, in that order), or 'cgroup /its/path' (the first
    below the root)."""
    for pattern, words in ((SLURM_JOB, "SLURM job {}"), (K8S_POD, "Kubernetes pod {}"), (CONTAINER, "container {}"),
                           (SESSION, "login session {1} of uid {0}"), (SERVICE, "systemd service {}")):
        for path in paths:
            if m := pattern.search(path):
                found = [g for g in m.groups() if g]
                if pattern is K8S_POD:
                    found = [found[0].replace("_", "-")[:13]]
                return words.format(*found)
    path = next((p for p in paths if p != "/"), "/")        # v1 hosts list "0::/" beside their real cgroups
    shown = path if len(path) <= SHOWN_PATH_CHARS else "/…" + path[-(SHOWN_PATH_CHARS - 2):]
    return f"cgroup {printable(shown, newlines=False)}"


def started_s_ago(pid: int) -> float | None:
    """Seconds since the process started (the kernel's start time, through psutil); None once it is gone."""
    import psutil

    try:
        return max(0.0, time.time() - psutil.Process(pid).create_time())
    except (psutil.Error, OSError):
        return None


def age_words(seconds: float) -> str:
    """'40 s', '12 min', '3 h 5 min', '2 d 4 h'."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def origin(pid: int) -> str | None:
    """'SLURM job 123, started 3 h 5 min ago': whose the process is and since when; None once it is gone."""
    paths = cgroup_paths(pid)
    age = started_s_ago(pid)
    parts = [owner_of_cgroups(paths)] if paths else []
    if age is not None:
        parts.append(f"started {age_words(age)} ago")
    return ", ".join(parts) or None


def limit_words(limit: CpuLimit) -> str:
    """Where a CPU quota is set, whose that cgroup is when it shows, its values and when they were written:
    '/slurm/uid_0/job_12 (SLURM job 12): cpu.cfs_quota_us 5000 / cpu.cfs_period_us 100000, written 3 min ago'.
    Asked in model rounds 9 and 10: who set the quota, and since when."""
    owner = owner_of_cgroups([limit.cgroup])
    whose = "" if owner.startswith("cgroup ") else f" ({owner})"
    when = f", written {age_words(limit.written_s_ago)} ago" if limit.written_s_ago is not None else ""
    return f"{printable(limit.cgroup, newlines=False)}{whose}: {limit.values}{when}"
