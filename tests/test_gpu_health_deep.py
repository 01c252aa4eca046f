"""gpu_health's judgment on synthetic NVML / sysfs readings: PCIe against the PCI tree, NVLink and clock-event
changes over a window, modes, memory holders, and DCGM outputs from public reports (tests/fixtures/dcgm)."""

import os
from pathlib import Path

import pytest

from tools.gpu_health import GpuReading, assess, dcgm, holders, pcie, sampling

DCGM = Path(__file__).parent / "fixtures" / "dcgm"


def _tree(tmp_path, links):
    """A fake /sys/bus/pci/devices: links = [(bdf, cur_speed, cur_width, max_speed, max_width)], root port first."""
    devices, real = tmp_path / "devices", tmp_path / "real" / "pci0000:00"
    devices.mkdir()
    path = real
    for bdf, cur, curw, mx, mxw in links:
        path = path / bdf
        path.mkdir(parents=True)
        for name, value in (("current_link_speed", f"{cur} GT/s PCIe"), ("current_link_width", str(curw)),
                            ("max_link_speed", f"{mx} GT/s PCIe"), ("max_link_width", str(mxw))):
            (path / name).write_text(value + "\n")
        os.symlink(path, devices / bdf)
    return str(devices)


def test_gen5_gpu_behind_gen4_switch_is_not_downtrained(tmp_path):
    root = _tree(tmp_path, [("0000:00:01.0", "16.0", 16, "16.0", 16), ("0000:01:00.0", "16.0", 16, "16.0", 16),
                            ("0000:02:00.0", "16.0", 16, "32.0", 16)])
    samples = [pcie.chain("0000:02:00.0", root) for _ in range(3)]
    assert [h.bdf for h in samples[0]] == ["0000:02:00.0", "0000:01:00.0", "0000:00:01.0"]
    assert pcie.judge("GPU 0", samples, loaded=True) == []
    assert "most its port" in pcie.capped_by_parent(samples)


def test_width_downtrained_and_idle_gen_not_reported(tmp_path):
    root = _tree(tmp_path, [("0000:00:01.0", "32.0", 16, "32.0", 16), ("0000:01:00.0", "2.5", 8, "32.0", 16)])
    idle = [pcie.chain("0000:01:00.0", root)]
    found = pcie.judge("GPU 0", idle, loaded=False)
    assert [f.code for f in found] == ["pcie_width"] and found[0].action == "drain_node"
    assert {f.code for f in pcie.judge("GPU 0", idle, loaded=True)} == {"pcie_width", "pcie_gen"}


def test_flapping_across_samples():
    hop = lambda g, w: [pcie.PcieHop(bdf="0000:01:00.0", gen=g, width=w, max_gen=5, max_width=16),  # noqa: E731
                        pcie.PcieHop(bdf="0000:00:01.0", gen=5, width=16, max_gen=5, max_width=16)]
    found = pcie.judge("GPU 1", [hop(5, 16), hop(5, 8), hop(5, 16)], loaded=True)
    assert [f.code for f in found] == ["pcie_flapping"] and "x8" in found[0].text


def test_nvlink_counts_only_growth_and_dcgm_crc_rate():
    before = [sampling.NvLinkCounters(link=i, replay=5, recovery=1, crc_flit=100, crc_data=0) for i in range(18)]
    after = [c.model_copy() for c in before]
    assert sampling.judge_nvlink("GPU 0", before, after, 2.0) == []      # old totals alone are not a fault
    after[3].crc_flit += 500
    after[7].recovery += 1
    found = {f.code: f for f in sampling.judge_nvlink("GPU 0", before, after, 2.0)}
    assert found["nvlink_crc"].action == "drain_node" and "NVLink 3" in found["nvlink_crc"].text
    assert found["nvlink_recovery"].action == "monitor"


def test_fewer_links_than_the_maximum_is_not_a_fault():
    links = [sampling.NvLinkCounters(link=i) for i in range(4)]        # a product built with 4 links
    assert sampling.judge_nvlink("GPU 0", links, links, 1.0) == []


def test_clock_events_with_durations():
    secs = sampling.event_seconds({"hw_power_brake_slowdown": 0, "sw_power_cap": 0, "sw_thermal_slowdown": 0},
                                  {"hw_power_brake_slowdown": 600_000_000, "sw_power_cap": 1_900_000_000,
                                   "sw_thermal_slowdown": 20_000_000})
    found = {f.code: f for f in sampling.judge_clock_events("GPU 2", secs, 2.0)}
    assert found["hw_power_brake_slowdown"].action == "drain_node" and "0.6 s of 2.0 s" in found["hw_power_brake_slowdown"].text
    assert found["sw_power_cap"].action == "none"
    assert "sw_thermal_slowdown" not in found          # 0.02 s: below the noise floor


def _reading(**kw):
    return GpuReading(index=0, name="NVIDIA H200", pci_bus_id="00000000:18:00.0", **kw)


def test_clean_reading_is_ok_with_action_none():
    g = _reading(ecc_enabled=True, ecc_pending=True, persistence_mode=True, mig_enabled=False, mig_pending=False,
                 fabric_state="completed", fabric_status="success")
    assess(g)
    assert (g.verdict, g.action, g.problems) == ("ok", "none", [])


