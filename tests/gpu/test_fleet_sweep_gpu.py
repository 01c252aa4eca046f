"""fleet_sweep on the GPU box itself (hosts=["localhost"]: no SLURM there), through the runner as users
run it: every default check on every GPU, one row per GPU, the fleet median over the GPUs.
`python -m pytest tests/gpu/test_fleet_sweep_gpu.py -m gpu -s` prints FIGURE lines for
docs/benchmarks.md. About 1-2 minutes on one H200, longer with more GPUs (checks run per GPU in turn)."""

import importlib.util

import pytest
import torch

from tools import fleet_sweep as fs
from tools.engine.runner import execute
from tools.engine.store import query

pytestmark = pytest.mark.gpu


def test_fleet_sweep_of_this_gpu_node_gives_one_row_per_gpu():
    gpus = torch.cuda.device_count()
    r = execute(fs.SPEC, fs.SPEC.Params(hosts=["localhost"], deadline_s=900), timeout_s=1000)
    print(f"\nFIGURE fleet_sweep on {gpus}x {torch.cuda.get_device_name(0)}: wall {r.wall_s} s, verdict {r.verdict}")
    for row in r.rows:
        print(f"FIGURE   {row.check}: {row.verdict} in {row.seconds} s {row.figures} {row.problems[:2]}")
    for g in r.gpus:
        print(f"FIGURE   GPU {g.gpu} {g.figure} = {g.value} {g.unit} (expected {g.expected})")
    print("FIGURE   medians:", [(m.figure, m.median, m.count) for m in r.medians])
    print("FIGURE   findings:", r.findings)
    assert r.nodes_complete == 1 and not r.not_answering, r.findings
    checks = {row.check for row in r.rows}
    assert {"env_report", "gpu_health", "cpu_probe", "matmul_bench", "memory_bandwidth_bench"} <= checks
    assert ("p2p_bandwidth" in checks) == (gpus >= 2)
    per_gpu = {(g.figure, g.gpu) for g in r.gpus}
    assert per_gpu >= {("mamf_tflops", i) for i in range(gpus)} | {("copy_tbps", i) for i in range(gpus)}
    assert all(g.value and g.value > 0 for g in r.gpus)
    stored = query(tool="matmul_bench")
    print("FIGURE   stored:", [(r["host"], r["gpu_serials"], r["gpu_uuids"]) for r in stored])
    assert stored and stored[0]["host"]
    if importlib.util.find_spec("pynvml"):  # serials and UUIDs come from NVML
        assert len(stored[0]["gpu_uuids"]) == gpus
