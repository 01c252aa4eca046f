"""nccl_log_analyze reads a multi-host NCCL_DEBUG=INFO log host by host (net plugin, transport, GID index...)
and names the host that differs; RoCE completion error 12 names NCCL_IB_GID_INDEX; nic_health judges pasted
GID tables. Fixtures are cut from public reports (tests/fixtures/nccl/public/SOURCE.md,
tests/fixtures/nic_text/SOURCE.md)."""

from pathlib import Path

import pytest

from tools.nccl_log_analyze import NcclLogParams, run
from tools.nic_health import NicHealthParams
from tools.nic_health import run as nic_run

FIX = Path(__file__).parent / "fixtures"
PUBLIC = FIX / "nccl" / "public"
NIC_TEXT = FIX / "nic_text"


def analyze(*paths):
    return run(NcclLogParams(paths=[str(p) for p in paths]), lambda *_: None)


def nic(text):
    return nic_run(NicHealthParams(text=text), lambda *_: None)


def test_the_host_without_the_sites_net_plugin_is_the_headline():
    """NVIDIA/nccl #1634: HGX-H100-04 loads HPC-X's libnccl-net.so, HGX-H100-11 falls back to internal IB."""
    r = analyze(PUBLIC / "plugin_mismatch_nccl1634.log")
    assert r.verdict == "fail" and r.problems[0] == "net_plugin_mismatch" and r.odd_hosts == ["HGX-H100-11"]
    head = r.findings[0]
    # One host against one: no majority, so the headline says which is the likelier odd one and to check every node
    # (a real model playing the drill read "differs from the other hosts" as a majority claim it could not see).
    assert head.startswith("The hosts differ in the NCCL net plugin") and "cause" in head and "NCCL_NET_PLUGIN" in head
    assert "no majority: HGX-H100-11 is the likelier odd one" in head
    assert "/opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so on HGX-H100-04" in head
    rows = {h.host: h for h in r.host_rows}
    assert rows["HGX-H100-11"].net_plugin == "internal" and rows["HGX-H100-11"].differs_in == ["net_plugin"]
    assert rows["HGX-H100-04"].net_plugin.endswith("libnccl-net.so") and rows["HGX-H100-04"].differs_in == []


def test_the_same_plugin_split_over_several_files_is_still_one_host_each(tmp_path):
    lines = (PUBLIC / "plugin_mismatch_nccl1634.log").read_text().splitlines()
    for n, line in enumerate(lines):
        (tmp_path / f"nccl.{n}.log").write_text(line + "\n")
    r = analyze(tmp_path)
    assert r.odd_hosts == ["HGX-H100-11"] and "HGX-H100-11 is the likelier odd one" in r.findings[0]


@pytest.mark.parametrize("name, plugin", [("uniform_hpcx_nccltests319.log", "NCCL RDMA Plugin v8"),
                                          ("uniform_internal_nccltests244.log", "internal")])
def test_hosts_that_agree_give_no_mismatch(name, plugin):
    r = analyze(PUBLIC / name)
    assert r.odd_hosts == [] and not {"net_plugin_mismatch", "transport_mismatch", "gid_mismatch"} & set(r.problems)
    assert len(r.host_rows) == 2 and {h.net_plugin for h in r.host_rows} == {plugin}
    # "Do the hosts differ?" is answered first (a real model found the version line there instead)
    assert r.verdict == "ok" and r.findings[0].startswith("The 2 hosts (") and "are set up alike" in r.findings[0]


@pytest.mark.parametrize("path", ["two_node_ib_healthy.log", "single_node_8gpu_nvls.log", "real/nccl_2gpu.log"])
def test_clean_logs_give_no_false_mismatch(path):
    r = analyze(FIX / "nccl" / path)
    assert r.odd_hosts == [] and all(h.differs_in == [] for h in r.host_rows)
    assert not any(p.endswith("_mismatch") for p in r.problems), r.findings[:2]


def test_roce_error_12_names_the_gid_index_setting():
    """pytorch/pytorch #81628: RoCE between hosts behind different switches, fixed by NCCL_IB_GID_INDEX=3."""
    r = analyze(PUBLIC / "roce_error12_pytorch81628.log")
    assert r.verdict == "fail" and r.problems[0] == "roce_gid"
    head = r.findings[0]
    assert "NCCL_IB_GID_INDEX" in head and "error 12" in head and "IBV_WC_RETRY_EXC_ERR" in head
    assert "do" in head and "not route between subnets" in head and "tf144" in head and "192.168.17.147" in head
    assert r.host_rows[0].transport == "RoCE"
    # NCCL listed an Intel iWARP port beside the two ConnectX ones; its channels used only the ConnectX ones
    assert r.host_rows[0].nics == ["i40iw0", "mlx5_0", "mlx5_1"] and r.host_rows[0].nics_used == ["mlx5_0", "mlx5_1"]
    assert r.host_rows[0].completion_errors == 1      # its WARN line lost the host prefix; the log has one host
    assert any("channels use mlx5_0, mlx5_1" in f for f in r.findings)


