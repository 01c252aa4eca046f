"""Actions on health findings and the XID / SXid catalog, on real kernel-log lines (tests/fixtures/logs/public)."""

from pathlib import Path

import pytest

from tools.shared import xid
from tools.shared.actions import ACTIONS, HealthFinding, by_action, escalate, verdict_of, worst_action

LOGS = Path(__file__).parent / "fixtures" / "logs" / "public"


def test_ladder_order_and_worst():
    assert ACTIONS[0] == "none" and ACTIONS[-1] == "replace"
    assert worst_action(["monitor", "drain_node", "reset_gpu"]) == "drain_node"
    assert worst_action([]) == "none"
    assert escalate("reboot_node", True, "drain_node") == "drain_node"
    assert escalate("reboot_node", False, "drain_node") == "reboot_node"
    assert [verdict_of(a) for a in ("none", "monitor", "reset_gpu")] == ["ok", "warn", "fail"]
    with pytest.raises(ValueError, match="accepted are none, monitor"):
        worst_action(["reboot"])


def test_by_action_groups_subjects_worst_first():
    found = [HealthFinding(text="a", action="monitor", subject="node2"),
             HealthFinding(text="b", action="drain_node", subject="node7"),
             HealthFinding(text="c", action="none", subject="node1")]
    assert list(by_action(found)) == ["drain_node", "monitor"]
    assert by_action(found)["drain_node"] == ["node7"]


def test_xid_64_and_79_follow_the_issue_policy():
    e64 = xid.XidEvent(bus="0f:00", code=64, text="Row Remapper Error")
    assert xid.judge(e64)[0] == "reboot_node"
    assert xid.judge(e64, repeated=True)[0] == "drain_node"
    e79 = xid.XidEvent(bus="01:00", code=79, text="GPU has fallen off the bus.")
    assert xid.judge(e79)[0] == "drain_node"
    assert xid.judge(e79, repeated=True)[0] == "replace"


def test_catalog_carries_version_date_and_nvidia_buckets():
    cat = xid.catalog()
    assert cat["catalog"]["read"] == "2026-12-01" and "R575" in cat["catalog"]["version"]
    assert cat["xid"]["79"]["immediate"] == "RESTART_BM" and cat["xid"]["64"]["immediate"] == "RESET_GPU"
    assert all(r["action"] in ACTIONS and r["on_repeat"] in ACTIONS for r in cat["xid"].values())


def test_unknown_xid_is_monitored_not_silent():
    action, meaning = xid.judge(xid.XidEvent(bus="3b:00", code=185, text="?"))
    assert action == "monitor" and "not in the catalog" in meaning


def test_multiline_fallen_off_bus_without_xid_line():
    events = xid.parse_events((LOGS / "fallen_off_bus_multiline_dmesg.log").read_text())
    assert [(e.bus, e.code) for e in events] == [("b3:00", 79)]
    assert xid.judge(events[0])[0] == "drain_node"


def test_xid45_names_its_cause_and_is_not_the_cause():
    events = xid.parse_events((LOGS / "xid45_caused_by_previous.log").read_text())
    assert {e.previous for e in events} == {145, 149} and all(e.code == 45 for e in events)
    action, meaning = xid.judge(events[0])
    assert action == "none" and "Xid 149" in meaning


def test_pcie_link_down_then_xid79_on_one_gpu():
    events = xid.parse_events((LOGS / "xid79_pcie_link_down_syslog.log").read_text())
    assert [(e.bus, e.code) for e in events] == [("01:00", 79)]


def test_sxid_fatal_and_nonfatal():
    events = xid.parse_events((LOGS / "sxid_and_xid64_kernel.log").read_text())
    sx = [e for e in events if e.switch is not None]
    assert [(e.code, e.fatal) for e in sx] == [(19084, False), (20034, True), (10002, None), (20034, True)]
    assert xid.judge(sx[1])[0] == "reboot_node" and xid.judge(sx[0])[0] == "monitor"
    x64 = [e for e in events if e.switch is None]
    assert [(e.bus, e.code) for e in x64] == [("0f:00", 64)]


def test_xid154_takes_the_action_it_names():
    e = xid.XidEvent(bus="3b:00", code=154, text="GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)")
    assert xid.judge(e)[0] == "reboot_node"


def test_slurm_job_diagnose_turns_node_faults_into_actions():
    from tools.shared.triage.core import triage_paths
    from tools.slurm_job_diagnose import health_findings

    logs = Path(__file__).parent / "fixtures" / "logs" / "slurm_xid"
    hits = triage_paths([str(p) for p in sorted(logs.iterdir())]).signatures
    found = health_findings("NODE_FAIL", "gpu-node02", hits)
    assert found[0].code == "NODE_FAIL" and found[0].action == "drain_node" and found[0].subject == "gpu-node02"
    assert {f.code: f.action for f in found}["xid"] == "drain_node"       # Xid 79 in the node's syslog
    assert health_findings("COMPLETED", None, []) == []


