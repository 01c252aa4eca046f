"""Node Health Check (LBNL NHC) failure lines through log_triage (signatures in knowledge/data/log_signatures.toml).
Lines as posted in mej/nhc #147 (an XID check), NVIDIA/deepops #660 (a GPU count check) and mej/nhc #161 / #95
(NHC's own timeout, which is not a hardware finding)."""

from tools import log_triage as lt

NHC_147 = ("Found XID errors: 63\nNode Health Check failed.  Check check_xid_errors returned 1\n"
           "ERROR:  nhc:  Health check failed:  Check check_xid_errors returned 1\n")
NHC_161 = "ERROR:  nhc:  Health check failed:  Script timed out.\n"


def triage(text: str):
    return lt.SPEC.run(lt.SPEC.Params(text=text), lambda f, m: None)


def test_a_failed_nhc_check_is_the_first_failure_and_drains():
    r = triage(NHC_147)
    assert r.verdict == "fail"
    assert r.findings[0].startswith("First failure: Node Health Check (NHC) check failed at <text>:3")
    assert "nic_health" in r.next and "gpu_health" in r.next


def test_nhc_timing_out_is_not_a_hardware_failure():
    r = triage(NHC_161)
    assert not any("check failed" in f for f in r.findings), r.findings
    assert any(f.startswith("Node Health Check (NHC) timed out") or "NHC) timed out" in f for f in r.findings)
