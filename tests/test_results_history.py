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


def test_the_text_answer_lists_the_rows_it_counts():
    now = time.time()
    ids = [plant(f"node{i}", 800.0 + i, now - 60 * i) for i in range(12)]
    result = run(ResultsHistoryParams(tool="matmul_bench"), None)
    assert result.findings[0] == "12 stored result(s) match."
    listed = [f for f in result.findings if f.startswith("#")]
    assert len(listed) == 10 and listed[0].startswith(f"#{ids[0]} ")
    assert "matmul_bench on node0: ok, mamf_tflops = 800" in listed[0]
    assert result.findings[-1] == "… 2 more of these rows in `rows` (--json)."
