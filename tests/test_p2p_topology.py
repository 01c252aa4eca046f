"""gpu_topology and p2p_bandwidth: PCIe path naming, NIC discovery (fake sysfs), binding advice, pair
flagging, and the clear answers on a machine without GPUs."""

import os

import pytest

from tools import gpu_topology
from tools.shared import topology
from tools.shared.topology import GpuInfo, NicInfo, nvml_busid_to_sysfs, parse_cpulist, pci_chain, pcie_relation
from tools.gpu_topology import binding_advice
from tools.engine.spec import ToolFailure
from tools.p2p_bandwidth import PairResult, expected_link_gbps, flag_pairs

ROOT = "/sys/devices/pci0000:00/0000:00:01.0"


@pytest.mark.parametrize("a, b, numa, want", [
    (f"{ROOT}/0000:01:00.0/0000:02:00.0/0000:03:00.0", f"{ROOT}/0000:01:00.0/0000:02:01.0/0000:04:00.0", (0, 0), "PIX"),
    (f"{ROOT}/0000:01:00.0/0000:02:00.0/0000:03:00.0/0000:04:00.0/0000:05:00.0",
     f"{ROOT}/0000:01:00.0/0000:02:01.0/0000:06:00.0", (0, 0), "PXB"),
    (f"{ROOT}/0000:01:00.0", "/sys/devices/pci0000:00/0000:00:02.0/0000:07:00.0", (0, 0), "PHB"),
    (f"{ROOT}/0000:01:00.0", "/sys/devices/pci0000:40/0000:40:01.0/0000:41:00.0", (0, 0), "NODE"),
    (f"{ROOT}/0000:01:00.0", "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0", (0, 1), "SYS"),
])
def test_pcie_relation_uses_nvidia_smi_names(a, b, numa, want):
    assert pcie_relation(pci_chain(a), pci_chain(b), *numa) == want


def test_small_parsers():
    assert parse_cpulist("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert nvml_busid_to_sysfs("00000000:18:00.0") == "0000:18:00.0"
    assert pci_chain("/sys/devices/pci0000:17/0000:17:00.0")[0] == "pci0000:17"


def test_binding_advice_names_cpus_nic_and_cross_socket_cost():
    gpus = [GpuInfo(index=0, name="H100", pci="a", numa_node=0, cpus="0-47", best_nic="mlx5_0", best_nic_path="PIX"),
            GpuInfo(index=1, name="H100", pci="b", numa_node=1, cpus="48-95", best_nic="mlx5_0", best_nic_path="SYS")]
    nics = [NicInfo(name="mlx5_0", kind="infiniband", pci="c", numa_node=0, rate_gbits=400)]
    lines, warns = binding_advice(gpus, nics)
    assert lines[1] == "local rank 1 -> GPU 1: CPUs 48-95 (NUMA 1), NIC mlx5_0 (SYS)"
    assert any("GPU 1 has no NIC on its own socket" in w for w in warns)
    assert any("share NICs" in w for w in warns) and any("2 NUMA nodes" in w for w in warns)


def test_nics_are_read_from_sysfs(tmp_path, monkeypatch):
    dev = tmp_path / "devices/pci0000:00/0000:00:01.0/0000:01:00.0"
    dev.mkdir(parents=True)
    (dev / "numa_node").write_text("1\n")
    (tmp_path / "bus/pci/devices").mkdir(parents=True)
    os.symlink(dev, tmp_path / "bus/pci/devices/0000:01:00.0")
    port = tmp_path / "class/infiniband/mlx5_0/ports/1"
    port.mkdir(parents=True)
    os.symlink(dev, tmp_path / "class/infiniband/mlx5_0/device")
    (port / "rate").write_text("400 Gb/sec (4X NDR)\n")
    (port / "state").write_text("4: ACTIVE\n")
    (port / "link_layer").write_text("InfiniBand\n")
    (tmp_path / "class/net/lo").mkdir(parents=True)  # virtual: no device link, skipped
    efa_dev = tmp_path / "devices/pci0000:00/0000:00:02.0/0000:02:00.0"   # AWS EFA: driver "efa"
    (tmp_path / "bus/pci/drivers/efa").mkdir(parents=True)
    efa_dev.mkdir(parents=True)
    os.symlink(tmp_path / "bus/pci/drivers/efa", efa_dev / "driver")
    (tmp_path / "class/infiniband/rdmap2s0/ports/1").mkdir(parents=True)
    os.symlink(efa_dev, tmp_path / "class/infiniband/rdmap2s0/device")
    monkeypatch.setattr(topology, "SYSFS", tmp_path)
    nics = topology.read_nics()
    assert [(n.name, n.kind, n.pci, n.numa_node, n.rate_gbits, n.state) for n in nics] == \
        [("mlx5_0", "infiniband", "0000:01:00.0", 1, 400.0, "ACTIVE"),
         ("rdmap2s0", "efa", "0000:02:00.0", None, None, None)]


def test_slow_pair_is_flagged_against_median_and_link():
    pairs = [PairResult(src=s, dst=d, link="NV18", unidir_gbps=bw, expected_gbps=450.0)
             for (s, d), bw in {(0, 1): 380.0, (1, 0): 378.0, (0, 2): 381.0, (2, 0): 150.0}.items()]
    median, findings = flag_pairs(pairs)
    assert median == pytest.approx(379.0)
    assert [p.flagged for p in pairs] == [False, False, False, True]
    assert findings[0].startswith("GPU 2 -> GPU 0 (NV18) copies at 150.0 GB/s")


def test_expected_link_rate_from_knowledge_data():
    assert expected_link_gbps("NV18", "NVIDIA H200") == pytest.approx(450.0)
    assert expected_link_gbps("NV12", "NVIDIA A100-SXM4-80GB") == pytest.approx(300.0)
    assert expected_link_gbps("SYS", "NVIDIA H100 80GB HBM3") == pytest.approx(63.0)


def test_without_gpus_topology_says_so_and_p2p_fails_clearly(monkeypatch):
    from tools.gpu_topology import SPEC as TOPO, GpuTopologyParams
    from tools.engine.processes import local_gpu_count
    from tools.p2p_bandwidth import SPEC as P2P, P2pBandwidthParams

    if local_gpu_count():
        pytest.skip("this machine has GPUs")
    topo = TOPO.run(GpuTopologyParams(), lambda f, m: None)
    assert topo.verdict == "info" and topo.gpu_count == 0 and "No NVIDIA GPUs visible" in topo.findings[0]
    with pytest.raises(ToolFailure, match="No CUDA GPUs visible"):
        P2P.run(P2pBandwidthParams(), lambda f, m: None)
