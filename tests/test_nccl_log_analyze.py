"""nccl_log_analyze against NCCL_DEBUG=INFO logs: format-faithful multi-node logs (tests/fixtures/nccl/README.md)
and real ones from the GPU machine (tests/fixtures/nccl/real/, made by scripts/gpu_nccl_logs.sh)."""

import os
import re
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError

from tools.engine.data import IMPORT_ROOT as REPO_ROOT
from tools.engine.spec import ToolFailure
from tools.engine.processes import local_gpu_count
from tools.nccl_log_analyze import NcclLogParams, analyse, parse_text, run, transport_of

NCCL = Path(__file__).parent / "fixtures" / "nccl"
REAL = NCCL / "real"


def analyze(*paths, **kw):
    return run(NcclLogParams(paths=[str(p) for p in paths], **kw), lambda f, m: None)


def test_single_node_nvswitch_is_healthy():
    r = analyze(NCCL / "single_node_8gpu_nvls.log")
    assert r.verdict == "ok" and r.problems == []
    assert r.nccl_versions == {"2.21.5": 1} and r.world_size == 8 and r.hosts == ["dgx-h100-01"]
    assert r.transports == {"p2p": 16} and r.gdr == "n/a" and r.nvls_available is True
    assert r.channels["nvls"] == 16 and r.channels["coll"] == 32
    assert r.tuning["AllReduce"].startswith("NVLS/Simple")
    assert [x.bus_id for x in r.ranks] == ["18000", "2a000", "3a000", "5d000", "9a000", "ab000", "ba000", "db000"]
    assert r.rings[0].startswith("0 1 2 3 4 5 6 7")


def test_two_nodes_on_ib_with_gdr_are_healthy():
    r = analyze(NCCL / "two_node_ib_healthy.log")
    assert r.verdict == "ok" and r.problems == []
    assert (r.world_size, r.nodes, r.processes) == (16, 2, 16)
    assert r.gdr == "on" and r.transports["net_ib_gdr"] == 64
    assert {n.speed_gbps for n in r.nics} == {50.0} and len(r.nics) == 16
    assert r.ranks[9].host == "gpu-node02" and r.ranks[9].nics_used == ["mlx5_1"]
    assert r.expected_busbw_per_nic_gbps == 47.0  # ib-ndr-per-nic in knowledge/data/interconnects.toml


def test_socket_fallback_where_ib_exists_fails():
    r = analyze(NCCL / "two_node_socket_fallback.log")
    assert r.verdict == "fail" and "socket_fallback" in r.problems
    assert r.network == ["Socket"] and r.env["NCCL_IB_DISABLE"] == "1"
    assert any("NCCL_IB_DISABLE=1" in f and "TCP sockets" in f for f in r.findings)
    assert "knowledge://network/inter-node.md" in r.next


def test_degraded_two_node_log_flags_each_fault():
    r = analyze(NCCL / "two_node_degraded.log")
    assert r.verdict == "fail"
    for problem in ("version_mismatch", "gdr_off", "nic_mismatch", "bootstrap_mismatch", "virtual_interface",
                    "nic_idle", "slow_nic", "nccl_warnings"):
        assert problem in r.problems, problem
    assert r.nccl_versions == {"2.20.5": 8, "2.21.5": 8}
    assert r.gdr == "partial"
    text = " ".join(r.findings)
    assert "2.20.5 on gpu-node02" in text
    assert "NET/3 on gpu-node01 at 25 GB/s vs 50 GB/s" in text
    assert "On gpu-node02 the 8 ranks send over 1 of 7 NICs (mlx5_0)" in text
    assert "gpu-node02: docker0" in text


def test_pcie_box_without_p2p_goes_through_the_cpu():
    r = analyze(NCCL / "pcie_4gpu_shm.log")
    assert r.verdict == "warn"
    assert {"p2p_disabled", "intra_node_via_cpu"} <= set(r.problems)
    assert r.transports == {"shm": 8} and r.nccl_versions == {"2.18.6": 1}
    assert "socket_inter_node" not in r.problems  # one node: sockets are not in the data path


def test_rank_that_never_completes_init_is_named():
    r = analyze(NCCL / "init_hang_rank5.log")
    assert r.verdict == "fail" and "init_incomplete" in r.problems
    assert [x.rank for x in r.ranks if not x.init_complete] == [5]
    assert any(f.startswith("Rank 5 (on gpu-node05)") for f in r.findings)
    assert any("Cuda failure 'out of memory'" in w for w in r.warnings)


