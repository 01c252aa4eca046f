"""What the attacks of issue 16 cost, and what ordinary calls cost, with whichever `tools` is importable.

Run it once against the code before a change and once after (PYTHONPATH picks the checkout):
    PYTHONPATH=/path/to/checkout python bench/reliability_costs.py ranges      # matmul_bench range validation
    PYTHONPATH=... python bench/reliability_costs.py pickle DEPTH               # x=[x,x] flight-recorder pickle
    PYTHONPATH=... python bench/reliability_costs.py big ROWS                   # a result that grows with its input
    PYTHONPATH=... python bench/reliability_costs.py scans CALLS                # heavy log scans at once vs light calls
    PYTHONPATH=... python bench/reliability_costs.py happy [CALLS]              # ordinary calls, in-memory client
Each prints one JSON line: seconds, peak RSS of this process (MiB), and the answer's size (characters).
Run each case in its own process: peak RSS is per process.
"""

import json
import os
import pickle
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio
from mcp import Client


def _peak_rss_mib() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def ranges() -> dict:
    from tools.engine.mcp_server import _split_arguments
    from tools.engine.registry import registry

    spec = registry()["matmul_bench"]
    t0 = time.perf_counter()
    try:
        _split_arguments(spec, {"mode": "grid", "m_range": [1, 30_000_000, 1]})
        message = "accepted"
    except Exception as e:
        message = str(e)
    return {"case": "matmul m_range [1, 30000000, 1]", "seconds": round(time.perf_counter() - t0, 4),
            "peak_rss_mib": _peak_rss_mib(), "answer_chars": len(message), "answer": message[:160]}


def nested_pickle(depth: int) -> dict:
    from tools.engine.registry import registry

    x: list = []
    for _ in range(depth):
        x = [x, x]
    blob = pickle.dumps({"version": "2.10", "pg_config": {}, "entries": [
        {"collective_seq_id": 0, "profiling_name": "nccl:all_reduce", "input_sizes": x,
         "process_group": ["0", "default_pg"], "state": "scheduled"}]})
    spec = registry()["flight_recorder_analyze"]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "nccl_trace_rank_0").write_bytes(blob)
        t0 = time.perf_counter()
        try:   # in this process (spec.run, no child), so the peak RSS is the analysis's own
            result = spec.run(spec.Params(path=tmp), lambda f, m: None)
            answer = result.model_dump_json()
        except Exception as e:
            answer = str(e)
        seconds = time.perf_counter() - t0
    return {"case": f"flight-recorder pickle x=[x,x] depth {depth} ({len(blob)} bytes)", "seconds": round(seconds, 3),
            "peak_rss_mib": _peak_rss_mib(), "answer_chars": len(answer), "answer": answer[:160]}


def big_result(n_rows: int) -> dict:
    """An in-process tool whose result grows with its input: answer and stored row sizes."""
    import sqlite3

    from tools.engine.mcp_server import build_server
    from tools.engine.spec import Field, Params, Result, ToolSpec

    class BigParams(Params):
        rows: int = Field(n_rows, ge=1, le=10_000_000, description="rows")

    class BigResult(Result):
        rows: list[str] = Field(default_factory=list, description="rows")

    spec = ToolSpec(name="bench_big", summary="s", description="d", Params=BigParams, Result=BigResult,
                    run=lambda p, progress: BigResult(rows=[f"row {i:07d} " + "x" * 60 for i in range(p.rows)]))

    async def go():
        async with Client(build_server([spec])) as c:
            t0 = time.perf_counter()
            r = await c.call_tool("bench_big", {})
            return time.perf_counter() - t0, len(json.dumps(r.structured_content, separators=(",", ":")))

    with tempfile.TemporaryDirectory() as home:
        os.environ["MLENG_HOME"] = home
        seconds, answer = anyio.run(go)
        with sqlite3.connect(Path(home) / "results.sqlite3") as db:
            stored = db.execute("SELECT length(result) FROM results").fetchone()[0]
    return {"case": f"result of {n_rows} rows", "seconds": round(seconds, 2), "peak_rss_mib": _peak_rss_mib(),
            "answer_chars": answer, "stored_chars": stored}


