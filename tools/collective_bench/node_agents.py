"""Rounds of node groups outside SLURM: one agent per node, the coordinator on the first node.

Every node runs the same command (collective_bench --pattern pairwise --hosts h1,h2,... --node-rank K
--rdzv-endpoint h1:PORT). Node 0's tool is the coordinator: it hosts a key-value store (torch's
TCPStore) at rdzv_endpoint, publishes each round's groups and collects what every node saw, under the
round's deadline. Every node (node 0 too, in a thread) is an agent: it waits for the round's plan, runs
torchrun for its group (c10d rendezvous on the group's first host, port + 1 + round) and writes its
outcome. A node that does not report in time counts as hung for its group. The plan and outcomes are
data (JSON of node indices, statuses and figures): nothing read from the store is run.
"""

from __future__ import annotations

import datetime
import json
import threading
import time

from ..engine.data import PACKAGE
from ..engine.processes import torchrun_command
from ..shared.culprits import diagnose
from ..shared.launch import launch_ranks
from .node_groups import GroupRun, figures_of

_WORST = {"ok": 0, "fail": 1, "hang": 2}


def open_store(endpoint: str, coordinator: bool, timeout_s: float):
    """The shared store: hosted by the coordinator, joined by the others (who retry until it is up)."""
    from torch.distributed import TCPStore

    host, _, port = endpoint.rpartition(":")
    return TCPStore(host, int(port), is_master=coordinator, timeout=datetime.timedelta(seconds=timeout_s),
                    wait_for_workers=False)


def _wait(store, key: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if store.check([key]):
                return True
        except (RuntimeError, OSError):  # the coordinator went away
            return False
        time.sleep(0.2)
    return False


def group_command(job: dict, hosts: list[str], group: list[int], me: int, nproc: int, port: int, r: int):
    """torchrun for this node's share of one group; the group's first node hosts the rendezvous store,
    and every node names its own address (the store and MASTER_ADDR otherwise come from its hostname)."""
    cmd = torchrun_command(f"{PACKAGE}.collective_bench.rank", nproc, [json.dumps(job)], nnodes=len(group),
                           rdzv_endpoint=f"{hosts[group[0]]}:{port}", rdzv_id=f"mleng-r{r}-{group[0]}")
    at = cmd.index("-m", 3)  # the addresses are given: no guessing from a hostname that may not resolve
    return cmd[:at] + [f"--rdzv-conf=is_host={int(me == group[0])}", f"--local-addr={hosts[me]}"] + cmd[at:]


def local_outcome(outcome, pg_timeout_s: float) -> dict:
    """What this node's launcher saw of its group: status, rows (where rank 0 ran here), reason."""
    rows = [e for e in outcome.data if e.get("kind") == "row"]
    if outcome.stalled or outcome.overran:
        return {"status": "hang", "rows": rows, "detail": f"did not finish within {outcome.elapsed_s:.0f} s"}
    _, findings = diagnose(outcome, pg_timeout_s)
    if findings or outcome.returncode:
        return {"status": "fail", "rows": rows, "detail": findings[0] if findings else f"exit code {outcome.returncode}"}
    return {"status": "ok", "rows": rows, "detail": ""}


def agent(store, hosts: list[str], me: int, job: dict, *, nproc: int, deadline_s: float, pg_timeout_s: float,
          port: int, wait_s: float) -> int:
    """Take part in every round the coordinator plans; returns how many rounds this node ran."""
    ran = 0
    for r in range(1, 100_000):
        if not _wait(store, f"plan/{r}", wait_s):
            return ran  # the coordinator is gone: nothing more to do
        plan = json.loads(store.get(f"plan/{r}"))
        if plan.get("done"):
            return ran
        group = next((g for g in plan["groups"] if me in g), None)
        if group is None:
            store.set(f"out/{r}/{me}", json.dumps({"status": "rest"}))
            continue
        t0 = time.monotonic()
        outcome = launch_ranks(group_command(job, hosts, group, me, nproc, port + 1 + r % 500, r),
                               0, timeout_s=pg_timeout_s, stall_s=deadline_s, deadline_s=deadline_s)
        report = local_outcome(outcome, pg_timeout_s) | {"wall_s": round(time.monotonic() - t0, 2)}
        store.set(f"out/{r}/{me}", json.dumps(report))
        ran += 1
    return ran


class Coordinator:
    """run_round(groups) for isolation.py, through the agents of every node."""

    def __init__(self, store, hosts: list[str], deadline_s: float):
        self.store, self.hosts, self.deadline_s, self.round = store, hosts, deadline_s, 0

    def __call__(self, groups: list[list[int]]):
        self.round += 1
        r = self.round
        self.store.set(f"plan/{r}", json.dumps({"groups": groups}))
        reports = self._collect(r, [m for g in groups for m in g])
        runs = []
        for group in groups:
            mine = {m: reports.get(m) for m in group}
            missing = [self.hosts[m] for m, rep in mine.items() if rep is None]
            rows = [row for rep in mine.values() if rep for row in rep.get("rows", [])]
            status = max((rep["status"] for rep in mine.values() if rep), key=_WORST.get, default="hang")
            if missing:
                status, detail = "hang", f"{', '.join(missing)} did not report within {self.deadline_s:.0f} s"
            elif status == "ok" and not rows:
                status, detail = "fail", "every node finished but no figures came back"
            else:
                detail = "; ".join(f"{self.hosts[m]}: {rep['detail']}" for m, rep in mine.items() if rep["detail"])
            busbw, latency = figures_of(rows) if status == "ok" else (None, None)
            wall = max((rep.get("wall_s", 0.0) for rep in mine.values() if rep), default=self.deadline_s)
            runs.append(GroupRun(group, status, busbw, latency, wall, detail, rows))
        return runs

    def _collect(self, r: int, members: list[int]) -> dict[int, dict]:
        deadline = time.monotonic() + self.deadline_s + 30  # the agents' own deadline, then start-up slack
        got: dict[int, dict] = {}
        while len(got) < len(members) and time.monotonic() < deadline:
            for m in members:
                if m not in got and self.store.check([f"out/{r}/{m}"]):
                    got[m] = json.loads(self.store.get(f"out/{r}/{m}"))
            time.sleep(0.2)
        return got

    def finish(self) -> None:
        self.store.set(f"plan/{self.round + 1}", json.dumps({"done": True}))


def coordinate(hosts, job, *, endpoint, nproc, deadline_s, pg_timeout_s, drive):
    """On node 0: host the store, run this node's agent in a thread, and `drive(run_round)` the rounds."""
    store = open_store(endpoint, True, deadline_s * 4 + 120)
    port = int(endpoint.rpartition(":")[2])
    worker = threading.Thread(target=agent, args=(store, hosts, 0, job), daemon=True,
                              kwargs=dict(nproc=nproc, deadline_s=deadline_s, pg_timeout_s=pg_timeout_s,
                                          port=port, wait_s=deadline_s * 4 + 120))
    worker.start()
    coordinator = Coordinator(store, hosts, deadline_s)
    try:
        return drive(coordinator)
    finally:
        coordinator.finish()
        worker.join(timeout=deadline_s + 30)
        time.sleep(1.0)  # let the other agents read "done" before the store goes away
