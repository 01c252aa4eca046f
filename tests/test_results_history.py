"""results_history judges by the one rule (tools/shared/judging.py): the figure's margin and spread from
verdict_rules.toml, the reference's own spread, inconclusive when the reference is too noisy."""

import time

from tools.engine import store
from tools.results_history import ResultsHistoryParams, run


def plant(host: str, value: float, started: float) -> int:
    return store.save("matmul_bench", {"dtype": "bf16"}, {"verdict": "ok", "mamf_tflops": value}, started=started,
                      ended=started + 1, provenance={"host": host}, metric_name="mamf_tflops")


def test_a_regression_past_the_rule_is_flagged_and_one_within_it_is_not():
    now = time.time()
    for day, value in [(5, 800.0), (4, 802.0), (3, 798.0), (2, 801.0)]:
        plant("steady", value, now - 86400 * day)
        plant("slower", value, now - 86400 * day)
    plant("steady", 780.0, now - 5)     # 2.5% below its past: inside max(5%, 3 x 1.5%)
    slower = plant("slower", 740.0, now - 5)   # 7.5% below
    result = run(ResultsHistoryParams(tool="matmul_bench"), None)
    flags = {(f.kind, f.machine): f for f in result.flags}
    assert ("regression", "slower") in flags and flags[("regression", "slower")].result_id == slower
    assert flags[("regression", "slower")].threshold_pct == 5.0
    assert ("regression", "steady") not in flags
    assert any("threshold 5%" in f for f in result.findings)


def test_a_noisy_past_is_inconclusive_not_a_regression():
    now = time.time()
    for day, value in [(6, 800.0), (5, 500.0), (4, 780.0), (3, 450.0), (2, 820.0)]:
        plant("noisy", value, now - 86400 * day)
    plant("noisy", 600.0, now - 5)
    result = run(ResultsHistoryParams(tool="matmul_bench"), None)
    assert not [f for f in result.flags if f.kind == "regression"]
    assert any(f.startswith("INCONCLUSIVE: matmul_bench mamf_tflops regression on noisy") for f in result.findings)


def test_the_answer_lists_its_rows_and_shows_one_stored_results_findings():
    # Issue 35: a pairwise run stored "verdict fail" and the agent saw only "5 stored results match".
    import pytest
    from tools.engine.spec import ToolFailure

    now = time.time()
    found = ["Suspect node mln3: slow with 3 of 3 partners (0.021 GB/s against 0.55 GB/s).",
             "pairwise: 4 nodes, 3 rounds, 6 groups (0 failed or hung), 41 s"]
    rid = store.save("collective_bench", {"pattern": "pairwise"},
                     {"verdict": "fail", "findings": found, "next": ["env_report"], "busbw_gbps": None},
                     started=now - 60, ended=now, provenance={"host": "login1"}, metric_name="busbw_gbps", job_id="77")
    plant("gpu-01", 800.0, now - 120)
    listed = run(ResultsHistoryParams(), None)
    assert listed.findings[0] == "2 stored result(s) match."
    rows = listed.findings[listed.findings.index("Rows, newest first (result_id=N shows one whole):") + 1:]
    assert rows[0].startswith(f"#{rid} ") and "collective_bench on login1: fail - Suspect node mln3: slow" in rows[0]
    assert "matmul_bench on gpu-01: ok, mamf_tflops 800" in rows[1]
    assert listed.rows[0].headline == found[0]
    shown = run(ResultsHistoryParams(result_id=rid), None)
    assert shown.findings[0].startswith(f"Result #{rid}: collective_bench on login1 at ")
    assert "(background job 77), verdict fail" in shown.findings[0] and shown.findings[1:] == found
    assert "SLURM" not in shown.findings[0]        # the handle is the engine's own, not a SLURM job id
    assert shown.next == ["env_report"] and shown.shown.params == {"pattern": "pairwise"}
    assert shown.shown.result["verdict"] == "fail"
    with pytest.raises(ToolFailure, match=r"^result_id: no stored result #999999"):
        run(ResultsHistoryParams(result_id=999999), None)

def test_the_text_answer_lists_the_rows_it_counts():
    now = time.time()
    ids = [plant(f"node{i}", 800.0 + i, now - 60 * i) for i in range(12)]
    result = run(ResultsHistoryParams(tool="matmul_bench"), None)
    assert result.findings[0] == "12 stored result(s) match."
    listed = [f for f in result.findings if f.startswith("#")]
    assert len(listed) == 10 and listed[0].startswith(f"#{ids[0]} ")
    assert "matmul_bench on node0: ok, mamf_tflops 800" in listed[0]
    assert result.findings[-1] == "… 2 more of these rows in `rows` (--json)."
