"""log_triage on log lines from public reports (tests/fixtures/logs/public/SOURCE.md): the newer multi-line
fallen-off-bus message, Xid 45 naming its cause, SXid lines, IB status 4 tied to GPU Direct RDMA, NaN loss in
progress-bar fields; every hit carries the action for the node."""

from pathlib import Path

from tools.shared.triage.core import triage_paths

LOGS = Path(__file__).parent / "fixtures" / "logs" / "public"


def _triage(name):
    return triage_paths([str(LOGS / name)])


def _hit(r, sig_id):
    return next(h for h in r.signatures if h.id == sig_id)


def test_multiline_fallen_off_bus_is_found_and_drains():
    r = _triage("fallen_off_bus_multiline_dmesg.log")
    hit = _hit(r, "gpu_lost_multiline")
    assert hit.details["pci"] == "0000:b3:00.0" and hit.details["state"] == "fallen off the bus"
    assert hit.action == "drain_node" and r.action == "drain_node" and r.first_failure.signature == "gpu_lost_multiline"


def test_xid45_names_the_earlier_xid_and_is_a_consequence():
    r = _triage("xid45_caused_by_previous.log")
    hit = _hit(r, "xid")
    assert hit.role == "cause" and hit.details["caused_by"] == "Xid 149" and hit.action == "none"
    assert r.first_failure.role == "cascade"
    assert any("caused by Xid 149" in f for f in r.findings)


def test_xid79_after_pcie_link_down():
    r = _triage("xid79_pcie_link_down_syslog.log")
    assert _hit(r, "xid").action == "drain_node" and r.action == "drain_node"


def test_sxid_fatal_reboots_and_xid64_reboots():
    r = _triage("sxid_and_xid64_kernel.log")
    sx, x = _hit(r, "nvswitch_sxid"), _hit(r, "xid")
    assert sx.count == 4 and sx.action == "reboot_node"
    assert x.details["xid"] == "64" and x.action == "reboot_node"


def test_ib_status_4_points_at_gpudirect_rdma():
    r = _triage("ib_status4_vendor81_nccl.log")
    hit = _hit(r, "nccl_ib_completion_error")
    assert hit.details["status"] == "4" and hit.details["vendor"] == "81" and "GPU Direct RDMA" in hit.details["likely"]
    assert hit.action == "none"
    r12 = _triage("ib_status12_vendor129_nccl.log")
    h12 = _hit(r12, "nccl_ib_completion_error")
    assert h12.details["vendor_hex"] == "0x81" and "retry exceeded" in h12.details["likely"] and h12.action == "monitor"


def test_nan_loss_in_progress_bar_fields():
    r = _triage("loss_nan_fields.log")
    hit = _hit(r, "loss_nan")
    assert hit.count == 4 and hit.details["field"] == "avr_" and hit.action == "none"
    assert r.first_failure.signature == "loss_nan"
