"""What the attacks of issue 16 cost, and what ordinary calls cost, with whichever `tools` is importable.

Run it once against the code before a change and once after (PYTHONPATH picks the checkout):
    PYTHONPATH=/path/to/checkout python bench/reliability_costs.py ranges      # matmul_bench range validation
    PYTHONPATH=... python bench/reliability_costs.py pickle DEPTH               # x=[x,x] flight-recorder pickle
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
    else:
        print(json.dumps(happy(int(sys.argv[2]) if len(sys.argv) > 2 else 30)))