def test_roce_error_12_with_routable_gids_does_not_blame_the_gid_index():
    """NVIDIA/nccl #1814: the WARN prints IPv4-mapped GIDs on both ends; the index is not the cause."""
    r = analyze(PUBLIC / "roce_error12_routable_nccl1814.log")
    assert r.problems[0] == "roce_unreachable" and "roce_gid" not in r.problems
    assert "::ffff:29.87.4.221" in r.findings[0] and "not the cause" in r.findings[0]


def test_gid_words_as_nccl_prints_them():
    from tools.nccl_log_analyze.messages import gid_scope_of_words

    # NCCL prints the GID's two 64-bit words little-endian: fe80:: -> prefix 0x80FE; ::ffff:192.168.17.144
    assert gid_scope_of_words(0x80FE, 0x1234) == "link-local"
    assert gid_scope_of_words(0, 0x9011A8C0FFFF0000) == "ipv4"
    assert gid_scope_of_words(0x0000B80D0120, 0x1) == "global"


@pytest.mark.parametrize("name, index", [("show_gids_ibm_nsdperf4.txt", 5), ("show_gids_nccl1131.txt", 3),
                                         ("show_gids_k8s_nccl1573.txt", 7), ("ibv_devinfo_gids_nccl769.txt", 3)])
def test_nic_health_names_the_roce_v2_routable_gid_index(name, index):
    r = nic((NIC_TEXT / name).read_text())
    assert f"use NCCL_IB_GID_INDEX={index}," in r.findings[0] and "RoCE v2" in r.findings[0]
    assert any(g.index == index and g.roce == "v2" and g.scope == "ipv4" for g in r.gids)


def test_nic_health_says_the_gid_index_in_use_is_wrong_or_right():
    table = (NIC_TEXT / "ibv_devinfo_gids_nccl769.txt").read_text()
    wrong = nic(table + "\nNCCL_IB_GID_INDEX=1\n")        # NVIDIA/nccl #769: index 1 timed out, 3 worked
    assert wrong.verdict == "fail" and "NCCL_IB_GID_INDEX=1 is wrong" in wrong.findings[0]
    assert "link-local" in wrong.findings[0] and "Set NCCL_IB_GID_INDEX=3" in wrong.findings[0]
    right = nic(table + "\nNCCL INFO NCCL_IB_GID_INDEX set by environment to 3.\n")
    assert right.verdict == "ok" and "NCCL_IB_GID_INDEX=3 is right" in right.findings[0]


def test_ibv_devinfo_without_gids_is_judged_as_before():
    r = nic((NIC_TEXT / "ibv_devinfo_azhpc44.txt").read_text())
    assert r.gids == [] and r.verdict == "ok" and r.findings[0].startswith("1 RDMA port(s)")


def test_three_hosts_one_with_another_aws_ofi_version_is_named_as_a_warning():
    """Wordings as aws-ofi-nccl and NCCL print them ("Loaded net plugin AWS Libfabric (v6)", "NET/OFI Using
    aws-ofi-nccl 1.6.0-..."); a plugin of another version is worth a warning, not the verdict of a mismatch."""
    from tools.nccl_log_analyze import analyse, parse_text

    lines = []
    for host, version in (("p5-a", "1.7.4-aws"), ("p5-b", "1.7.4-aws"), ("p5-c", "1.6.0-aws")):
        head = f"{host}:100:101 [0] NCCL INFO "
        lines += [head + "NET/Plugin: Loaded net plugin AWS Libfabric (v6)", head + f"NET/OFI Using aws-ofi-nccl {version}",
                  head + ("Using network AWS Libfabric")]
    r = analyse(parse_text("\n".join(lines)))
    assert r.problems[0] == "plugin_version_mismatch" and r.verdict == "warn" and r.odd_hosts == []
    assert r.findings[0].startswith("p5-c differs") and "aws-ofi-nccl 1.6.0-aws on p5-c" in r.findings[0]
    assert "Another release of the same plugin" in r.findings[0]
    assert {h.net_plugin for h in r.host_rows} == {"AWS Libfabric"}


def test_one_plugin_network_printed_by_two_nccl_releases_is_not_a_transport_mismatch():
    from tools.nccl_log_analyze import analyse, parse_text

    r = analyse(parse_text("a:1:2 [0] NCCL INFO Using network IBext\nb:1:2 [0] NCCL INFO Using network IBext_v8"))
    assert "transport_mismatch" not in r.problems and {h.transport for h in r.host_rows} == {"IBext"}


def _qp_line(host, index, words):
    # NCCL's RoCE QP line (src/transport/net_ib, NCCL_DEBUG_SUBSYS=NET), GID words as NCCL prints them
    return f"{host}:7:8 [0] NCCL INFO NET/IB: NCCL Dev 0 IbDev 0 Port 1 qpn 4660 mtu 5 GID {index} ({words}) fifoRkey=0x1 fifoLkey=0x2"


