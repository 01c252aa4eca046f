"""collective_bench: nccl-tests conventions (pure), expected-figure matching, and real gloo runs."""

import tomllib

import pytest

from tools.collective_bench.rank import bandwidths, busbw_factor, round_size, size_sweep
from tools.collective_bench import (SPEC, BenchRow, CollectiveBenchParams, OpSummary, expected_busbw, judge,
                                    parse_size, summarize_rows)
from tools.engine.data import KNOWLEDGE_DIR


@pytest.mark.parametrize("op, n, factor", [("all_reduce", 2, 1.0), ("all_reduce", 8, 1.75),
                                           ("all_gather", 4, 0.75), ("reduce_scatter", 8, 0.875),
                                           ("all_to_all", 2, 0.5), ("broadcast", 8, 1.0), ("all_reduce", 1, 0.0)])
def test_busbw_factors_match_nccl_tests(op, n, factor):
    assert busbw_factor(op, n) == pytest.approx(factor)
    algbw, busbw = bandwidths(op, 1 << 30, 0.01, n)
    assert algbw == pytest.approx((1 << 30) / 0.01 / 1e9) and busbw == pytest.approx(algbw * factor)


def test_sizes_follow_b_e_f_and_split_evenly():
    assert size_sweep(parse_size("32K"), parse_size("16G"), 2)[::10] == [32768, 33554432]
    assert len(size_sweep(32 << 10, 16 << 30, 2)) == 20
    assert parse_size("1M") == 1 << 20 and parse_size("256MiB") == 256 << 20 and parse_size(4096) == 4096
    assert round_size(1000, "all_gather", 3, 4) == 996 and round_size(8, "all_to_all", 4, 4) == 16
    with pytest.raises(ValueError):
        CollectiveBenchParams(max_bytes="lots")


def test_expected_figure_follows_gpu_count_and_nvls_setting():
    rec, _ = expected_busbw("h100-sxm", 8, 1, "all_reduce")
    assert rec["algo"] == "nvls" and rec["busbw_gbps"] == 480
    rec, _ = expected_busbw("h200", 8, 1, "all_reduce", {"NCCL_NVLS_ENABLE": "0"})
    assert rec["algo"] == "ring" and rec["busbw_gbps"] == 370
    rec, _ = expected_busbw("h200", 8, 1, "all_gather")
    assert rec["algo"] == "ring"
    rec, note = expected_busbw("h200", 2, 1, "all_reduce", {"NCCL_NVLS_ENABLE": "0"})
    assert rec["id"] == "2x-h200-nvlink4-ring-measured" and note == ""
    rec, note = expected_busbw("h100-sxm", 4, 1, "all_reduce")
    assert rec["gpus"] == 8 and "approximate" in note
    assert expected_busbw("h200", 8, 2, "all_reduce")[0] is None
    assert expected_busbw(None, 8, 1, "all_reduce")[0] is None


def test_verdict_from_ratio():
    rec = {"id": "x"}
    mk = lambda peak: OpSummary(op="all_reduce", avg_busbw_gbps=1, peak_busbw_gbps=peak, peak_bytes=1 << 30,
                                expected_busbw_gbps=370, ratio=peak / 370)
    assert judge(mk(360), rec, True)[0] == "ok"
    assert judge(mk(250), rec, True)[0] == "warn"
    assert judge(mk(100), rec, True)[0] == "fail"
    assert judge(mk(100), rec, False)[0] == "info"


def test_interconnects_data_is_sourced_and_names_known_accelerators():
    links = tomllib.loads((KNOWLEDGE_DIR / "data" / "interconnects.toml").read_text())
    accels = tomllib.loads((KNOWLEDGE_DIR / "data" / "accelerators.toml").read_text())
    known = {a["id"] for a in accels["accelerator"]}
    link_ids = {link["id"] for link in links["link"]}
    for rec in links["link"] + links["expected_busbw"]:
        assert rec["sources"], rec["id"]
    for rec in links["expected_busbw"]:
        assert set(rec["accelerators"]) <= known, rec["id"]
        assert rec["link"] in link_ids and rec["busbw_gbps"] > 0
        for point in rec.get("points", []):
            assert point["busbw_gbps"] > 0 and point["bytes"] > 0


# ------------------------------------------------------------------ real runs (gloo)

def _bench(**kw):
    params = CollectiveBenchParams(backend="gloo", min_bytes="4K", max_bytes="64K", iters=3, warmup=1,
                                   plot=False, **kw)
    return SPEC.run(params, lambda f, m: None)


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [2, 4])
def test_every_op_runs_checked_and_busbw_over_algbw_is_the_factor(nproc):
    ops = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"]
    result = _bench(nproc_per_node=nproc, ops=ops)
    assert result.world_size == nproc and result.wrong_elements == 0, result.findings
    assert {r.op for r in result.rows} == set(ops) and len(result.rows) == 5 * 5
    for row in result.rows:
        assert row.time_us > 0 and row.algbw_gbps > 0
        assert row.algbw_gbps == pytest.approx(row.bytes / row.time_us / 1e3, rel=0.01)
        assert row.busbw_gbps == pytest.approx(row.algbw_gbps * busbw_factor(row.op, nproc), rel=0.01)
    assert "busbw" in result.table and result.verdict == "info"


