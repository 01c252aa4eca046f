"""Scoring a tool router against the eval cases: pure functions, no MCP, no model.

A case is one JSON line: {"id", "symptom", "expected": [tool...], "acceptable": [tool...], "category",
"difficulty", "split"}. `expected` lists the right first calls (usually one); `["(none)"]` means the
agent should call no tool. A prediction is the router's ranking of labels for the case, best first; a router that
abstains puts "(none)" first (tools may follow it, so top-3 still sees them).

Metrics (all fractions of cases, with Wilson 95% intervals):
- top1: ranking[0] in expected, over every case ((none) cases included);
- top1_acceptable: ranking[0] in expected + acceptable;
- top3: an expected label within ranking[:3];
- abstain_accuracy: over (none) cases, the share where the router abstained;
- false_call_rate: over (none) cases, the share where it called a tool instead
  (for a single first call this is 1 - abstain_accuracy; both are reported because both are asked for);
- false_abstain_rate: over tool cases, the share where it abstained although a tool was expected;
- per_tool: precision / recall / support of the first call per label, and a confusion list
  (expected -> predicted, count, case ids) of the wrong first calls;
- by_difficulty, by_category: top1 and n within each group (where the router is weak).
"""

import json
import math
from collections import Counter, defaultdict
from pathlib import Path

NONE = "(none)"
_FIELDS = {"id": str, "symptom": str, "expected": list, "acceptable": list, "category": str,
           "difficulty": str, "split": str}


def load_cases(path: str | Path, split: str = "all") -> list[dict]:
    """Read a cases file and keep the given split ('all' keeps every case).

    Raises ValueError naming the line of the first malformed case. A file from elsewhere may leave out
    `acceptable`, `category`, `difficulty` or `split`; they default to [], "", "" and "heldout"; any
    split name is accepted (`split` filters on it).
    """
    cases, seen = [], set()
    for lineno, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            case = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{lineno}: not JSON ({e})") from None
        case = {"acceptable": [], "category": "", "difficulty": "", "split": "heldout", **case}
        for field, kind in _FIELDS.items():
            if not isinstance(case.get(field), kind):
                raise ValueError(f"{path}:{lineno}: field {field!r} must be a {kind.__name__}, got {case.get(field)!r}")
        if not case["expected"] or not all(isinstance(t, str) for t in case["expected"] + case["acceptable"]):
            raise ValueError(f"{path}:{lineno}: 'expected' must be a non-empty list of tool names")
        if case["id"] in seen:
            raise ValueError(f"{path}:{lineno}: duplicate id {case['id']!r}")
        seen.add(case["id"])
        cases.append(case)
    if split != "all":
        cases = [c for c in cases if c["split"] == split]
    return cases


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a proportion (95% with z=1.96). (0, 1) when n == 0."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def _rate(successes: int, n: int) -> dict:
    lo, hi = wilson(successes, n)
    return {"value": successes / n if n else None, "k": successes, "n": n, "ci95": [round(lo, 4), round(hi, 4)]}


def evaluate(cases: list[dict], rankings: list[list[str]]) -> dict:
    """Score rankings (one per case, same order) against the cases. See the module docstring."""
    if len(cases) != len(rankings):
        raise ValueError(f"{len(cases)} cases but {len(rankings)} rankings")
    hits = Counter()
    none_cases = tool_cases = 0
    predicted_count, correct_count, expected_count = Counter(), Counter(), Counter()
    confusion = defaultdict(list)
    groups = {"by_difficulty": defaultdict(lambda: [0, 0]), "by_category": defaultdict(lambda: [0, 0])}
    for case, ranking in zip(cases, rankings):
        first = ranking[0] if ranking else NONE
        # The label this case counts under: the first call when it is one of the expected ones.
        want = first if first in case["expected"] else case["expected"][0]
        ok = set(case["expected"]) | set(case["acceptable"])
        hits["top1"] += first == want
        for key, field in (("by_difficulty", "difficulty"), ("by_category", "category")):
            groups[key][case[field]][0] += first == want
            groups[key][case[field]][1] += 1
        hits["top1_acceptable"] += first in ok
        hits["top3"] += bool(set(case["expected"]) & set(ranking[:3] if ranking else [NONE]))
        if want == NONE:
            none_cases += 1
            hits["abstained"] += first == NONE
        else:
            tool_cases += 1
            hits["false_abstain"] += first == NONE
        expected_count[want] += 1
        predicted_count[first] += 1
        if first == want:
            correct_count[want] += 1
        else:
            confusion[(want, first)].append(case["id"])
    n = len(cases)
    rates = {
        "top1": _rate(hits["top1"], n),
        "top1_acceptable": _rate(hits["top1_acceptable"], n),
        "top3": _rate(hits["top3"], n),
        "abstain_accuracy": _rate(hits["abstained"], none_cases),
        "false_call_rate": _rate(none_cases - hits["abstained"], none_cases),
        "false_abstain_rate": _rate(hits["false_abstain"], tool_cases),
    }
    per_tool = {}
    for label in sorted(set(expected_count) | set(predicted_count)):
        tp = correct_count[label]
        per_tool[label] = {
            "support": expected_count[label],
            "predicted": predicted_count[label],
            "precision": round(tp / predicted_count[label], 4) if predicted_count[label] else None,
            "recall": round(tp / expected_count[label], 4) if expected_count[label] else None,
        }
    return {
        "n": n,
        **{name: r["value"] for name, r in rates.items()},
        "ci95": {name: r["ci95"] for name, r in rates.items()},
        "counts": {name: [r["k"], r["n"]] for name, r in rates.items()},
        "per_tool": per_tool,
        **{key: {name: {"top1": round(k / n, 4), "n": n} for name, (k, n) in sorted(g.items())}
           for key, g in groups.items()},
        "confusion": [
            {"expected": want, "predicted": got, "count": len(ids), "ids": ids}
            for (want, got), ids in sorted(confusion.items(), key=lambda kv: (-len(kv[1]), kv[0]))
        ],
    }
