"""Baseline tool routers: given a symptom, rank the server's tools with no LLM.

These are floors that a real agent must beat, and a regression check on the tool descriptions: if a
description edit makes BM25 or MiniLM pick the wrong tool more often, an agent is likely to as well.

- `BM25Router`: bm25s over each tool's name (underscores split) + title + description.
- `EmbedRouter`: all-MiniLM-L6-v2 cosine similarity (tools/evals/embed.py, numpy, offline); a tool's score
  is the best match among its name + title and each sentence of its description, so one on-point
  sentence in a long description counts (and nothing is cut at the model's 256 tokens).
- `HybridRouter`: a weighted sum of both, each scaled by constants fixed at calibration (not per
  query, so the absolute level still tells how confident the match is).
- `PagesRouter`: bm25 + embedding + a vote of the knowledge pages: the query is matched against each
  page's title, summary and `symptoms` (the words users type, written for the pages, not for the
  tools), and the best pages vote for the tools in their `tools` frontmatter. Weights and threshold
  are fitted together on the tune cases.
- `calibrate()`: on the tune split only, picks the hybrid weight and the abstention threshold: below
  it the router answers "(none)" (call no tool).
"""

import logging
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..engine.data import KNOWLEDGE_DIR
from .metrics import NONE

ROUTERS = ("bm25", "embed", "hybrid", "pages")


@dataclass(frozen=True)
class ToolText:
    name: str
    description: str
    title: str = ""

    def text(self) -> str:
        return " ".join(p for p in (self.name.replace("_", " "), self.title, self.description) if p)


_WORD = re.compile(r"[a-z0-9]+")
_STOP = frozenset("""a an and are as at be but by can do does for from has have i if in into is it its
me my of on or our so than that the their then there these this to too was we
will with you your""".split())


def _stem(word: str) -> str:
    """A deliberately small suffix stripper: hangs/hanging/hanged -> hang, gpus -> gpu, copies -> copy."""
    if len(word) <= 3 or word.isdigit():
        return word
    for suffix, repl, min_len in (("ies", "y", 5), ("sses", "ss", 5), ("ing", "", 6), ("ed", "", 5), ("es", "e", 5),
                                  ("s", "", 4)):
        if word.endswith(suffix) and len(word) >= min_len and not word.endswith("ss"):
            return word[: len(word) - len(suffix)] + repl
    return word


def tokenize(text: str) -> list[str]:
    return [_stem(w) for w in _WORD.findall(text.lower()) if w not in _STOP]


class BM25Router:
    name = "bm25"

    def __init__(self, tools: list[ToolText], k1: float = 1.2, b: float = 0.75):
        import bm25s

        logging.getLogger("bm25s").setLevel(logging.WARNING)  # it logs every index build at DEBUG
        self.tools = [t.name for t in tools]
        self._index = bm25s.BM25(k1=k1, b=b)
        self._index.index([tokenize(t.text()) for t in tools], show_progress=False)

    def scores(self, queries: list[str]) -> np.ndarray:
        rows = []
        for q in queries:
            # bm25s indexes a vocabulary; unknown query words simply score nothing.
            tokens = [t for t in tokenize(q) if t in self._index.vocab_dict]
            rows.append(self._index.get_scores(tokens) if tokens else np.zeros(len(self.tools)))
        return np.asarray(rows, dtype=np.float64).reshape(len(queries), len(self.tools))


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.;:!?])\s+|\n+", text) if len(s.strip()) > 15]


class EmbedRouter:
    name = "embed"

    def __init__(self, tools: list[ToolText]):
        from .embed import encoder

        self.tools = [t.name for t in tools]
        self._encoder = encoder()
        chunks, owner = [], []
        for i, t in enumerate(tools):
            # Name + title, then each sentence: short texts encode fast and a long description is not
            # cut off at the model's 256 tokens.
            head = " ".join(p for p in (t.name.replace("_", " "), t.title) if p)
            for chunk in [head] + _sentences(t.description):
                chunks.append(chunk)
                owner.append(i)
        self._chunk_vecs = self._encoder.encode(chunks)
        self._owner = np.asarray(owner)

    def scores(self, queries: list[str]) -> np.ndarray:
        sims = self._encoder.encode(queries) @ self._chunk_vecs.T  # (queries, chunks), cosine
        out = np.full((len(queries), len(self.tools)), -1.0)
        for i in range(len(self.tools)):
            out[:, i] = sims[:, self._owner == i].max(axis=1)
        return out