def test_the_gid_nccl_printed_decides_and_a_link_local_host_is_named():
    from tools.nccl_log_analyze import analyse, parse_text

    using = "NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [RO]; OOB eth0:10.0.0.{n}<0>"
    lines = [f"rack1-a:7:8 [0] {using.format(n=1)}", f"rack2-b:7:8 [0] {using.format(n=2)}",
             _qp_line("rack1-a", 3, "0/1000000AFFFF0000"), _qp_line("rack2-b", 0, "80FE/1C1AEBFFFEDA0C0A"),
             "rack2-b:7:9 [0] transport/net_ib.cc:839 NCCL WARN NET/IB : Got completion with error 12, opcode 1, len 0, vendor err 129"]
    r = analyse(parse_text("\n".join(lines)))
    assert r.problems[:2] == ["gid_mismatch", "roce_gid"] and r.odd_hosts == ["rack2-b"]
    assert "rack2-b is the likelier odd one" in r.findings[0] and "NCCL_IB_GID_INDEX" in r.findings[0]
    assert "GID index 0, a link-local" in r.findings[1]
    assert {h.host: h.gid_index for h in r.host_rows} == {"rack1-a": "3 (ipv4)", "rack2-b": "0 (link-local)"}


def test_nic_health_reads_the_index_in_use_from_ncclS_qp_line():
    table = (NIC_TEXT / "show_gids_nccl1131.txt").read_text()
    r = nic(table + "\n" + _qp_line("h", 0, "80FE/1C1AEBFFFEDA0C0A") + "\n")
    assert r.verdict == "fail" and "NCCL_IB_GID_INDEX=0 is wrong" in r.findings[0] and "Set NCCL_IB_GID_INDEX=3" in r.findings[0]


def test_a_host_that_printed_no_qp_line_is_not_a_gid_culprit():
    """Red team of round 4: four hosts set NCCL_IB_GID_INDEX=3; three printed their QP's GID 3 (IPv4), the fourth no
    QP line (lazily connected, or its log cut). Its '3 (setting)' read as another index than '3 (ipv4)'."""
    from tools.nccl_log_analyze import analyse, parse_text

    lines = []
    for n, host in enumerate(["mln1", "mln2", "mln3", "mln4"], 1):
        lines += [f"{host}:7:8 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [RO]; OOB eth0:10.0.0.{n}<0>",
                  f"{host}:7:8 [0] NCCL INFO NCCL_IB_GID_INDEX set by environment to 3."]
        if host != "mln3":
            lines.append(_qp_line(host, 3, "0/1000000AFFFF0000"))
    r = analyse(parse_text("\n".join(lines)))
    assert "gid_mismatch" not in r.problems and r.odd_hosts == [], r.findings[:2]


def test_two_hosts_gid_tables_pasted_together_are_judged_one_by_one():
    """Red team of round 4: two show_gids tables and NCCL_IB_GID_INDEX=3, index 3 link-local on the second host:
    the tables merged into one and the first host's row said "=3 is right"."""
    good = (NIC_TEXT / "show_gids_nccl1131.txt").read_text()
    rows = [line for line in good.splitlines() if line.split()[2:3] == ["3"]]
    assert rows, "the fixture has an index 3"
    bad = good.replace(rows[0], rows[0].replace(rows[0].split()[3], "fe80:0000:0000:0000:0a42:a1ff:fe5c:0001"))
    r = nic(good + "\n" + bad + "\nNCCL_IB_GID_INDEX=3\n")
    assert r.verdict == "fail" and r.findings[0].startswith("table 2 of 2, mlx5_0 port 1: no RoCE v2 GID"), r.findings
    assert nic(good + "\nNCCL_IB_GID_INDEX=3\n").verdict == "ok"


def test_gid_index_minus_one_is_nccl_choosing_not_a_wrong_index():
    r = nic((NIC_TEXT / "show_gids_nccl1131.txt").read_text() + "\nNCCL_IB_GID_INDEX=-1\n")
    assert r.verdict != "fail" and "lets NCCL (2.21 and later) choose" in r.findings[0], r.findings


def test_many_hosts_are_read_in_linear_time_and_distinct_plugins_are_never_alike():
    """Red team of round 4: one plugin line per host took 60.6 s at 16,000 hosts (a scan per value)."""
    import time

    from tools.nccl_log_analyze import analyse, parse_text

    text = "\n".join(f"h{i}:1:1 [0] NCCL INFO NET/Plugin: Loaded net plugin P{i} (v8)" for i in range(16_000))
    t0 = time.perf_counter()
    r = analyse(parse_text(text))
    assert time.perf_counter() - t0 < 10
    assert r.findings[0].startswith("Hosts differ in the NCCL net plugin") and "more values" in r.findings[0]
    assert not any("set up alike" in f for f in r.findings)
