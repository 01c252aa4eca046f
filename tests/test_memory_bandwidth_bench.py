"""memory_bandwidth_bench on the CPU: link math, NUMA placement from a fake sysfs, verdicts on made-up
figures, parameter errors, and a real host-memory run on device='cpu'."""

import os

import pytest
from pydantic import ValidationError

from tools.memory_bandwidth_bench.measure import numa_placement, parse_cpulist
from tools.engine.spec import ToolFailure
from tools.memory_bandwidth_bench import (SPEC, MemoryBandwidthParams, MemoryBandwidthResult, judge, parse_pcie,
                                          pcie_link_gbps)


def test_pcie_link_rates_per_direction():
    assert pcie_link_gbps(4, 16) == 31.5
    assert pcie_link_gbps(5, 16) == 63.0
    assert pcie_link_gbps(5, 8) == 31.5
    assert pcie_link_gbps(None, 16) is None and pcie_link_gbps(9, 16) is None
    assert parse_pcie("Gen5 x16") == (5, 16) and parse_pcie("none to host: NVLink-C2C to Grace") == (None, None)


def test_parse_cpulist():
    assert parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}


def _fake_sysfs(tmp_path, bus, node, cpulist):
    dev = tmp_path / "bus/pci/devices" / bus
    dev.mkdir(parents=True)
    (dev / "numa_node").write_text(f"{node}\n")
    nd = tmp_path / f"devices/system/node/node{node}"
    nd.mkdir(parents=True)
    (nd / "cpulist").write_text(cpulist)
    return tmp_path


def test_numa_placement_reads_sysfs(tmp_path):
    mine = sorted(os.sched_getaffinity(0))
    root = _fake_sysfs(tmp_path, "0000:18:00.0", 1, f"{mine[0]}-{mine[-1]}")
    assert numa_placement("00000000:18:00.0", root) == {"gpu_numa_node": 1, "cpus_on_gpu_node": True}
    other = _fake_sysfs(tmp_path / "b", "0000:9a:00.0", 0, f"{mine[-1] + 100}-{mine[-1] + 120}")
    assert numa_placement("00000000:9A:00.0", other) == {"gpu_numa_node": 0, "cpus_on_gpu_node": False}
    assert numa_placement(None, root)["gpu_numa_node"] is None
    assert numa_placement("00000000:01:00.0", root)["gpu_numa_node"] is None  # no such device


def _h200(**over) -> MemoryBandwidthResult:
    base = dict(device="cuda:0", device_name="NVIDIA H200", accelerator_id="h200", copy_tbps=4.3, read_tbps=4.4,
                write_tbps=4.1, spec_tbps=4.8, copy_efficiency_pct=89.6, h2d_pinned_gbps=55.1, h2d_pageable_gbps=20.3,
                d2h_pinned_gbps=55.6, d2h_pageable_gbps=18.0, pcie_gen=5, pcie_width=16, pcie_max_gen=5,
                pcie_max_width=16, link_expected_gbps=63.0, gpu_numa_node=0, cpus_on_gpu_node=True)
    base.update(over)
    res = MemoryBandwidthResult(**base)
    judge(res)
    return res


def test_healthy_h200_is_ok():
    res = _h200()
    assert res.verdict == "ok"
    assert res.findings[0].startswith("Device copy 4.3 TB/s (bytes read + written)") and "90% of the 4.8 TB/s" in res.findings[0]
    assert any("Pageable copies reach 18 GB/s" in f for f in res.findings)  # advice, not a warning
    assert "knowledge://cpu-memory/pinned-memory.md" in res.next


@pytest.mark.parametrize("copy,verdict", [(4.3, "ok"), (3.2, "warn"), (2.0, "fail")])
def test_hbm_verdict_bands(copy, verdict):
    res = _h200(copy_tbps=copy, copy_efficiency_pct=round(100 * copy / 4.8, 1))
    assert res.verdict == verdict
    assert ("gpu_health" in res.next) == (verdict != "ok")


def test_downtrained_link_is_named():
    res = _h200(h2d_pinned_gbps=12.0, d2h_pinned_gbps=12.5, h2d_pageable_gbps=8.0, d2h_pageable_gbps=8.0,
                pcie_gen=3, pcie_width=8)
    assert res.verdict == "warn"
    finding = next(f for f in res.findings if f.startswith("Pinned host<->device bandwidth 12.5 GB/s"))
    assert "downtrained (Gen3 x8 instead of Gen5 x16" in finding and "NUMA" not in finding
    assert "gpu_topology" in res.next


