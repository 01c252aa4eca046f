"""evals/public_cases.jsonl: tool-selection cases from public reports, split by source thread.

Each case paraphrases one public GitHub issue or pull request (URL in `source`), keeping the error
strings the reporter quoted. The held-out split must not share a thread with the tune split, or the
held-out figures would measure memory of that thread's wording instead of generalisation.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from tools.evals.metrics import NONE, load_cases
from tools.evals.routers import PagesRouter, ToolText, knowledge_pages

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = ROOT / "evals" / "public_cases.jsonl"
PROJECT = ROOT / "evals" / "cases.jsonl"
THREAD = re.compile(r"^https://github\.com/[\w.-]+/[\w.-]+/(issues|pull|discussions)/\d+$")


def _cases() -> list[dict]:
    return load_cases(PUBLIC)


def test_every_case_names_its_public_source():
    cases = _cases()
    assert len(cases) >= 100
    bad = [c["id"] for c in cases if not THREAD.match(c.get("source", ""))]
    assert bad == [], f"cases without a GitHub thread URL as source: {bad}"
    assert len({c["source"] for c in cases}) == len(cases), "one case per thread"
    assert {c["split"] for c in cases} == {"tune", "heldout"}


def test_no_thread_or_thread_group_is_on_both_sides():
    sides: dict[str, set[str]] = {}
    for case in _cases():
        sides.setdefault(case.get("group", case["source"]), set()).add(case["split"])
    both = sorted(g for g, s in sides.items() if len(s) > 1)
    assert both == [], f"threads with cases in both splits: {both}"
    project_symptoms = {c["symptom"] for c in load_cases(PROJECT)}
    assert not project_symptoms & {c["symptom"] for c in _cases()}, "a public case repeats a project case"


def test_labels_are_tools_the_project_cases_use_and_out_of_scope_is_represented():
    known = {n for c in load_cases(PROJECT) for n in c["expected"] + c["acceptable"]} | {NONE}
    cases = _cases()
    unknown = sorted({n for c in cases for n in c["expected"] + c["acceptable"]} - known)
    assert unknown == []
    held = Counter(c["expected"][0] for c in cases if c["split"] == "heldout")
    assert held[NONE] >= 10 and len(held) >= 15, held


def test_pages_router_votes_with_the_knowledge_pages_symptom_words():
    pages = [{"path": "a.md", "title": "Hangs", "summary": "stuck jobs", "tools": ["hang_stack_dump"],
              "symptoms": ["training frozen at step 300", "no progress"]},
             {"path": "b.md", "title": "Disks", "summary": "slow saves", "tools": ["storage_bench", "log_triage"],
              "symptoms": ["checkpoint save takes minutes"]}]
    tools = [ToolText("hang_stack_dump", "Python stacks of every rank."),
             ToolText("storage_bench", "Filesystem throughput."), ToolText("log_triage", "Reads crash logs.")]
    router = PagesRouter(tools, pages=pages, use_embed=False)
    router.weights = (0.0, 1.0)  # the page vote alone
    votes = router.scores(["my training is frozen at step 300", "the checkpoint save takes minutes"])
    assert [router.tools[i] for i in votes.argmax(axis=1)] == ["hang_stack_dump", "storage_bench"]
    # a page naming two tools splits its vote
    assert votes[1][1] == pytest.approx(votes[1][2])


def test_pages_router_calibrates_weights_and_abstains_on_unmatched_questions():
    pages = [{"path": "a.md", "title": "Hangs", "summary": "stuck jobs", "tools": ["hang_stack_dump"],
              "symptoms": ["training frozen at step 300", "no progress"]}]
    tools = [ToolText("hang_stack_dump", "Python stacks of every rank of a stuck job."),
             ToolText("storage_bench", "Filesystem write throughput for checkpoints.")]
    router = PagesRouter(tools, pages=pages, use_embed=False)
    cases = [{"id": str(i), "symptom": s, "expected": [e], "acceptable": [], "category": "", "difficulty": ""}
             for i, (s, e) in enumerate([
        ("training frozen at step 300", "hang_stack_dump"), ("checkpoint write throughput is low", "storage_bench"),
        ("which learning rate for my lora", NONE)])]
    from tools.evals.routers import calibrate, rankings

    threshold = calibrate(router, cases)
    assert abs(sum(router.weights) - 1) < 1e-9 and min(router.scales) > 0
    first = [r[0] for r in rankings(router.scores([c["symptom"] for c in cases]), router.tools, threshold)]
    assert first == ["hang_stack_dump", "storage_bench", NONE]


def test_knowledge_pages_are_read_from_the_tree():
    pages = knowledge_pages()
    assert len(pages) >= 50 and all(p["symptoms"] and p["tools"] for p in pages)
    assert any(p["path"] == "network/fabric-diagnosis.md" for p in pages)


# Measured with bm25 on the public held-out split on 2026-12-02 (97 cases: the 68 of 2026-12-01 and 29
# written for issue 36's routing rules, which bm25 gets right less often): top1 58.8%, top1_acceptable
# 77.3%, top3 75.3%. The floors sit about 6 cases below, so a description edit that loses that many
# public reports fails here (docs/benchmarks.md has every router).
PUBLIC_HELDOUT_FLOOR = {"top1": 0.52, "top1_acceptable": 0.70, "top3": 0.69}


def test_public_heldout_routing_with_bm25_stays_above_the_floor(capsys):
    from tools.evals import run as eval_run

    assert eval_run.main(["--cases", str(PUBLIC), "--router", "bm25", "--split", "heldout", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["n"] == len(load_cases(PUBLIC, "heldout"))
    below = {k: round(report[k], 3) for k, floor in PUBLIC_HELDOUT_FLOOR.items() if report[k] < floor}
    assert below == {}, f"public held-out routing fell below {PUBLIC_HELDOUT_FLOOR}: {below}"