@pytest.mark.parametrize("fields, code, action", [
    ({"remap_failure": True}, "remap_failure", "replace"),
    ({"remap_pending": True}, "remap_pending", "reset_gpu"),
    ({"ecc_uncorrected_volatile": 2}, "ecc_dbe", "reset_gpu"),
    ({"fabric_state": "in_progress"}, "fabric_state", "drain_node"),
    ({"mig_enabled": False, "mig_pending": True}, "mig_pending", "reset_gpu"),
    ({"ecc_enabled": True, "ecc_pending": False}, "ecc_pending", "reboot_node"),
    ({"persistence_mode": False}, "persistence_off", "none"),
    ({"xids": [{"code": 79, "text": "GPU has fallen off the bus."}]}, "xid 79", "drain_node"),
    ({"xids": [{"code": 64, "text": "Row Remapper Error", "count": 2}]}, "xid 64", "drain_node"),
    ({"xids": [{"code": 13, "text": "Graphics Exception"}]}, "xid 13", "none"),
])
def test_each_fault_has_its_action(fields, code, action):
    g = _reading(**fields)
    assess(g)
    found = {f.code: f.action for f in g.problems}
    assert found[code] == action and g.action == action


def test_memory_holders_are_described_not_presumed_stale():
    gpu = "GPU 0"
    mine = holders.judge(gpu, holders.MemoryHolder(pid=10, name="python", user="me", mine=True, age_s=5400, state="running", used_mib=70000))
    other = holders.judge(gpu, holders.MemoryHolder(pid=11, name="python", user="alice", mine=False, age_s=60, state="running", used_mib=1000))
    zombie = holders.judge(gpu, holders.MemoryHolder(pid=12, name="python", state="zombie", used_mib=5000))
    hidden = holders.judge(gpu, holders.MemoryHolder(pid=13, state="not visible", used_mib=5000))
    assert "your process 10" in mine.text and "1.5 h" in mine.text and mine.action == "none"
    assert "leftover" not in mine.text + other.text + hidden.text
    assert "alice" in other.text and other.action == "none"
    assert zombie.action == "reset_gpu" and "exited" in zombie.text
    assert hidden.action == "none" and "not visible" in hidden.text


def test_holder_of_this_very_process():
    h = holders.describe(os.getpid(), 2**30)
    assert h.mine is True and h.used_mib == 1024 and h.age_s is not None and h.age_s >= 0


def _dcgm(name):
    results, version = dcgm.parse((DCGM / name).read_text())
    return [f for f in (dcgm.judge(r) for r in results) if f], results, version


def test_dcgm_persistence_warning_is_a_setting():
    found, results, version = _dcgm("dcgm4_r2_persistence_warn_nvsentinel772.json")
    assert version == "4.2.3" and {r.code_name for r in results if r.code} == {"DCGM_FR_PERSISTENCE_MODE"}
    assert {f.action for f in found} == {"none"} and {f.subject for f in found} == {"GPU 0", "GPU 1"}


def test_dcgm_zero_second_thermal_violation_is_a_known_false_alarm():
    found, _, _ = _dcgm("dcgm4_r3_thermal_0s_issue242.json")
    assert len(found) == 1 and found[0].action == "none" and "known false alarm" in found[0].text


def test_dcgm_pass_with_memory_alloc_error_is_a_false_pass():
    found, results, _ = _dcgm("dcgm4_r2_memory_alloc_pass_issue284.json")
    assert results[-1].status == "Pass" and found[0].action == "monitor" and "known false pass" in found[0].text


def test_dcgm_pcie_width_fail_names_the_reduced_lane_case():
    found, _, _ = _dcgm("dcgm4_r2_pcie_width_aws806.json")
    assert found[0].code == "DCGM_FR_PCIE_WIDTH" and "fewer lanes" in found[0].text


def test_dcgm_row_remap_failure_is_acted_on():
    found, _, _ = _dcgm("dcgm4_r1_row_remap_failure.json")
    assert [(f.subject, f.action) for f in found] == [("GPU 0", "reset_gpu")]


def test_dcgm3_layout_reads_the_same_way():
    found, results, version = _dcgm("dcgm3_r2_pcie_fail_layout.json")
    assert version == "3.3.1" and len(results) == 13 and found[0].subject == "GPU 1"


def test_dcgm_bad_input_names_what_is_missing():
    with pytest.raises(ValueError, match="DCGM Diagnostic"):
        dcgm.parse('{"something": 1}')


def test_dcgm_not_installed_is_an_answer(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    text, note = dcgm.run_diag(1, 10)
    assert text is None and "DCGM is not installed" in note


def test_saved_dcgm_output_is_read_through_the_tool():
    from tools.gpu_health import GpuHealthParams, run

    r = run(GpuHealthParams(dcgm_file=str(DCGM / "dcgm4_r1_row_remap_failure.json"), sample_s=0, load=False,
                            read_kernel_log=False), lambda *_: None)
    assert [(f.subject, f.action) for f in r.dcgm] == [("GPU 0", "reset_gpu")]
    assert r.action in ("reset_gpu", "drain_node", "replace") and r.verdict == "fail"


def test_unreadable_dcgm_file_is_named():
    from tools.gpu_health import _dcgm, GpuHealthParams

    found, note = _dcgm(GpuHealthParams(dcgm_file="/nonexistent/diag.json"))
    assert found == [] and "/nonexistent/diag.json" in note and "could not be read" in note
