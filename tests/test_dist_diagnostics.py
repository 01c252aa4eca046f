"""dist_smoke_test's NCCL_RUN_DIAGNOSTICS option: what it says for old NCCL, for a run without a report, and
for a report (the option sets the variable on every rank; NCCL >= 2.31 prints 'NCCL DIAG' lines)."""

from tools.dist_smoke_test import DistSmokeTestParams, diagnostics_findings


def test_old_nccl_says_the_option_has_no_effect():
    out = diagnostics_findings(["2.27.5", "2.27.5"], "")
    assert "no effect with NCCL 2.27.5" in out[0] and "2.31" in out[0]


def test_no_report_in_the_output_is_said():
    assert "no 'NCCL DIAG' line" in diagnostics_findings(["2.31.1"], "some output\n")[0]


def test_report_lines_are_quoted_and_failures_first():
    output = ("node1:1:1 [0] NCCL DIAG P2P check: 28 edges passed\n"
              "node1:1:1 [0] NCCL DIAG P2P check: GPU 3 -> GPU 5 failed (data mismatch)\n")
    out = diagnostics_findings(["2.31.1"], output)
    assert out[0].startswith("NCCL's start-up diagnostics report problems") and "GPU 3 -> GPU 5" in out[0]


def test_gloo_runs_say_it_does_not_apply():
    assert "used gloo" in diagnostics_findings([], "", "gloo")[0]


def test_the_option_is_a_parameter():
    assert DistSmokeTestParams(nccl_diagnostics=True).nccl_diagnostics is True