def scans(calls: int) -> dict:
    """`calls` log_triage runs on a 4 GiB-of-text gzip at once: refusals, light-call latency, cancel."""
    import gzip

    import psutil

    from tools.engine.jobs import MANAGER
    from tools.engine.mcp_server import build_server

    line = b"[rank0]:2026-01-01 10:00:00 step 100 loss 2.01 lr 3e-4 grad_norm 0.9 tokens/s 41000\n"
    member = gzip.compress(line * ((64 << 20) // len(line)), compresslevel=6, mtime=0)

    async def go(path):
        async with Client(build_server()) as c:
            answers = []

            async def one():
                answers.append(await c.call_tool("log_triage", {"paths": [path], "wait_s": 0}))

            async with anyio.create_task_group() as tg:
                for _ in range(calls):
                    tg.start_soon(one)
            light = []
            for name, args in [("job_status", {}), ("accelerator_specs", {"names": ["h200"]})] * 5:
                t0 = time.perf_counter()
                await c.call_tool(name, args)
                light.append(time.perf_counter() - t0)
            job_id = next(r.structured_content["job"]["job_id"] for r in answers if not r.is_error)
            children = psutil.Process().children(recursive=True)
            t0 = time.perf_counter()
            await c.call_tool("job_cancel", {"job_id": job_id})
            cancel_s = time.perf_counter() - t0
            MANAGER.cancel_all()
            psutil.wait_procs(children, timeout=5)
            return {"busy": sum(r.is_error for r in answers), "started": sum(not r.is_error for r in answers),
                    "light_call_max_ms": round(max(light) * 1000, 1), "cancel_s": round(cancel_s, 3)}

    with tempfile.TemporaryDirectory() as home:
        os.environ["MLENG_HOME"] = home
        path = Path(home) / "train.log.gz"
        with open(path, "wb") as f:
            for _ in range(64):
                f.write(member)
        size_mb = round(path.stat().st_size / 1e6, 1)
        out = anyio.run(go, str(path))
    return {"case": f"{calls} log_triage calls on 4 GiB of text in a {size_mb} MB gzip", **out}


HAPPY = [("accelerator_specs", {"names": ["h100", "h200"]}), ("knowledge_search", {"query": "nccl watchdog timeout"}),
         ("mfu_calc", {"model": "llama-3-8b", "tokens_per_s": 9000, "accelerator": "h100"}),
         ("memory_estimate", {"model": "llama-3-8b"}), ("results_history", {})]


def happy(calls: int) -> dict:
    import logging

    from tools.engine.mcp_server import build_server

    logging.disable(logging.INFO)

    async def go():
        out = {}
        async with Client(build_server()) as c:
            for name, args in HAPPY:
                await c.call_tool(name, args)           # warm: imports, caches
                times = []
                for _ in range(calls):
                    t0 = time.perf_counter()
                    r = await c.call_tool(name, args)
                    times.append(time.perf_counter() - t0)
                assert not r.is_error, r.content[0].text
                out[name] = round(statistics.median(times) * 1000, 2)
        return out

    with tempfile.TemporaryDirectory() as home:
        os.environ["MLENG_HOME"] = home
        medians = anyio.run(go)
    return {"case": f"median ms per call over {calls} calls", **medians}


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "ranges":
        print(json.dumps(ranges()))
    elif what == "pickle":
        print(json.dumps(nested_pickle(int(sys.argv[2]))))
    elif what == "big":
        print(json.dumps(big_result(int(sys.argv[2]))))
    elif what == "scans":
        print(json.dumps(scans(int(sys.argv[2]))))
    else:
        print(json.dumps(happy(int(sys.argv[2]) if len(sys.argv) > 2 else 30)))