class HybridRouter:
    """weight * embed/embed_scale + (1 - weight) * bm25/bm25_scale."""

    name = "hybrid"

    def __init__(self, tools: list[ToolText], weight: float = 0.5, scales: tuple[float, float] = (1.0, 1.0)):
        self.tools = [t.name for t in tools]
        self.bm25, self.embed = BM25Router(tools), EmbedRouter(tools)
        self.weight, self.scales = weight, scales

    def parts(self, queries: list[str]) -> tuple[np.ndarray, np.ndarray]:
        return self.bm25.scores(queries), self.embed.scores(queries)

    def combine(self, bm25: np.ndarray, embed: np.ndarray) -> np.ndarray:
        return self.weight * embed / self.scales[1] + (1 - self.weight) * bm25 / self.scales[0]

    def scores(self, queries: list[str]) -> np.ndarray:
        return self.combine(*self.parts(queries))


def knowledge_pages(root: Path = KNOWLEDGE_DIR) -> list[dict]:
    """Frontmatter (title, summary, symptoms, tools) of every topic page of the knowledge tree."""
    import yaml

    pages = []
    for path in sorted(root.rglob("*.md")):
        match = re.match(r"^---\n(.*?)\n---\n", path.read_text(encoding="utf-8"), re.S)
        if path.name == "README.md" or not match:
            continue
        meta = yaml.safe_load(match.group(1)) or {}
        pages.append({"path": str(path.relative_to(root)), "title": str(meta.get("title", "")),
                      "summary": str(meta.get("summary", "")), "tools": list(meta.get("tools") or []),
                      "symptoms": [str(s) for s in meta.get("symptoms") or []]})
    return pages


class PageVote:
    """Scores tools by the knowledge pages a query matches: the `top_k` best pages (BM25 over title,
    summary and symptoms, symptoms counted twice) each add their score, divided by how many tools
    the page names, to every tool the page names."""

    def __init__(self, tools: list[str], pages: list[dict], top_k: int = 3):
        import bm25s

        logging.getLogger("bm25s").setLevel(logging.WARNING)
        self.tools, self.top_k = tools, top_k
        self.page_tools = [[tools.index(n) for n in p["tools"] if n in tools] for p in pages]
        self._index = bm25s.BM25()
        self._index.index([tokenize(" ".join([p["title"], p["summary"], *p["symptoms"], *p["symptoms"]]))
                           for p in pages], show_progress=False)

    def scores(self, queries: list[str]) -> np.ndarray:
        out = np.zeros((len(queries), len(self.tools)))
        for row, query in zip(out, queries):
            tokens = [t for t in tokenize(query) if t in self._index.vocab_dict]
            if not tokens:
                continue
            page_scores = self._index.get_scores(tokens)
            for page in np.argsort(-page_scores)[: self.top_k]:
                for tool in self.page_tools[page]:
                    row[tool] += page_scores[page] / len(self.page_tools[page])
        return out


class PagesRouter:
    """A weighted sum of bm25, the MiniLM embedding (unless use_embed=False) and the page vote, each
    part divided by a scale fixed at calibration; `weights` sum to 1, bm25 first."""

    name = "pages"

    def __init__(self, tools: list[ToolText], pages: list[dict] | None = None, use_embed: bool = True):
        self.tools = [t.name for t in tools]
        self.routers = [BM25Router(tools)] + ([EmbedRouter(tools)] if use_embed else [])
        self.vote = PageVote(self.tools, knowledge_pages() if pages is None else pages)
        self.weights = (1.0,) + (0.0,) * len(self.routers)
        self.scales = (1.0,) * (len(self.routers) + 1)

    def parts(self, queries: list[str]) -> list[np.ndarray]:
        return [r.scores(queries) for r in self.routers] + [self.vote.scores(queries)]

    def combine(self, parts: list[np.ndarray]) -> np.ndarray:
        return sum(w * p / s for w, p, s in zip(self.weights, parts, self.scales))

    def scores(self, queries: list[str]) -> np.ndarray:
        return self.combine(self.parts(queries))


