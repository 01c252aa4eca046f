"""Who holds a GPU's memory, said as it is: a process of yours that started before this question (probably
your own job, running), another user's process, a zombie whose memory the driver still holds, or a pid this
machine cannot see (another container's namespace). Nothing is called stale or leftover on a guess.
"""

import os
import time

from ..engine.spec import Field, Record
from ..shared.actions import HealthFinding


class MemoryHolder(Record):
    pid: int = Field(description="Process id holding memory on the GPU.")
    name: str = Field("?", description="Process name, '?' when not visible here.")
    user: str | None = Field(None, description="Owner, None when not visible.")
    mine: bool | None = Field(None, description="Owned by the user running gpu_health.")
    age_s: float | None = Field(None, description="Seconds since the process started.")
    state: str = Field("", description="psutil status: running, sleeping, zombie ...; 'not visible' when the pid is not in this namespace.")
    used_mib: float | None = Field(None, description="GPU memory it holds, MiB.")


def describe(pid: int, used_bytes: int | None, now: float | None = None) -> MemoryHolder:
    import psutil

    h = MemoryHolder(pid=pid, used_mib=round(used_bytes / 2**20, 1) if used_bytes else None)
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            h.name, h.user, h.state = p.name(), p.username(), p.status()
            h.age_s = round((now or time.time()) - p.create_time(), 1)
            h.mine = p.uids().real == os.getuid()
    except psutil.NoSuchProcess:
        h.state = "not visible"
    except psutil.AccessDenied:
        h.state = h.state or "access denied"
    return h


def _age(s: float | None) -> str:
    if s is None:
        return "an unknown time"
    return f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.0f} min" if s >= 60 else f"{s:.0f} s"


def judge(gpu: str, h: MemoryHolder) -> HealthFinding:
    mem = f"{h.used_mib:.0f} MiB" if h.used_mib else "memory"
    if h.state == "zombie":
        return HealthFinding(text=f"pid {h.pid} ({h.name}) has exited (zombie) but the driver still holds its {mem}: "
                             "its parent must reap it, or reset the GPU once nothing else runs on it",
                             action="reset_gpu", subject=gpu, code="zombie_holder", source="nvml+procfs")
    if h.state == "not visible":
        return HealthFinding(text=f"pid {h.pid} holds {mem} but is not visible from here (another container or "
                             "pid namespace): ask on the host which job it belongs to", action="none", subject=gpu,
                             code="hidden_holder", source="nvml")
    if h.mine is False:
        return HealthFinding(text=f"{h.user}'s process {h.pid} ({h.name}) holds {mem}, running for {_age(h.age_s)}: "
                             "another user's job shares this GPU (memory and time are not yours alone)",
                             action="none", subject=gpu, code="other_user_holder", source="nvml+procfs")
    return HealthFinding(text=f"your process {h.pid} ({h.name}, {h.state or 'state unknown'}) holds {mem}, started "
                         f"{_age(h.age_s)} before this check: if it is your running job that is expected; benchmarks "
                         "run beside it share the GPU", action="none", subject=gpu, code="own_holder",
                         source="nvml+procfs")
