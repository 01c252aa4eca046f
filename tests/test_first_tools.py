"""Pure logic of the first tools: gpu_health judging, XID parsing, env_report warnings, name matching."""

import pytest

from tools.shared.accelerators import match_accelerator
from tools.env_report import env_warnings
from tools.gpu_health import GpuReading, assess, summarise
from tools.shared.xid import parse_events


def reading(**kw) -> GpuReading:
    base = dict(index=0, name="NVIDIA H100 80GB HBM3", pci_bus_id="00000000:3B:00.0", serial="1650123",
                temperature_c=45, slowdown_temperature_c=87, power_w=120.0, power_limit_w=700.0,
                default_power_limit_w=700.0, sm_clock_mhz=1980, sm_clock_max_mhz=1980, ecc_enabled=True,
                ecc_uncorrected_volatile=0, ecc_uncorrected_aggregate=0, remap_pending=False, remap_failure=False,
                pcie_width=16, pcie_width_max=16, nvlink_active=18, nvlink_total=18)
    return GpuReading(**(base | kw))


def test_healthy_gpu_is_ok():
    g = reading()
    assess(g)
    assert g.verdict == "ok" and g.problems == []


@pytest.mark.parametrize("change,verdict,action,words", [
    ({"ecc_uncorrected_volatile": 2}, "fail", "reset_gpu", "uncorrectable ECC"),
    ({"remap_failure": True}, "fail", "replace", "row remapping failed"),
    ({"remap_pending": True}, "fail", "reset_gpu", "remap is pending"),
    ({"throttle_reasons": ["hw_power_brake_slowdown"]}, "warn", "monitor", "hw_power_brake_slowdown"),
    ({"throttle_reasons": ["gpu_idle"]}, "ok", "none", ""),
    ({"temperature_c": 84}, "warn", "monitor", "slowdown point"),
    ({"pcie_width": 8}, "warn", "monitor", "x8 of x16"),
    ({"nvlink_active": 12}, "fail", "reset_gpu", "12 of 18 NVLink"),
    ({"power_limit_w": 400.0}, "ok", "none", "power limit"),
    ({"xids": [{"code": 79, "text": "GPU has fallen off the bus."}]}, "fail", "drain_node", "fallen off the bus"),
    ({"xids": [{"code": 13, "text": "Graphics Exception"}]}, "warn", "none", "Xid 13"),
])
def test_each_fault_gives_its_verdict_and_action(change, verdict, action, words):
    g = reading(**change)
    assess(g)
    assert (g.verdict, g.action) == (verdict, action)
    assert words in " ".join(p.text for p in g.problems)


def test_node_verdict_names_the_bad_gpu_by_index_and_serial():
    good, bad = reading(index=0), reading(index=1, serial="SN-BAD", ecc_uncorrected_volatile=1)
    for g in (good, bad):
        assess(g)
    result = summarise([good, bad], "580.1", "read with `dmesg`")
    assert result.verdict == "fail"
    assert any("GPU 1" in f and "SN-BAD" in f for f in result.findings)
    assert "knowledge://compute/gpu-faults.md" in result.next


def test_xid_lines_are_mapped_to_bus_ids():
    log = ("[Mon Jan  1 00:00:00 2026] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n"
           "[Mon Jan  1 00:00:01 2026] NVRM: Xid (PCI:0000:86:00): 48, pid=99, DBE (double bit error)\n")
    events = parse_events(log)
    assert [(e.bus, e.code) for e in events] == [("3b:00", 79), ("86:00", 48)]


def test_env_warnings():
    env = {"CUDA_LAUNCH_BLOCKING": "1", "NCCL_P2P_DISABLE": "1", "NCCL_DEBUG": "INFO",
           "NCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}
    text = "\n".join(env_warnings(env, "12.8", "12.4", ["pip package nvidia-nccl-cu12==2.21", "/opt/nccl/libnccl.so.2"]))
    for needle in ("CUDA_LAUNCH_BLOCKING=1", "NCCL_P2P_DISABLE=1", "NCCL_DEBUG=INFO", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                   "TORCH_FR_BUFFER_SIZE", "built for CUDA 12.8 but the driver supports CUDA 12.4", "More than one NCCL"):
        assert needle in text
    assert env_warnings({"NCCL_DEBUG": "WARN"}, "12.4", "12.8", [], dev_shm_gib=64.0) == []
    assert "--shm-size" in env_warnings({}, None, None, [], dev_shm_gib=0.0625)[0]


@pytest.mark.parametrize("name,expected", [
    ("h100", "h100-sxm"), ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("H100-SXM5-80GB", "h100-sxm"),
    ("NVIDIA H100 PCIe", "h100-pcie"), ("NVIDIA H200", "h200"), ("NVIDIA A100-SXM4-80GB", "a100-sxm"),
    ("AMD Instinct MI300X", "mi300x"), ("mi300x", "mi300x"), ("gaudi2", "gaudi2"), ("NVIDIA B200", "b200"),
    ("NVIDIA GeForce RTX 4090", "rtx-4090"), ("tpu v5p", None), ("", None),
])
def test_accelerator_name_matching(name, expected):
    rec = match_accelerator(name)
    assert (rec["id"] if rec else None) == expected


def test_real_h200_reading_from_the_gpu_machine_judges_healthy():
    """gpu_health --json captured on the 2xH200 machine (tests/fixtures/gpu): re-judging it must agree."""
    import json
    from pathlib import Path

    from tools.gpu_health import GpuHealthResult

    data = json.loads((Path(__file__).parent / "fixtures/gpu/h200x2_gpu_health.json").read_text())
    result = GpuHealthResult.model_validate(data)
    for g in result.gpus:
        assess(g)
        assert g.verdict == "ok" and g.action == "none", g.problems
        assert g.nvlink_active == g.nvlink_total == 18 and g.pcie_width == 16
    assert match_accelerator(result.gpus[0].name)["id"] == "h200"