def test_wrong_numa_node_is_named():
    res = _h200(h2d_pinned_gbps=25.0, d2h_pinned_gbps=24.0, cpus_on_gpu_node=False, gpu_numa_node=1)
    finding = next(f for f in res.findings if f.startswith("Pinned host<->device"))
    assert res.verdict == "warn" and "outside the GPU's NUMA node 1" in finding and "downtrained" not in finding


@pytest.mark.parametrize("kwargs,field", [
    ({"size_mib": 0}, "size_mib"),
    ({"tests": ["copy", "bogus"]}, "tests"),
    ({"device": "cpu", "tests": ["h2d"]}, "tests"),
    ({"device": "cpu", "size_mib": 4096, "tests": ["copy"]}, "size_mib"),
])
def test_bad_params_name_the_field(kwargs, field):
    with pytest.raises(ValidationError) as e:
        MemoryBandwidthParams(**kwargs)
    assert field in str(e.value)


def test_cpu_run_counts_copy_bytes_twice():
    r = SPEC.run(MemoryBandwidthParams(device="cpu", size_mib=16, tests=["copy", "read", "write"], iterations=3),
                 lambda f, m: None)
    rows = {m.test: m for m in r.measurements}
    assert rows["copy"].bytes_per_iteration == 2 * rows["read"].bytes_per_iteration == 2 * 16 * 2**20
    assert r.verdict == "info" and r.copy_tbps > 0 and r.copy_tbps == round(rows["copy"].mean_gbps / 1000, 3)
    assert r.spec_tbps is None and any("device='cpu'" in f for f in r.findings)


def test_no_gpu_is_a_clear_error():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ToolFailure, match="No GPU visible to torch"):
        SPEC.run(MemoryBandwidthParams(), lambda f, m: None)


def test_runs_as_a_subprocess_tool_through_the_runner():
    from tools.engine import store
    from tools.engine.runner import execute

    r = execute(SPEC, MemoryBandwidthParams(device="cpu", size_mib=8, tests=["copy"], iterations=2), timeout_s=120)
    assert r.copy_tbps > 0 and r.read_tbps is None and r.result_id is not None
    assert store.query("memory_bandwidth_bench")[0]["metric_value"] == r.copy_tbps


def test_gpu_run_assembly_with_fake_measurements(monkeypatch):
    """run()'s GPU path on made-up measurements: units, spec comparison, link expectation, L2 note."""
    import types

    import torch

    from tools.memory_bandwidth_bench import measure as mm
    from tools import memory_bandwidth_bench as mb

    def row(test, gbps, size=1 << 30, factor=1):
        return {"test": test, "size_mib": size / 2**20, "bytes_per_iteration": factor * size, "iterations": 20,
                "mean_gbps": gbps, "max_gbps": gbps * 1.01}

    class FakeLink:
        gen, width, max_gen, max_width, bus_id = 4, 16, 5, 16, "00000000:18:00.0"

        def __init__(self, index):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(mb, "_torch_device", lambda params: ("cuda:0", "NVIDIA H200"))
    monkeypatch.setattr(mm, "device_tests", lambda *a: [row("copy", 4310.0, factor=2), row("read", 4420.0),
                                                        row("write", 4150.0)])
    monkeypatch.setattr(mm, "host_link_tests", lambda *a: [row("h2d_pinned", 24.1), row("h2d_pageable", 11.0),
                                                           row("d2h_pinned", 25.3), row("d2h_pageable", 9.5)])
    monkeypatch.setattr(mm, "PcieWatcher", FakeLink)
    monkeypatch.setattr(mm, "numa_placement", lambda bus: {"gpu_numa_node": 1, "cpus_on_gpu_node": True})
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(L2_cache_size=60 << 20))
    r = mb.run(MemoryBandwidthParams(device=0, size_mib=256), lambda f, m: None)
    assert (r.copy_tbps, r.read_tbps, r.write_tbps, r.spec_tbps) == (4.31, 4.42, 4.15, 4.8)
    assert r.copy_efficiency_pct == pytest.approx(89.8) and r.link_expected_gbps == 63.0
    assert r.verdict == "warn" and r.gpu_numa_node == 1
    assert any("downtrained (Gen4 x16 instead of Gen5 x16" in f for f in r.findings)
    assert any("under 8x this GPU's 60 MiB L2 cache" in f for f in r.findings)