def _calibrate_pages(router: PagesRouter, cases: list[dict]) -> float:
    """Scales = 95th percentile of each part's best score; weights on a 0.1 grid (bm25 keeps the
    rest), chosen for the most right first calls (expected or acceptable, half credit for expected
    alone) with each grid point's own best threshold; returns that threshold."""
    from itertools import product

    from .metrics import evaluate

    parts = router.parts([c["symptom"] for c in cases])
    router.scales = tuple(float(np.percentile(p.max(axis=1), 95)) or 1.0 for p in parts)
    grid = np.round(np.arange(0, 0.61, 0.1), 2)
    best = (-1.0, router.weights, 0.0)
    for others in product(grid, repeat=len(parts) - 1):
        if sum(others) > 0.9:
            continue
        router.weights = (round(1 - sum(others), 2), *others)
        scores = router.combine(parts)
        threshold = best_threshold(scores, router.tools, cases)
        report = evaluate(cases, rankings(scores, router.tools, threshold))
        merit = report["top1_acceptable"] + 0.5 * report["top1"]
        if merit > best[0]:
            best = (merit, router.weights, threshold)
    router.weights = best[1]
    return best[2]


def make_router(kind: str, tools: list[ToolText]):
    if kind not in ROUTERS:
        raise ValueError(f"unknown router {kind!r}; choose one of {', '.join(ROUTERS)}")
    return {"bm25": BM25Router, "embed": EmbedRouter, "hybrid": HybridRouter, "pages": PagesRouter}[kind](tools)


def rankings(scores: np.ndarray, tools: list[str], threshold: float = -np.inf) -> list[list[str]]:
    """Per query: tools best first, with "(none)" in front when the best score is below threshold."""
    out = []
    for row in scores:
        order = [tools[i] for i in np.argsort(-row, kind="stable")]
        out.append(([NONE] if row.max() < threshold else []) + order)
    return out


def best_threshold(scores: np.ndarray, tools: list[str], cases: list[dict]) -> float:
    """The abstention threshold that maximises top-1 on `cases` (the middle of the best plateau).

    Only the top score of each case matters, so the candidates are midpoints between sorted top scores.
    """
    top = np.sort(scores.max(axis=1))
    candidates = np.concatenate([[-np.inf], (top[:-1] + top[1:]) / 2, [np.inf]]) if len(top) else np.array([-np.inf])
    first = [tools[i] for i in scores.argmax(axis=1)]
    want = [c["expected"][0] for c in cases]
    best, best_hits = [], -1
    for t in candidates:
        hits = sum((NONE if s < t else f) == w for s, f, w in zip(scores.max(axis=1), first, want))
        if hits > best_hits:
            best, best_hits = [t], hits
        elif hits == best_hits:
            best.append(t)
    finite = [t for t in best if np.isfinite(t)]
    return float(finite[len(finite) // 2]) if finite else float(best[0])


def calibrate(router, cases: list[dict]) -> float:
    """Fit what the router needs on tune cases; return its abstention threshold.

    For the hybrid this also sets the score scales (the 95th percentile of each part's best score)
    and the weight (grid 0..1 by 0.1, best top-1 over the cases that expect a tool).
    """
    if isinstance(router, PagesRouter):
        return _calibrate_pages(router, cases)
    queries = [c["symptom"] for c in cases]
    if isinstance(router, HybridRouter):
        bm25, embed = router.parts(queries)
        router.scales = (float(np.percentile(bm25.max(axis=1), 95)) or 1.0,
                         float(np.percentile(embed.max(axis=1), 95)) or 1.0)
        tool_rows = [i for i, c in enumerate(cases) if c["expected"][0] != NONE]
        want = [cases[i]["expected"][0] for i in tool_rows]
        best_w, best_hits = 0.5, -1
        for w in np.round(np.linspace(0, 1, 11), 2):
            router.weight = float(w)
            first = np.asarray(router.tools)[router.combine(bm25, embed)[tool_rows].argmax(axis=1)]
            hits = int((first == np.asarray(want)).sum())
            if hits > best_hits:
                best_w, best_hits = float(w), hits
        router.weight = best_w
        scores = router.combine(bm25, embed)
    else:
        scores = router.scores(queries)
    return best_threshold(scores, router.tools, cases)
