"""Reading nccl-tests output and NCCL RAS reports that users already have (tests/fixtures/nccl_tests, nccl_ras)."""

from pathlib import Path

from tools.shared import nccl_ras, nccl_tests

FIX = Path(__file__).parent / "fixtures"


def _text(name):
    return nccl_tests.parse_text((FIX / "nccl_tests" / name).read_text())


def test_two_node_ring_table():
    run = _text("allreduce_2node_ring_issue252.txt")
    assert len(run.rows) == 10 and run.out_of_bounds == 0 and run.avg_busbw_gbps == 95.3009
    big = [r for r in run.rows if r.size == 8589934592 and r.placement == "out_of_place"][0]
    assert (big.time_us, big.algbw_gbps, big.busbw_gbps, big.wrong) == (158070, 54.34, 95.10, 0)


def test_old_layout_error_column_is_not_a_wrong_count():
    run = _text("allgather_8xV100_out_of_bounds_issue37.txt")
    assert run.out_of_bounds == 2 and {r.wrong for r in run.rows} == {None}
    assert run.rows[0].busbw_gbps == 129.05


def test_mpirun_prefix_and_na_wrong():
    run = _text("allreduce_p5_mpirun_prefixed_pr503.txt")
    assert [r.size for r in run.rows if r.placement == "in_place"] == [8, 16, 32] and run.avg_busbw_gbps == 92.3405
    one = _text("alltoall_1x5090_issue287.txt")
    assert one.ranks == 1 and one.gpus == ["NVIDIA GeForce RTX 5090"] and one.rows[1].wrong is None


def test_rows_without_a_header():
    run = _text("allreduce_8ranks_rows_only_mooncake3484.txt")
    last = run.rows[-1]
    assert last.size == 33554432 and last.busbw_gbps == 300.52 and round(last.busbw_gbps / last.algbw_gbps, 2) == 1.75


def test_json_with_per_iteration_stragglers():
    run = nccl_tests.parse_json((FIX / "nccl_tests" / "allreduce_4proc_straggler_schema_v3.json").read_text())
    assert run.fmt == "json" and run.ranks == 32 and len(run.hosts) == 4 and run.out_of_bounds == 3
    assert {r.wrong for r in run.rows if r.placement == "in_place"} == {3.0}
    slow = nccl_tests.stragglers(run.process_times_us["268435456:out_of_place"])
    assert [p for p, _, _ in slow] == [2]


def test_not_nccl_tests():
    assert nccl_tests.parse_text("hello\nworld\n") is None
    assert nccl_tests.parse_json('{"a": 1}') is None and nccl_tests.parse_json("not json") is None


def test_ras_mismatch_points_at_the_ranks_behind():
    rep = nccl_ras.parse((FIX / "nccl_ras" / "ras_mismatch_allgather_2.26.2.txt").read_text())
    assert rep.version == "2.26.2" and rep.groups[0].errors == "MISMATCH"
    assert "30 rank(s) at op 640 are behind" in rep.problems[0]
    assert rep.named[0].startswith("rank 12 (GPU 4, pid 323032")


def test_ras_incomplete_names_the_silent_process():
    rep = nccl_ras.parse((FIX / "nccl_ras" / "ras_incomplete_outlier_2.27.3.txt").read_text())
    assert {g.errors for g in rep.groups} == {"INCOMPLETE", "MISMATCH", "INCOMPLETE,MISMATCH"}
    assert any("sent no state" in p for p in rep.problems)
    assert "process 60004 (GPU 0, node 10.4.109.13)" in rep.named


def test_ras_ok_is_not_a_clean_bill():
    text = (FIX / "nccl_ras" / "ras_ok_256ranks_2.26.2.txt").read_text()
    assert nccl_ras.looks_like_ras(text)
    rep = nccl_ras.parse(text)
    assert rep.problems == [] and rep.groups[0].errors == "OK"