def test_old_nccl_format_and_labels_parse():
    lines = [
        "[3] ip-172-31-6-84:45321:45326 [0] NCCL INFO NET/Socket : Using [0]ens5:172.31.6.84<0>",
        "[3] ip-172-31-6-84:45321:45326 [0] NCCL INFO Using network Socket",
        "NCCL version 2.4.8+cuda10.1",
        "[3] ip-172-31-6-84:45321:45326 [0] NCCL INFO Ring 00 : 22 -> 21 [send] via NET/Socket/0",
        "[3] ip-172-31-6-84:45321:45326 [0] NCCL INFO Trees [0] 22->21->-1/-1/-1",
        "[3] ip-172-31-6-84:45321:45326 [0] NCCL INFO comm 0x7f145c002250 rank 21 nranks 64 cudaDev 0 nvmlDev 0 - Init COMPLETE",
        "[4] ip-172-31-1-93:45294:45299 [0] NCCL INFO Ring 00 : 56 -> 52 [receive] via NET/Socket/0",
        "[4] ip-172-31-1-93:45294:45299 [0] NCCL INFO comm 0x7f1 rank 52 nranks 64 cudaDev 0 nvmlDev 0 - Init COMPLETE",
    ]
    r = analyse(parse_text("\n".join(lines)))
    assert r.nccl_versions == {"2.4.8": 1} and r.world_size == 64 and r.nodes == 2
    assert r.transports == {"net_socket": 2} and "socket_inter_node" in r.problems
    assert any("Only 2 of 64 ranks appear" in f for f in r.findings)


def test_transport_classes():
    assert transport_of("P2P/CUMEM/read") == "p2p" and transport_of("P2P/direct pointer/read") == "p2p"
    assert transport_of("SHM/direct/direct") == "shm"
    assert transport_of("NET/IB/0/GDRDMA") == "net_ib_gdr" and transport_of("NET/IB/5(1)") == "net_ib"
    assert transport_of("NET/Socket/0") == "net_socket"
    assert transport_of("NET/AWS Libfabric/0/GDRDMA") == "net_plugin_gdr"


def test_per_process_files_in_a_directory_are_merged(tmp_path):
    lines = (NCCL / "two_node_ib_healthy.log").read_text().splitlines()
    for line in lines:
        m = re.match(r"([\w-]+):(\d+):", line)
        name = f"nccl.{m[1]}.{m[2]}" if m else "rank0.bare"
        with open(tmp_path / name, "a") as f:
            f.write(line + "\n")
    r = analyze(tmp_path)
    assert (r.processes, r.world_size, r.gdr, r.verdict) == (16, 16, "on", "ok")


# ---------------------------------------------------------------------------------------------------
# Bad input

def test_missing_empty_binary_and_unrelated_input(tmp_path):
    with pytest.raises(ToolFailure, match="no such file"):
        analyze(tmp_path / "nope.log")
    (tmp_path / "empty.log").write_text("")
    assert analyze(tmp_path / "empty.log").findings == ["The log is empty."]
    (tmp_path / "blob.bin.log").write_bytes(os.urandom(50_000))
    with pytest.raises(ToolFailure, match="binary"):
        analyze(tmp_path / "blob.bin.log")
    (tmp_path / "train.log").write_text("step 1 loss 2.0\nstep 2 loss 1.9\n")
    r = analyze(tmp_path / "train.log")
    assert r.verdict == "info" and "No NCCL output in 2 lines" in r.findings[0]
    with pytest.raises(ValidationError):
        NcclLogParams()


def test_garbage_nccl_lines_do_not_crash():
    lines = ["h:1:2 [0] NCCL INFO Channel 00/0 : x -> y via", "h:1:2 [0] NCCL INFO comm rank nranks",
             "h:1:2 [0] NCCL INFO   Algorithm   |", "h:1:2 [0] NCCL INFO    AllReduce |  1.0/ 2.0 |",
             "NCCL INFO NET/IB : Using ; OOB", "h:1:2 [0] NCCL WARN"]
    r = analyse(parse_text("\n".join(lines)))
    assert r.processes >= 1 and r.nccl_lines == 6


# ---------------------------------------------------------------------------------------------------
# Real logs from the GPU machine (present once the lead has run scripts/gpu_nccl_logs.sh)

REAL_LOGS = sorted(p for p in REAL.glob("nccl_*gpu*.log")) if REAL.exists() else []


@pytest.mark.skipif(not REAL_LOGS, reason="no real NCCL logs in tests/fixtures/nccl/real/ yet")
@pytest.mark.parametrize("path", REAL_LOGS, ids=lambda p: p.name)
def test_real_logs_parse(path):
    r = analyze(path, max_ranks=1000)
    n = int(re.search(r"nccl_(\d+)gpu", path.name)[1])
    assert r.nccl_versions, "no NCCL version found"
    assert r.world_size == n and len(r.ranks) == n and all(x.init_complete for x in r.ranks)
    if "p2p_disabled" in path.name:
        assert {"p2p_disabled", "intra_node_via_cpu"} & set(r.problems)
    elif n > 1:
        assert r.transports.get("p2p", 0) + r.transports.get("nvls", 0) > 0
        assert "intra_node_via_cpu" not in r.problems and "p2p_disabled" not in r.problems
    if "ring_simple" in path.name:
        assert "forced_settings" in r.problems and r.env.get("NCCL_ALGO") == "Ring"
    # One node, no RDMA network: the Socket transport's "GPU Direct RDMA Disabled" line is no finding.
    assert "gdr_off" not in r.problems and r.gdr == "n/a"


