"""nccl_log_analyze beyond the NCCL log: settings against NCCL's documented defaults, RoCE mixed with IB,
an idle socket interface, and what users paste from nccl-tests and ncclras (tests/fixtures/nccl_tests,
nccl_ras: public reports, SOURCE.md)."""

from pathlib import Path

from tools.nccl_log_analyze import NcclLogParams, run
from tools.nccl_log_analyze.checks import is_override

FIX = Path(__file__).parent / "fixtures"
HEALTHY = (FIX / "nccl" / "two_node_ib_healthy.log").read_text()
SOCKETS = (FIX / "nccl" / "two_node_socket_fallback.log").read_text()


def _run(text):
    return run(NcclLogParams(text=text), lambda *_: None)


def _with_env(text, *settings):
    head = text.splitlines()[0].split(" NCCL INFO ")[0]
    extra = "".join(f"{head} NCCL INFO {k} set by environment to {v}.\n" for k, v in settings)
    return extra + text


def test_defaults_are_not_reported_as_overrides():
    assert not is_override("NCCL_IB_DISABLE", "0") and not is_override("NCCL_SHM_DISABLE", "0")
    assert not is_override("NCCL_NVLS_ENABLE", "1") and is_override("NCCL_NVLS_ENABLE", "0")
    assert is_override("NCCL_ALGO", "Ring") and is_override("NCCL_IB_DISABLE", "1")
    r = _run(_with_env(HEALTHY, ("NCCL_IB_DISABLE", "0"), ("NCCL_SHM_DISABLE", "0")))
    assert "forced_settings" not in r.problems, r.findings
    r = _run(_with_env(HEALTHY, ("NCCL_IB_DISABLE", "0"), ("NCCL_ALGO", "Ring")))
    text = next(f for f in r.findings if f.startswith("Settings that override"))
    assert "NCCL_ALGO=Ring" in text and "NCCL_IB_DISABLE=0: NCCL's default, no effect" in text


def test_roce_port_mixed_with_ib_ports():
    line = next(ln for ln in HEALTHY.splitlines() if "NET/IB : Using" in ln)
    mixed = HEALTHY.replace(line, line.replace("[7]mlx5_7:1/IB", "[7]mlx5_7:1/RoCE"), 1)
    r = _run(mixed)
    assert "roce_ib_mixed" in r.problems and any("mlx5_7/RoCE" in f for f in r.findings)
    assert "roce_ib_mixed" not in _run(HEALTHY).problems


def test_second_socket_interface_left_idle():
    two = SOCKETS.replace("NET/Socket : Using [0]ib0:192.168.10.1<0>", "NET/Socket : Using [0]ib0:192.168.10.1<0> "
                          "[1]ib1:192.168.11.1<0>")
    r = _run(two)
    assert "socket_iface_idle" in r.problems and any("ib1 stays idle" in f for f in r.findings)
    assert "socket_iface_idle" not in _run(SOCKETS).problems


def test_pasted_nccl_tests_table_and_json():
    r = run(NcclLogParams(paths=[str(FIX / "nccl_tests" / "allreduce_p5_mpirun_prefixed_pr503.txt")]), lambda *_: None)
    assert r.nccl_tests_runs == 1 and any("no device lines" in f for f in r.findings)
    r = run(NcclLogParams(paths=[str(FIX / "nccl_tests" / "allreduce_4proc_straggler_schema_v3.json")]), lambda *_: None)
    assert {"nccl_tests_wrong", "nccl_tests_straggler"} <= set(r.problems) and r.verdict == "fail"
    assert any("process 2" in f for f in r.findings)


def test_busbw_against_the_expected_figure_for_the_hardware():
    devices = "".join(f"#  Rank {i:2d} Group  0 Pid {100 + i} on     node01 device  {i} [0x{i:02x}] NVIDIA H100 80GB HBM3\n"
                      for i in range(8))
    table = ("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n"
             "  8589934592    2147483648     float     sum      -1    50000  171.80  300.65      0    50000  171.80  300.65      0\n")
    r = _run(devices + table)
    text = next(f for f in r.findings if "peak busbw" in f)
    assert "300.6 GB/s" in text and "of the" in text and "8x-h100" in text
    assert "nccl_tests_low_busbw" in r.problems and r.verdict in ("warn", "fail")


def test_pasted_ras_report_goes_to_the_hang_chain():
    r = run(NcclLogParams(paths=[str(FIX / "nccl_ras" / "ras_incomplete_outlier_2.27.3.txt")]), lambda *_: None)
    assert "ras_incomplete" in r.problems and r.verdict == "fail" and r.next[0] == "hang_stack_dump"
    assert any("60004" in f for f in r.findings)
    ok = run(NcclLogParams(paths=[str(FIX / "nccl_ras" / "ras_ok_256ranks_2.26.2.txt")]), lambda *_: None)
    assert ok.verdict == "ok" and any("outside NCCL" in f for f in ok.findings)


def test_gdr_read_is_judged_against_the_platforms_default():
    # NCCL env.rst: since 2.4.2 the default is 1 on NVLink-based platforms and 0 otherwise
    assert is_override("NCCL_NET_GDR_READ", "1", nvlink=True) is False
    assert is_override("NCCL_NET_GDR_READ", "1", nvlink=False) is True
    assert is_override("NCCL_NET_GDR_READ", "0", nvlink=False) is False
    assert is_override("NCCL_NET_GDR_READ", "0", nvlink=None) is None   # the log does not say: no verdict
    from tools.nccl_log_analyze.checks import nvlink_platform
    from tools.nccl_log_analyze.parse import parse_text

    nvlink = nvlink_platform(parse_text(HEALTHY))
    r = _run(_with_env(HEALTHY, ("NCCL_NET_GDR_READ", "1"), ("NCCL_ALGO", "Ring")))
    text = next(f for f in r.findings if f.startswith("Settings that override"))
    expected = {True: "NCCL_NET_GDR_READ=1: NCCL's default, no effect",
                False: "override NCCL's own choices: NCCL_ALGO=Ring, NCCL_NET_GDR_READ=1;",
                None: "NCCL_NET_GDR_READ=1: NCCL's default depends on whether the GPUs are NVLink-connected"}[nvlink]
    assert expected in text, (nvlink, text)
