"""Rounds of node groups outside SLURM: one agent per node, the coordinator on the first node.

Every node runs the same command (collective_bench --pattern pairwise --hosts h1,h2,... --node-rank K
--rdzv-endpoint h1:PORT). Node 0's tool is the coordinator: it hosts a key-value store (torch's
TCPStore) at rdzv_endpoint, publishes each round's groups and collects what every node saw, under the
round's deadline. Every node (node 0 too, in a thread) is an agent: it waits for the round's plan, runs
torchrun for its group (c10d rendezvous on the group's first host, port + 1 + round) and writes its
outcome. A node that does not report in time counts as hung for its group. The plan and outcomes are
data (JSON of node indices, statuses and figures): nothing read from the store is run.

Trust: the store listens on the endpoint's address only, and every value is signed with a per-run
secret each node gets in its environment (MLENG_COORD_SECRET); an unsigned or malformed value is
refused and counted (review 2026-12-01-security F3: 6/6 forged pair results had named a healthy node).
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import json
import os
import socket
import threading
import time

from ..engine.data import PACKAGE
from ..engine.processes import torchrun_command
from ..engine.spec import ToolFailure
from ..shared.culprits import diagnose
from ..shared.launch import launch_ranks
from .node_groups import GroupRun, figures_of

_WORST = {"ok": 0, "fail": 1, "hang": 2}
SECRET_ENV = "MLENG_COORD_SECRET"
MIN_SECRET_CHARS = 16


def run_secret(env: dict | None = None) -> bytes:
    """The per-run secret every node was given (the same value on each): it signs every message."""
    value = (os.environ if env is None else env).get(SECRET_ENV, "")
    if len(value) < MIN_SECRET_CHARS:
        raise ToolFailure(
            f"{SECRET_ENV}: outside SLURM every node needs the same per-run secret of at least {MIN_SECRET_CHARS} "
            f"characters in its environment (got {len(value)}); the coordinator refuses messages not signed with it. "
            f"Make one per run, e.g. export {SECRET_ENV}=$(python3 -c 'import secrets; print(secrets.token_hex(16))'), "
            "and hand it to every node the way you start them (never on a command line others can read)")
    return value.encode()


def _listening_socket(host: str, port: int) -> socket.socket:
    """A socket listening on the given address only (TCPStore's own master listens on every interface)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise ToolFailure(f"rdzv_endpoint: cannot listen on {host}:{port} ({e.strerror}): give this node's own "
                          "address and a free port") from None
    sock.listen(128)
    return sock


class SignedStore:
    """The coordinator's key-value store with every value signed (HMAC-SHA256 over key and value with the
    run's secret): anyone who reaches the port can write, but nothing unsigned is believed. A refused
    value is counted, never raised: a forger must not be able to end the run either."""

    def __init__(self, store, secret: bytes, listener: socket.socket | None = None):
        self.store, self._secret, self._listener, self.refused = store, secret, listener, 0

    def _mac(self, key: str, payload: str) -> str:
        return hmac.new(self._secret, f"{key}\0{payload}".encode(), hashlib.sha256).hexdigest()

    def set(self, key: str, value: dict) -> None:
        payload = json.dumps(value)
        self.store.set(key, json.dumps({"data": payload, "mac": self._mac(key, payload)}))

    def check(self, key: str) -> bool:
        return self.store.check([key])

    def get(self, key: str) -> dict | None:
        """The value under `key` when it is signed with the run's secret and is a JSON object; else None."""
        try:
            outer = json.loads(self.store.get(key))
            payload, mac = outer["data"], outer["mac"]
            if isinstance(payload, str) and isinstance(mac, str) and hmac.compare_digest(mac, self._mac(key, payload)):
                value = json.loads(payload)
                if isinstance(value, dict):
                    return value
        except (ValueError, TypeError, KeyError, RecursionError):
            pass
        self.refused += 1
        return None


def open_store(endpoint: str, coordinator: bool, timeout_s: float, secret: bytes) -> SignedStore:
    """The shared store: hosted by the coordinator on the endpoint's address only, joined by the others
    (who retry until it is up); every value signed with the run's secret."""
    from torch.distributed import TCPStore

    host, _, port = endpoint.rpartition(":")
    host = host.strip("[]")
    listener = _listening_socket(host, int(port)) if coordinator else None
    store = TCPStore(host, int(port), is_master=coordinator, timeout=datetime.timedelta(seconds=timeout_s),
                     wait_for_workers=False, master_listen_fd=listener.fileno() if listener else None)
    return SignedStore(store, secret, listener)


