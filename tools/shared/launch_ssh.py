"""Ranks started over SSH, with no SLURM: one torchrun per host through the engine's node transport
(engine/transport.py), the c10d rendezvous on the first host, followed as launch.py follows srun's, into
the same LaunchOutcome (so culprits.diagnose and the tools read it unchanged).

    argv = host_command("collective_bench.rank", job, nproc, hosts, address, port, run_id)
    outcome = launch_ranks_ssh(hosts, argv, len(hosts) * nproc, deadline_s=120, stall_s=120)

Identity: a rank's events are credited to the host whose connection they came on (the event's `host` is
set from the transport, never from what the rank says), and a rank number that a second connection also
reports is refused there and counted. A host whose sshd does not answer ends the launch at once, named
by ssh's own words: the other hosts' ranks would only wait for it at the rendezvous. On every host the
command runs under shared/torchrun_on_host.py (which host hosts the store, a private TMPDIR).
"""

from __future__ import annotations

import collections
import json
import os
import threading
import time
from collections.abc import Callable

from . import sidechannel
from .launch import LaunchOutcome, RankState, apply_event, settle, stop_reason, torchrun_exitcodes
from .ranks import check_event
from ..engine.data import PACKAGE
from ..engine.processes import python_module_command, torchrun_command, without_secrets
from ..engine.transport import NodeEnd, SshTransport

POLL_S = 0.05
LATE_S = 10     # the transport's own cut comes this long after ours: ours says why (stalled, overran, cut)


def host_command(rank_module: str, params: dict, nproc_per_node: int, hosts: list[str], address: str, port: int,
                 run_id: str) -> list[str]:
    """The argv every host runs: torchrun for `rank_module` under torchrun_on_host, meeting at address:port
    on hosts[0] (`address`: where the other hosts reach it, SshTransport.address)."""
    torchrun = torchrun_command(f"{PACKAGE}.{rank_module}", nproc_per_node, [json.dumps(params)], nnodes=len(hosts),
                                rdzv_endpoint=f"{address}:{port}", rdzv_id=run_id)
    return python_module_command("shared.torchrun_on_host", hosts[0], "--", *torchrun)


class _Followed:
    """What the hosts' connections said, applied under one lock (ClusterShell calls in from its thread)."""

    def __init__(self, hosts: list[str], world_size: int, on_event):
        self.lock = threading.Lock()
        self.readers = {host: sidechannel.Reader(check_event) for host in hosts}
        self.ranks = {r: RankState(rank=r) for r in range(world_size)}
        self.home: dict[int, str] = {}                 # rank -> the host whose connection first reported it
        self.data: list[dict] = []
        self.refused: collections.Counter = collections.Counter()
        self.output: collections.deque = collections.deque(maxlen=40)
        self.unreachable: dict[str, str] = {}
        self.last_progress = time.monotonic()
        self.world = world_size
        self.on_event = on_event
        self.step_error = ""

    def line(self, host: str, line: str) -> None:
        event = self.readers[host].parse(line)
        if event is None:
            if sidechannel.PREFIX not in line:
                self.output.append(f"{host}: {line[:300]}")
            return
        data = event.data
        with self.lock:
            if self.home.setdefault(int(data["rank"]), host) != host:
                self.refused[f"rank {data['rank']} reported again on {host}'s connection"] += 1
                return
            data["host"] = host
            apply_event(self.ranks, data)
            self.world = max(self.world, int(data.get("world_size") or 0))
            if data["ev"] == "beat":
                return   # alive is not progress: a hung run still beats
            self.last_progress = time.monotonic()
            if data["ev"] == "data":
                self.data.append(data)
        if self.on_event:
            self.on_event(data)

    def ended(self, end: NodeEnd) -> None:
        if end.how == "unreachable":
            self.unreachable[end.node] = end.why


def launch_ranks_ssh(hosts: list[str], argv: list[str], world_size: int, *, deadline_s: float, stall_s: float,
                     on_event=None, cut: Callable[[float], str | None] | None = None,
                     transport: SshTransport | None = None) -> LaunchOutcome:
    """Run `argv` (host_command) on every host at once and follow the ranks until they finish, stall,
    overrun, `cut` says stop, or a host's sshd does not answer; then every host's part is stopped
    (remote_step kills it there when its connection closes). Arguments as launch.launch_ranks."""
    transport = transport or SshTransport(without_secrets(dict(os.environ)))
    followed = _Followed(hosts, world_size, on_event)
    ends: dict[str, NodeEnd] = {}

    def run_step() -> None:
        try:
            ends.update(transport.run_step(hosts, argv, deadline_s + LATE_S, followed.line, followed.ended))
        except Exception as exc:   # said in the outcome (no rank reported: the launcher's last words)
            followed.step_error = f"the ssh step failed: {type(exc).__name__}: {exc}"[:300]

    step = threading.Thread(target=run_step, daemon=True)
    t0 = time.monotonic()
    stalled = overran = False
    cut_reason = ""
    step.start()
    while step.is_alive():
        step.join(POLL_S)
        now = time.monotonic()
        stop, cut_reason = stop_reason(now - t0, now - followed.last_progress, stall_s=stall_s,
                                       deadline_s=deadline_s, cut=cut)
        stalled, overran = stop == "stalled", stop == "overran"
        if stop or followed.unreachable:
            break
    while step.is_alive():   # cancel() may come before the transport's task has started: asked until it ends
        transport.cancel()
        step.join(0.5)
    return _outcome(followed, ends, argv, t0, stalled, overran, cut_reason)


def _outcome(followed: _Followed, ends: dict[str, NodeEnd], argv: list[str], t0: float, stalled: bool,
             overran: bool, cut_reason: str) -> LaunchOutcome:
    unreachable = {**followed.unreachable, **{n: e.why for n, e in ends.items() if e.how == "unreachable"}}
    codes: dict[int, int] = {}
    for host, end in ends.items():   # a host's torchrun speaks only for the ranks that reported on its connection
        codes.update({r: c for r, c in torchrun_exitcodes(end.stderr_tail).items() if followed.home.get(r) == host})
    settle(followed.ranks, codes, stopped=bool(stalled or overran or cut_reason or unreachable))
    exited = [e.code for e in ends.values() if e.how == "exited" and e.code]
    overran = overran or any(e.how == "silent" for e in ends.values()) and not (stalled or cut_reason or unreachable)
    skipped = [note for host, reader in followed.readers.items() for note in reader.notes(lambda _task: host)]
    skipped += [f"{count} event(s) refused: {why}" for why, count in followed.refused.items()]
    return LaunchOutcome(command=argv, world_size=max([followed.world, *(r + 1 for r in followed.ranks)]),
                         ranks=followed.ranks, data=followed.data,
                         returncode=255 if unreachable else (exited[0] if exited else 0),
                         stalled=stalled, overran=overran, elapsed_s=round(time.monotonic() - t0, 2),
                         stderr_tail=(followed.step_error + "".join(
                             f"{n}: {e.stderr_tail}" for n, e in ends.items() if e.stderr_tail))[-4000:],
                         output_tail="\n".join(followed.output)[-2000:], launch_failures=unreachable,
                         skipped_lines=skipped, cut=cut_reason, launcher="ssh")