@pytest.mark.slow
def test_planted_wrong_element_is_counted():
    result = _bench(nproc_per_node=2, ops=["all_reduce", "all_gather"], plant_error_rank=1)
    assert [r.wrong for r in result.rows] == [1] * len(result.rows)
    assert result.verdict == "fail" and "wrong elements" in result.findings[0]


@pytest.mark.slow
def test_one_rank_says_busbw_needs_two(tmp_path):
    result = SPEC.run(CollectiveBenchParams(
        backend="gloo", nproc_per_node=1, min_bytes="4K", max_bytes="8K", iters=2, warmup=0,
        plot_path=str(tmp_path / "p.png")), lambda f, m: None)
    assert "at least 2 ranks" in result.findings[0]
    assert all(r.busbw_gbps == 0 for r in result.rows)
    assert result.plot_png and (tmp_path / "p.png").stat().st_size > 1000


def test_expected_across_nodes_is_per_nic_figure_times_active_ports(tmp_path):
    from tools.collective_bench.rank import rdma_ports

    for i, (rate, state) in enumerate([("400 Gb/sec (4X NDR)", "4: ACTIVE")] * 8 + [("400 Gb/sec (4X NDR)", "1: DOWN")]):
        port = tmp_path / "class" / "infiniband" / f"mlx5_{i}" / "ports" / "1"
        port.mkdir(parents=True)
        (port / "rate").write_text(rate + "\n")
        (port / "state").write_text(state + "\n")
        (port / "link_layer").write_text("InfiniBand\n")
    ports = rdma_ports(str(tmp_path))
    assert len(ports) == 9 and sum(p["active"] for p in ports) == 8 and ports[0]["rate_gbits"] == 400.0
    rec, note = expected_busbw("h100-sxm", 8, 2, "all_reduce", {}, ports)
    assert rec["busbw_gbps"] == pytest.approx(47.0 * 8) and rec["id"] == "ib-ndr-per-nic x 8"
    assert "NCCL_ALGO=RING" in note
    rec, note = expected_busbw("h100-sxm", 8, 2, "all_reduce", {"NCCL_ALGO": "Ring"}, ports)
    assert note == ""
    assert expected_busbw("h100-sxm", 8, 2, "all_reduce", {}, [])[0] is None


def _fake_outcome(gpu: str, world: int, rows: list[tuple[int, float]], env=None):
    from tools.shared.launch import LaunchOutcome, RankState

    data = [{"kind": "setup", "versions": {"device_name": gpu}, "world_size": world, "local_world_size": world,
             "backend": "nccl", "nccl_env": env or {}, "rdma_ports": []}]
    for size, busbw in rows:
        t = size / (busbw / busbw_factor("all_reduce", world) if world > 1 else 100.0) / 1e3
        data.append({"kind": "row", "op": "all_reduce", "bytes": size, "count": size // 4, "dtype": "float32",
                     "time_us": t, "algbw_gbps": size / t / 1e3, "busbw_gbps": busbw, "wrong": 0})
    ranks = {r: RankState(rank=r, status="done") for r in range(world)}
    return LaunchOutcome(command=["x"], world_size=world, ranks=ranks, data=data, returncode=0, stalled=False,
                         overran=False, elapsed_s=1.0, stderr_tail="", output_tail="")


@pytest.mark.parametrize("busbw, verdict", [(340.0, "ok"), (220.0, "warn"), (90.0, "fail")])
def test_two_h200_verdict_against_the_measured_points(busbw, verdict, tmp_path):
    from tools.collective_bench import build_result

    outcome = _fake_outcome("NVIDIA H200", 2, [(32768, 2.4), (8 << 30, busbw)], {"NCCL_NVLS_ENABLE": "0"})
    result = build_result(outcome, CollectiveBenchParams(plot=False), 1, 10.0)
    assert result.verdict == verdict and result.accelerator_id == "h200"
    assert result.expected_busbw_gbps == 349.0 and result.expected_source == "2x-h200-nvlink4-ring-measured"


def test_one_gpu_is_never_judged_against_a_multi_gpu_figure():
    from tools.collective_bench import build_result

    result = build_result(_fake_outcome("NVIDIA H200", 1, [(32768, 0.0), (1 << 30, 0.0)]),
                          CollectiveBenchParams(plot=False), 1, 5.0)
    assert result.verdict == "info" and result.expected_busbw_gbps is None
    assert "at least 2 ranks" in result.findings[0]


def test_small_bandwidths_keep_their_significant_digits():
    """Review F5: 0.0235 and 0.0023 GB/s (a 5-50x drop) both printed as '0.0 GB/s'."""
    from tools.collective_bench.report import gbps

    assert [gbps(v) for v in (0.0235, 0.0023, 0.116, 1.07, 376.0, 3761.2)] == ["0.0235", "0.0023", "0.116", "1.07",
                                                                               "376", "3761"]
    rows = [BenchRow(op="all_reduce", bytes=b, count=b // 4, dtype="float32", time_us=1.0, algbw_gbps=0.0,
                     busbw_gbps=bw, wrong=0) for b, bw in ((1 << 15, 0.0011), (1 << 21, 0.0023))]
    assert summarize_rows(rows, "all_reduce", None).avg_busbw_gbps == 0.0017