@pytest.mark.skipif(not (REAL / "nccl_2gpu_files").is_dir(), reason="no per-process NCCL_DEBUG_FILE logs yet")
def test_real_per_process_files():
    r = analyze(REAL / "nccl_2gpu_files")
    assert r.processes == 2 and r.world_size == 2


@pytest.mark.gpu
@pytest.mark.skipif(local_gpu_count() < 2, reason="needs 2 GPUs")
def test_live_two_gpu_log(tmp_path):
    out = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "gpu_nccl_logs.sh")], env=dict(os.environ, OUT=str(tmp_path)),
                         capture_output=True, text=True, timeout=600, check=False)
    assert (tmp_path / "nccl_2gpu.log").exists(), out.stdout + out.stderr
    r = analyze(tmp_path / "nccl_2gpu.log")
    assert r.world_size == 2 and r.transports.get("p2p", 0) + r.transports.get("nvls", 0) > 0
    r = analyze(tmp_path / "nccl_2gpu_p2p_disabled.log")
    assert {"p2p_disabled", "intra_node_via_cpu"} & set(r.problems)


def test_rdma_plugin_with_sharp_devices():
    host = "qh100-gpu19:49355:49414 [1] NCCL INFO "
    lines = [host + "NET/Plugin: Loaded net plugin NCCL RDMA Plugin v6 (v6)",
             host + "NET/IB : Using [0]mlx5_0:1/IB/SHARP [1]mlx5_1:1/IB/SHARP [RO]; OOB ibp25s0:10.20.0.119<0>",
             host + "Using network IBext",
             host + "Channel 00/0 : 9[1] -> 1[1] [receive] via NET/IBext/1/GDRDMA",
             host + "comm 0x5 rank 1 nranks 16 cudaDev 1 nvmlDev 1 busId 2a000 commId 0x9 - Init COMPLETE"]
    r = analyse(parse_text("\n".join(lines)))
    assert r.net_plugin == ["NCCL RDMA Plugin v6"] and r.network == ["IBext"]
    assert [n.name for n in r.nics] == ["mlx5_0", "mlx5_1"] and r.gdr == "on"
    assert r.bootstrap_interfaces == {"qh100-gpu19": "ibp25s0"} and r.ranks[0].nics_used == ["mlx5_1"]


def test_pasted_fragments_with_prose_around_them():
    r = analyse(parse_text("NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0 ... is GPUDirect RDMA on? "
                           "I don't see GDRDMA anywhere"))
    assert r.transports == {"net_ib": 1} and r.gdr == "off" and "gdr_off" in r.problems
    r = analyse(parse_text("NCCL WARN NET/IB : No device found.\nNCCL INFO NET/Socket : Using [0]bond0:172.16.3.4<0>\n"
                           "NCCL INFO Using network Socket"))
    assert "socket_inter_node" in r.problems and [n.name for n in r.nics] == ["bond0"]


def _graph_log(graph_type):
    h = "box:10:11 [{g}] NCCL INFO "
    lines = [h.format(g=g) + f"comm 0x1{g} rank {g} nranks 2 cudaDev {g} busId {g}000 commId 0x7 - Init COMPLETE"
             for g in range(2)]
    lines.append(h.format(g=0) + f"Pattern 4, crossNic 0, nChannels 2, bw 12.000000/12.000000, type {graph_type}, "
                 "sameChannels 1")
    lines.append(h.format(g=0) + "Channel 00/0 : 0[0] -> 2[0] [send] via NET/IB/0/GDRDMA")
    return "\n".join(lines)


def test_paths_through_pcie_switches_or_across_the_cpu():
    r = analyse(parse_text(_graph_log("PXB/SYS")))
    assert "intra_node_pcie" in r.problems and "nic_via_cpu" in r.problems
    assert r.verdict == "warn"  # PCIe between GPUs is information; the NIC across the CPU is a warning
    r = analyse(parse_text(_graph_log("NVL/PIX")))
    assert r.problems == [] and r.verdict == "ok"


def test_init_that_never_completes_anywhere():
    lines = [f"h:1{g}:2 [{g}] NCCL INFO comm 0x{g} rank {g} nranks 2 cudaDev {g} busId {g}000 commId 0x7 - Init START"
             for g in range(2)]
    r = analyse(parse_text("\n".join(lines)))
    assert "init_incomplete" in r.problems and r.verdict == "warn"
    assert any(f.startswith("No rank printed 'Init COMPLETE'") for f in r.findings)