def _wait(store, key: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if store.check(key):
                return True
        except (RuntimeError, OSError):  # the coordinator went away
            return False
        time.sleep(0.2)
    return False


MAX_ROUNDS = 10_000  # more than any planner asks for (bisect of 8192 nodes: under 60; pairwise: 8191 + confirmations)


def _read_plan(store: SignedStore, key: str, n: int, wait_s: float) -> dict | None:
    """A signed plan whose groups are disjoint lists of node indices (polling past unsigned values)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            plan = store.get(key)
        except (RuntimeError, OSError):  # the coordinator went away
            return None
        if plan is not None and (plan.get("done") is True or _valid_groups(plan.get("groups"), n)):
            return plan
        time.sleep(0.2)
    return None


def _valid_groups(groups, n: int) -> bool:
    if not isinstance(groups, list) or not all(isinstance(g, list) and len(g) >= 2 for g in groups):
        return False
    flat = [m for g in groups for m in g]
    return all(type(m) is int and 0 <= m < n for m in flat) and len(flat) == len(set(flat))


def _valid_report(report: dict | None) -> dict | None:
    """A node's signed report when its fields have the expected types; None otherwise."""
    if report is None or report.get("status") not in ("ok", "fail", "hang", "rest"):
        return None
    rows = report.get("rows", [])
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        return None
    if not isinstance(report.get("setup", {}), dict) or not isinstance(report.get("detail", ""), str) or not isinstance(report.get("wall_s", 0.0), (int, float)):
        return None
    return report


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
    setup = next((e for e in outcome.data if e.get("kind") == "setup"), {})
    if outcome.stalled or outcome.overran:
        return {"status": "hang", "rows": rows, "detail": f"did not finish within {outcome.elapsed_s:.0f} s"}
    _, findings = diagnose(outcome, pg_timeout_s)
    if findings or outcome.returncode:
        return {"status": "fail", "rows": rows, "detail": findings[0] if findings else f"exit code {outcome.returncode}"}
    return {"status": "ok", "rows": rows, "detail": "", "setup": setup}


def agent(store, hosts: list[str], me: int, job: dict, *, nproc: int, deadline_s: float, pg_timeout_s: float,
          port: int, wait_s: float) -> int:
    """Take part in every round the coordinator plans; returns how many rounds this node ran."""
    ran = 0
    for r in range(1, MAX_ROUNDS + 1):
        if not _wait(store, f"plan/{r}", wait_s):
            return ran  # the coordinator is gone: nothing more to do
        plan = _read_plan(store, f"plan/{r}", len(hosts), wait_s)
        if plan is None or plan.get("done"):
            return ran
        group = next((g for g in plan["groups"] if me in g), None)
        if group is None:
            store.set(f"out/{r}/{me}", {"status": "rest"})
            continue
        t0 = time.monotonic()
        outcome = launch_ranks(group_command(job, hosts, group, me, nproc, port + 1 + r % 500, r),
                               0, timeout_s=pg_timeout_s, stall_s=deadline_s, deadline_s=deadline_s)
        report = local_outcome(outcome, pg_timeout_s) | {"wall_s": round(time.monotonic() - t0, 2)}
        store.set(f"out/{r}/{me}", report)
        ran += 1
    return ran


class Coordinator:
    """run_round(groups) for isolation.py, through the agents of every node."""

    def __init__(self, store, hosts: list[str], deadline_s: float):
        self.store, self.hosts, self.deadline_s, self.round = store, hosts, deadline_s, 0

    def __call__(self, groups: list[list[int]]):
        self.round += 1
        r = self.round
        self.store.set(f"plan/{r}", {"groups": groups})
        reports = self._collect(r, [m for g in groups for m in g])
        runs = []
        for group in groups:
            mine = {m: reports.get(m) for m in group}
            missing = [self.hosts[m] for m, rep in mine.items() if rep is None]
            rows = [row for rep in mine.values() if rep for row in rep.get("rows", [])]
            status = max((rep["status"] for rep in mine.values() if rep), key=lambda s: _WORST.get(s, 2), default="hang")
            if missing:
                status, detail = "hang", f"{', '.join(missing)} did not report within {self.deadline_s:.0f} s"
            elif status == "ok" and not rows:
                status, detail = "fail", "every node finished but no figures came back"
            else:
                detail = "; ".join(f"{self.hosts[m]}: {rep['detail']}" for m, rep in mine.items() if rep["detail"])
            busbw, latency = figures_of(rows) if status == "ok" else (None, None)
            wall = max((rep.get("wall_s", 0.0) for rep in mine.values() if rep), default=self.deadline_s)
            setup = next((rep["setup"] for rep in mine.values() if rep and rep.get("setup")), {})
            runs.append(GroupRun(group, status, busbw, latency, wall, detail, rows, setup))
        return runs

    def _collect(self, r: int, members: list[int]) -> dict[int, dict]:
        deadline = time.monotonic() + self.deadline_s + 30  # the agents' own deadline, then start-up slack
        got: dict[int, dict] = {}
        while len(got) < len(members) and time.monotonic() < deadline:
            for m in members:
                if m not in got and self.store.check(f"out/{r}/{m}"):
                    report = _valid_report(self.store.get(f"out/{r}/{m}"))
                    if report is not None:  # else keep polling: the node's own signed report may still come
                        got[m] = report
            time.sleep(0.2)
        return got

    def finish(self) -> None:
        self.store.set(f"plan/{self.round + 1}", {"done": True})


def coordinate(hosts, job, *, endpoint, nproc, deadline_s, pg_timeout_s, drive):
    """On node 0: host the store, run this node's agent in a thread, and `drive(run_round)` the rounds."""
    store = open_store(endpoint, True, deadline_s * 4 + 120, run_secret())
    port = int(endpoint.rpartition(":")[2])
    worker = threading.Thread(target=agent, args=(store, hosts, 0, job), daemon=True,
                              kwargs=dict(nproc=nproc, deadline_s=deadline_s, pg_timeout_s=pg_timeout_s,
                                          port=port, wait_s=deadline_s * 4 + 120))
    worker.start()
    coordinator = Coordinator(store, hosts, deadline_s)
    try:
        report = drive(coordinator)
        report.refused_messages = store.refused
        return report
    finally:
        coordinator.finish()
        worker.join(timeout=deadline_s + 30)
        time.sleep(1.0)  # let the other agents read "done" before the store goes away