# Lines in the format NVIDIA's catalog gives for 144-150 ("Xid (PCI:0000:BB:DF): <Xid> <sub component> <fatal vs
# nonfatal> <Crosscontain> <injected> <link> (<intrInfo> <errorStatus> ...)"); the others as the driver prints them.
NVLINK5_ERA = """\
[ 812.40] NVRM: Xid (PCI:0000:1b:00): 147, TREX Nonfatal XC0 i0 Link 03 (0x0000000e 0x80000000 0x0 0x0 0x0 0x0)
[ 812.41] NVRM: Xid (PCI:0000:1b:00): 148, NVLPW_CTRL Nonfatal XC0 i0 Link 03 (0x0000000f 0x80000000 0x0 0x0 0x0 0x0)
[ 901.02] NVRM: Xid (PCI:0000:43:00): 150, MSE_WATCHDOG Fatal XC0 i0 Link 00 (0x00000000 0x00000000 0x0 0x0 0x0 0x0)
[ 955.77] NVRM: Xid (PCI:0000:43:00): 159, pid=4411, name=python, CHI Non-Data Error
[1003.10] NVRM: Xid (PCI:0000:52:00): 162, Power Smoothing HW Circuitry capability reengaged
[1003.11] NVRM: Xid (PCI:0000:52:00): 163, Power Smoothing HW Circuitry capability disengaged
[1003.12] NVRM: Xid (PCI:0000:52:00): 164, Power Smoothing HW Circuitry low lifetime reached
[1003.13] NVRM: Xid (PCI:0000:52:00): 165, Power Smoothing HW Circuitry lifetime exhausted
[1100.00] NVRM: Xid (PCI:0000:9a:00): 168, Errors found in WPR (write protected region)
"""


def test_nvlink5_era_xids_have_the_catalogs_meaning_and_action():
    """147/148/150/159/162-165/168 used to fall to 'monitor' as unknown codes; each now carries NVIDIA's meaning
    and the action its catalog (or decode table) gives, or says that it gives none."""
    events = xid.parse_events(NVLINK5_ERA)
    assert [e.code for e in events] == [147, 148, 150, 159, 162, 163, 164, 165, 168]
    judged = {e.code: xid.judge(e) for e in events}
    assert all("not in the catalog" not in meaning for _, meaning in judged.values())
    expected = {147: "none", 148: "none", 150: "reset_gpu", 159: "monitor", 162: "monitor", 163: "monitor",
                164: "monitor", 165: "monitor", 168: "reboot_node"}
    assert {code: action for code, (action, _) in judged.items()} == expected
    assert xid.judge(events[2], repeated=True)[0] == "drain_node"       # MSE fatal again after a reset
    assert "MSE" in judged[150][1] and "fatal" in judged[150][1]
    assert "UVM" in judged[159][1] and "sympathetic" in judged[159][1]
    assert judged[162][1].endswith("documented meaning, no documented action")
    assert "ECC" in judged[168][1]
    cat = xid.catalog()["xid"]
    assert {cat[str(c)]["mnemonic"] for c in (147, 148, 150)} == {"NVLINK_TREX_ERROR", "NVLINK_NVLPW_CTRL_ERROR",
                                                                   "NVLINK_MSE_ERROR"}


def test_nvlink5_xids_follow_the_severity_their_line_states():
    """Xid 144-150: a Non-fatal line is not a reset (NVIDIA's decode table: IGNORE or follow the Xid 154), a Fatal
    or Link Fatal one is; RLW_RXPIPE's non-fatal rows may still want a reset (monitor); no severity: worst case."""
    def judged(line, repeated=False):
        return xid.judge(xid.parse_events("NVRM: Xid (PCI:0000:01:00): " + line)[0], repeated)

    status = "(0x00000001 0x00000008 0x00000000 0x00000000 0x00000000 0x00000000)"
    assert judged(f"144, SAW_MVB Nonfatal XC0 i0 Link 0 {status}")[0] == "none"
    assert judged(f"144, SAW_MVB Nonfatal XC0 i0 Link 0 {status}", repeated=True)[0] == "monitor"
    assert judged(f"144, SAW_MVB Fatal XC0 i0 Link 0 {status}")[0] == "reset_gpu"
    assert judged(f"144, SAW_MVB Fatal XC0 i0 Link 0 {status}", repeated=True)[0] == "drain_node"
    assert judged(f"149, NETIR_LINK_EVT Link Fatal XC0 i0 Link 00 {status}")[0] == "reset_gpu"
    assert judged(f"149, NETIR_BER_EVENT Nonfatal XC0 i0 Link 00 {status}")[0] == "none"
    assert judged(f"145, RLW_RXPIPE Nonfatal XC0 i0 Link 02 {status}")[0] == "monitor"
    assert judged(f"146, TLW_CTRL Non-fatal XC0 i0 Link 1 {status}")[0] == "none"
    action, meaning = judged("146, an unexpected wording")
    assert action == "reset_gpu" and "worst case" in meaning
