"""gpu_topology reading pasted `nvidia-smi topo -m` (tests/fixtures/topo, sources in SOURCE.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import gpu_topology
from tools.engine.spec import ToolFailure

TOPO = Path(__file__).parent / "fixtures" / "topo"


def read(text: str):
    return gpu_topology.run(gpu_topology.GpuTopologyParams(text=text), lambda f, m: None)


def test_two_pcie_gpus_from_a_real_report():
    r = read((TOPO / "topo_2x5090_club3090_1229.txt").read_text())
    assert r.gpu_count == 2 and r.links == [["X", "PHB"], ["PHB", "X"]]
    assert [(g.cpus, g.numa_node) for g in r.gpus] == [("0-63", 0), ("0-63", 0)] and r.nics == []


def test_eight_nvlink_gpus_with_nics_names_each_gpus_closest_nic_and_says_rows_are_missing():
    r = read((TOPO / "topo_8xh_sglang13973.txt").read_text())
    assert r.gpu_count == 6 and r.links[0][1] == "NV18" and len(r.nics) == 9
    assert [(g.index, g.best_nic, g.best_nic_path) for g in r.gpus][:4] == [
        (0, "NIC0", "PIX"), (1, "NIC1", "PIX"), (2, "NIC2", "PIX"), (3, "NIC4", "PIX")]
    assert r.gpus[3].cpus == "24-47,120-143" and r.gpus[4].numa_node == 2
    assert any("rows for 6 of its 8 GPU columns" in f for f in r.findings)
    assert any("No NIC legend" in f for f in r.findings)
    assert any("NUMA nodes" in f for f in r.findings)  # GPUs on 3 NUMA nodes: bind ranks to their CPUs


@pytest.mark.parametrize("text", ["", "nvidia-smi: command not found", "        GPU0    GPU1\nfoo bar\n"])
def test_other_text_names_the_format_expected(text):
    with pytest.raises(ToolFailure, match=r"^text: expected `nvidia-smi topo -m` output"):
        read(text)
