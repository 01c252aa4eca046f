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
