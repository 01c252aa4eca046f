"""What hostile input costs the log and file readers (review 2026-12-01, F7 and F12), through the real
server as a client sends it: wall seconds per call, and whether it answered within the call's limit.

    python bench/readers_costs.py                       # this checkout
    python bench/readers_costs.py --repo /path/to/old   # another checkout (the "before" figures)
    python bench/readers_costs.py --limit-s 60 --only nccl
    python bench/readers_costs.py --store               # F14: what 3 pasted 45 MB logs store; results_history

A call still working at --limit-s is stopped by the server (its timeout_s) and shown as '> limit'.
Devices and FIFOs are timed only with --files: before the fix /dev/zero grew a child to GBs.
"""

import argparse
import os
import sys
import tempfile
import time

CASES = {   # name -> (tool, arguments); the lines the review sent
    "nccl: 'a'*60,000 + ' NCCL'": ("nccl_log_analyze", {"text": "a" * 60_000 + " NCCL"}),
    "nccl: 'a'*120,000 + ' NCCL'": ("nccl_log_analyze", {"text": "a" * 120_000 + " NCCL"}),
    "nccl: nccl-tests device line, 40,000 blanks": (
        "nccl_log_analyze", {"text": "# Rank 0 Pid 1 on h device 0 [x] a" + " " * 40_000 + "b"}),
    "nccl: NCCL_ env line, 20,000 blanks": (
        "nccl_log_analyze", {"text": "h:1:1 [0] NCCL INFO NCCL_IB_HCA set by environment to a" + " " * 20_000 + "b"}),
    "nccl: ten 100 KB lines (1 MB)": ("nccl_log_analyze", {"text": "\n".join(["x" * 100_000 + " NCCL"] * 10)}),
    "triage: Cuda failure, 120,000 blanks": (
        "log_triage", {"text": "NCCL WARN Cuda failure a" + " " * 120_000 + "b"}),
}


def file_cases(fifo: str) -> dict:
    return {"gpu_health dcgm_file=/dev/zero": ("gpu_health", {"dcgm_file": "/dev/zero", "sample_s": 0, "load": False}),
            "gpu_health dcgm_file=<FIFO>": ("gpu_health", {"dcgm_file": fifo, "sample_s": 0, "load": False}),
            "log_triage paths=[<FIFO>]": ("log_triage", {"paths": [fifo]})}


async def measure(cases: dict, limit_s: float) -> None:
    from mcp import Client

    from tools.engine.mcp_server import build_server

    async with Client(build_server()) as client:
        for name, (tool, args) in cases.items():
            t0 = time.monotonic()
            r = await client.call_tool(tool, {**args, "timeout_s": limit_s, "wait_s": limit_s + 30})
            wall = time.monotonic() - t0
            late = r.is_error and "did not finish within its timeout" in r.content[0].text
            shown = f"> {limit_s:.0f} s (stopped)" if late else f"{wall:.2f} s"
            print(f"FIGURE {name}: {shown} ({'error' if r.is_error else 'answered'})", flush=True)


async def store_costs() -> None:
    """Database size after three log_triage calls with 45 MB of pasted text, then 8 concurrent results_history
    calls on a store that also holds three 45 MB rows as an older version wrote them."""
    import sqlite3

    import anyio
    import psutil
    from mcp import Client

    from tools.engine.mcp_server import build_server
    from tools.engine.store import connect, mleng_home

    text = "[rank0]: step 1 loss 2.0 lr 3e-4\n" * 1_400_000          # ~45 MB
    async with Client(build_server()) as client:
        for i in range(3):
            r = await client.call_tool("log_triage", {"text": text, "timeout_s": 600})
            size = sum(p.stat().st_size for p in mleng_home().glob("results.sqlite3*"))
            print(f"FIGURE log_triage 45 MB text, call {i + 1}: {'error' if r.is_error else 'ok'}, database + WAL "
                  f"{size / 2**20:.1f} MiB", flush=True)
        connect().close()
        big = '{"text": "' + "x" * 45_000_000 + '"}'
        with sqlite3.connect(mleng_home() / "results.sqlite3") as db:     # as a version before the caps wrote them
            db.executemany("INSERT INTO results (tool, host, started, params, params_key, result) VALUES (?,?,?,?,?,?)",
                           [("log_triage", "n1", time.time(), big, big, big)] * 3)
            db.execute("PRAGMA user_version = 0")
        for when in ("first (the store caps the old rows once)", "again"):
            rss0, t0 = psutil.Process().memory_info().rss, time.monotonic()
            async with anyio.create_task_group() as tg:
                for _ in range(8):
                    tg.start_soon(client.call_tool, "results_history", {})
            print(f"FIGURE 8 concurrent results_history on 3 old 45 MB rows, {when}: {time.monotonic() - t0:.2f} s, "
                  f"server RSS {rss0 / 2**20:.0f} -> {psutil.Process().memory_info().rss / 2**20:.0f} MiB", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--limit-s", type=float, default=300.0, help="Each call's timeout_s, seconds.")
    ap.add_argument("--only", default="", help="Only cases whose name contains this.")
    ap.add_argument("--store", action="store_true", help="Only the results-store figures (F14).")
    ap.add_argument("--files", action="store_true", help="Also /dev/zero and a FIFO (only on a fixed checkout).")
    args = ap.parse_args()
    sys.path.insert(0, args.repo)
    os.chdir(args.repo)
    import anyio

    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("MLENG_HOME", os.path.join(tmp, "home"))
        if args.store:
            anyio.run(store_costs)
            return
        cases = dict(CASES)
        if args.files:
            os.mkfifo(os.path.join(tmp, "fifo"))
            cases.update(file_cases(os.path.join(tmp, "fifo")))
        anyio.run(measure, {k: v for k, v in cases.items() if args.only in k}, args.limit_s)


if __name__ == "__main__":
    main()
