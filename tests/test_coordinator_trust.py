"""The pairwise/bisect coordinator outside SLURM: bound to its address, every message signed (review F3).

A real TCPStore on loopback: the coordinator, honest agents (threads) and a forger that reaches the port
and writes pair results, as in the review (6/6 forged results had named a healthy node).
"""

from __future__ import annotations

import datetime
import json
import socket
import threading
import time

import pytest

from tools.collective_bench.node_agents import (SECRET_ENV, Coordinator, SignedStore, _read_plan, open_store,
                                                run_secret)
from tools.engine.spec import ToolFailure

SECRET = b"a-per-run-secret-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def raw_client(port: int):
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=10))


def rows(busbw: float) -> list[dict]:
    return [{"op": "all_reduce", "bytes": 1 << 20, "busbw_gbps": busbw, "time_us": 50.0}]


def test_the_store_listens_only_on_the_address_it_was_given():
    port = free_port()
    store = open_store(f"127.0.0.1:{port}", True, 10, SECRET)
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        pass
    with pytest.raises(ConnectionRefusedError):  # another loopback address: all interfaces would accept it
        socket.create_connection(("127.0.0.2", port), timeout=2)
    del store


def test_forged_pair_results_are_refused_and_the_signed_ones_counted():
    port = free_port()
    coordinator_store = open_store(f"127.0.0.1:{port}", True, 30, SECRET)
    agent_store = open_store(f"127.0.0.1:{port}", False, 30, SECRET)
    forger = raw_client(port)
    wrong_key = SignedStore(raw_client(port), b"guessed-secret-000000000000")
    hosts = ["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"]

    def forge_then_answer():
        while not forger.check(["plan/1"]):
            time.sleep(0.05)
        for m in range(4):  # the review's forgery: node 1 slow with everyone, 90 GB/s elsewhere
            forged = {"status": "ok", "rows": rows(0.5 if m == 1 else 90.0), "detail": "", "wall_s": 1.0}
            forger.set(f"out/1/{m}", json.dumps(forged))
        wrong_key.set("out/1/2", {"status": "weird"})  # once ended a run with a TypeError
        time.sleep(0.6)  # the coordinator reads the forgeries first
        for m in range(4):
            agent_store.set(f"out/1/{m}", {"status": "ok", "rows": rows(1.0), "detail": "", "wall_s": 1.0})

    thread = threading.Thread(target=forge_then_answer)
    thread.start()
    runs = Coordinator(coordinator_store, hosts, deadline_s=10)([[0, 1], [2, 3]])
    thread.join()
    assert [(r.status, r.busbw_gbps) for r in runs] == [("ok", 1.0), ("ok", 1.0)]
    assert coordinator_store.refused >= 4


def test_agents_ignore_an_unsigned_plan():
    port = free_port()
    coordinator_store = open_store(f"127.0.0.1:{port}", True, 30, SECRET)
    agent_store = open_store(f"127.0.0.1:{port}", False, 30, SECRET)
    raw_client(port).set("plan/1", json.dumps({"groups": [[0, 3]]}))
    threading.Timer(0.5, coordinator_store.set, args=("plan/1", {"groups": [[0, 1]]})).start()
    assert _read_plan(agent_store, "plan/1", 4, wait_s=5)["groups"] == [[0, 1]]
    assert agent_store.refused >= 1


def test_no_secret_in_the_environment_is_refused_naming_the_variable():
    with pytest.raises(ToolFailure, match=SECRET_ENV):
        run_secret({})
    with pytest.raises(ToolFailure, match="at least 16"):
        run_secret({SECRET_ENV: "short"})
    assert run_secret({SECRET_ENV: SECRET.decode()}) == SECRET


def test_the_tool_refuses_hosts_without_the_secret(monkeypatch):
    from tools.collective_bench import CollectiveBenchParams, run

    monkeypatch.delenv(SECRET_ENV, raising=False)
    params = CollectiveBenchParams(pattern="pairwise", hosts=["127.0.0.1", "127.0.0.2"], node_rank=0,
                                   rdzv_endpoint=f"127.0.0.1:{free_port()}", backend="gloo", nproc_per_node=1,
                                   plot=False)
    with pytest.raises(ToolFailure, match=SECRET_ENV):
        run(params, lambda *a: None)
