"""The `diagnose` prompt's plan: the tools whose descriptions best match the symptom the user gave.

A small lexical match (IDF-weighted word overlap between the symptom and each tool's title and
description, as the server publishes them), so the plan follows the descriptions without naming any
tool here. The agent still reads the results and follows `next`; this only orders the first steps.
"""

import math
import re

_WORD = re.compile(r"[a-z0-9][a-z0-9_.+-]*[a-z0-9]|[a-z0-9]")
_STOP = frozenset("""a an and are as at be but by can do does for from has have how i if in into is it its me my
no not of on or our so than that the their then there these this to too was we what when which why will with
you your use used using one all any per""".split())
PLAN_LENGTH = 4


def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s"):
        if len(word) > len(suffix) + 3 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


def words(text: str) -> set[str]:
    return {_stem(w) for w in _WORD.findall(text.lower()) if w not in _STOP}


def rank_tools(symptom: str, tools: list[dict]) -> list[tuple[str, float]]:
    """[(tool name, score)] best first, only tools that share a word with the symptom."""
    docs = {t["name"]: words(f"{t['name'].replace('_', ' ')} {t.get('title') or ''} {t.get('description') or ''}")
            for t in tools}
    df: dict[str, int] = {}
    for vocab in docs.values():
        for w in vocab:
            df[w] = df.get(w, 0) + 1
    query = words(symptom)
    scores = {name: sum(math.log(len(docs) / df[w]) for w in query & vocab) for name, vocab in docs.items()}
    return sorted(((n, s) for n, s in scores.items() if s > 0), key=lambda item: -item[1])


def plan_text(symptom: str, tools: list[dict]) -> str:
    ranked = rank_tools(symptom, tools)
    # a weak match far behind the best is noise, not a step of the plan
    ranked = [(n, sc) for n, sc in ranked if sc >= 0.4 * ranked[0][1]][:PLAN_LENGTH] if ranked else []
    titles = {t["name"]: t.get("title") or "" for t in tools}
    if ranked:
        steps = "\n".join(f"{i}. {name}: {titles[name]}" for i, (name, _) in enumerate(ranked, 1))
        plan = (f"Tools whose descriptions match this symptom, best match first:\n{steps}\n\nRun the cheapest "
                "read-only one that fits first (logs, versions, health: seconds) and GPU benchmarks or "
                "multi-rank runs only after it points there. Say what each result would rule in or out.")
    else:
        plan = ("No tool description matches this symptom: it may be a question to answer from the knowledge "
                "tree (knowledge://index) or without tools.")
    others = ", ".join(sorted(set(titles) - {n for n, _ in ranked}))
    return (f"A user reports: {symptom}\n\nWork out the cause with measurements, not guesses.\n\n{plan}\n\n"
            "Then run the first tool, read its verdict, findings and `next`, and continue. Finish with the "
            f"named culprit (rank, node, link, setting) and the fix.\n\nOther tools: {others}")
