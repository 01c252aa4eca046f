"""GPU runs of the distributed tools (marker gpu): all local GPUs, one GPU, and an NCCL hang.

Run on the GPU machine:  python -m pytest tests/gpu/test_dist_gpu.py -m gpu -q -s
Figures worth recording print with -s (busbw per op, pair bandwidth, stage seconds).
"""

import time

import pytest

from tools.collective_bench import SPEC as BENCH, CollectiveBenchParams
from tools.dist_smoke_test import SPEC as SMOKE, DistSmokeTestParams
from tools.gpu_topology import SPEC as TOPO, GpuTopologyParams
from tools.shared.launch import visible_gpus
from tools.engine.processes import local_gpu_count
from tools.p2p_bandwidth import SPEC as P2P, P2pBandwidthParams

pytestmark = pytest.mark.gpu
quiet = lambda f, m: None  # noqa: E731


def _no_ranks_left():
    time.sleep(0.5)
    try:
        import psutil
    except ImportError:  # bare GPU box: fall back to /proc
        import pathlib
        left = []
        for proc in pathlib.Path("/proc").glob("[0-9]*"):
            try:
                if b"tools.dist_smoke_test.rank" in (proc / "cmdline").read_bytes() or \
                        b"tools.collective_bench.rank" in (proc / "cmdline").read_bytes():
                    left.append(proc.name)
            except OSError:
                pass
        return left
    return [p.pid for p in psutil.process_iter(["cmdline"])
            if any(m in " ".join(p.info["cmdline"] or []) for m in ("tools.dist_smoke_test.rank", "tools.collective_bench.rank"))]


def test_smoke_all_gpus_nccl():
    result = SMOKE.run(DistSmokeTestParams(), quiet)
    print("\nsmoke:", result.findings, [(r.rank, r.device, r.seconds) for r in result.ranks])
    assert result.verdict in ("ok", "warn"), result.findings
    assert result.backend == "nccl" and result.ranks_ok == result.world_size == visible_gpus()
    assert all(r.device and r.device.startswith("cuda") for r in result.ranks)
    assert not _no_ranks_left()


def test_smoke_one_gpu_says_world_size_one():
    result = SMOKE.run(DistSmokeTestParams(nproc_per_node=1), quiet)
    assert result.verdict == "ok" and any("World size 1" in f for f in result.findings)


@pytest.mark.skipif(visible_gpus() < 2, reason="needs 2 GPUs")
def test_nccl_hang_is_named_and_killed():
    t0 = time.monotonic()
    result = SMOKE.run(DistSmokeTestParams(nproc_per_node=2, pg_timeout_s=15,
                                           inject_fault="sleep_before_all_reduce", fault_rank=1), quiet)
    elapsed = time.monotonic() - t0
    print(f"\nhang: {elapsed:.1f} s", result.findings)
    assert result.verdict == "fail" and result.culprit_ranks == [1], result.findings
    assert elapsed < 15 + 10 + 15  # timeout + naming + NCCL start-up
    assert not _no_ranks_left()


def test_collective_bench_all_ops_all_gpus():
    ops = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"]
    result = BENCH.run(CollectiveBenchParams(ops=ops, min_bytes="32K", max_bytes="256M", plot=False), quiet)
    print("\nbench:", result.findings, "\n" + result.table)
    assert result.wrong_elements == 0 and result.backend == "nccl"
    assert {r.op for r in result.rows} == set(ops)
    if result.world_size == 1:
        assert "at least 2 ranks" in result.findings[0]
    else:
        big = [r for r in result.rows if r.op == "all_reduce" and r.bytes == 256 << 20][0]
        assert big.busbw_gbps > 50  # NVLink or PCIe: far above a broken (socket) path


def test_collective_bench_one_gpu():
    result = BENCH.run(CollectiveBenchParams(nproc_per_node=1, max_bytes="16M", plot=False), quiet)
    assert "at least 2 ranks" in result.findings[0] and all(r.busbw_gbps == 0 for r in result.rows)


def test_p2p_bandwidth():
    result = P2P.run(P2pBandwidthParams(size_mib=256), quiet)
    print("\np2p:", result.findings, [(p.src, p.dst, p.link, p.unidir_gbps, p.bidir_gbps, p.latency_us)
                                     for p in result.pairs])
    assert result.local_copy_gbps and result.local_copy_gbps > 300
    if result.gpu_count == 1:
        assert result.verdict == "info" and "at least 2 GPUs" in result.findings[0]
    else:
        assert len(result.pairs) == result.gpu_count * (result.gpu_count - 1)
        assert result.median_unidir_gbps > 20


def test_gpu_topology():
    result = TOPO.run(GpuTopologyParams(), quiet)
    print("\ntopology:", result.findings, result.links, result.binding)
    assert result.gpu_count == local_gpu_count()
    assert len(result.links) == result.gpu_count and result.links[0][0] == "X"
    assert len(result.binding) == result.gpu_count
