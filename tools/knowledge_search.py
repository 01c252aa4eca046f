"""knowledge_search — ranked search over the knowledge tree; returns sections with their URIs.

BM25 (bm25s) over sections: each section is indexed with its page's title, summary and symptom
phrases, so a question in users' words ("why is busbw higher than algbw") finds the right page even
when the page's prose says it differently. Results are deduplicated to one hit per page.

By hand:
    mleng run knowledge_search --query "what does xid 79 mean"
"""

import functools
import re

from .engine.spec import Field, Params, Record, Result, ToolFailure, ToolSpec

STOPWORDS = frozenset(
    "a an and are as at be but by can do does for from how i if in into is it its my of on or our so that the "
    "their then there these this to was we what when where which who why will with you your me should would "
    "could get got".split())
TOKEN = re.compile(r"[a-z0-9][a-z0-9_.+-]*[a-z0-9+]|[a-z0-9]")


def tokenize(text: str) -> list[str]:
    """Lowercase words; keeps NCCL_IB_HCA, bf16, 2.5, h100-sxm whole, and their parts too."""
    out = []
    for tok in TOKEN.findall(text.lower()):
        if tok in STOPWORDS:
            continue
        out.append(tok)
        parts = re.split(r"[_.+-]", tok)
        if len(parts) > 1:
            out += [p for p in parts if p and p not in STOPWORDS]
    return out


@functools.lru_cache(maxsize=2)
def _index(pages: tuple):
    import bm25s

    docs, meta = [], []
    for page in pages:
        header = " ".join([page.title, page.summary, *page.symptoms, page.path.replace("/", " ").replace("-", " ")])
        for sec in page.sections:
            # The page's own words for itself count twice: titles and symptoms are what users type.
            docs.append(tokenize(f"{header} {header} {' '.join(sec.heading_path)} {sec.text}"))
            meta.append((page, sec))
    retriever = bm25s.BM25()
    retriever.index(docs, show_progress=False)
    return retriever, meta


def search(query: str, k: int = 5) -> list[tuple[float, object, object]]:
    """[(score, page, section)], best first, at most one section per page."""
    from .engine.knowledge import load_pages  # markdown-it and yaml only when a search is made

    pages = load_pages()
    if not pages:
        raise ToolFailure("the knowledge tree is empty: reinstall mleng from a full checkout")
    retriever, meta = _index(pages)
    tokens = tokenize(query)
    if not tokens:
        return []
    n = len(meta)
    docs, scores = retriever.retrieve([tokens], k=min(n, max(50, k * 10)), show_progress=False)
    seen, hits = set(), []
    for i, score in zip(docs[0], scores[0]):
        page, sec = meta[int(i)]
        if score <= 0 or page.path in seen:
            continue
        seen.add(page.path)
        hits.append((float(score), page, sec))
        if len(hits) == k:
            break
    return hits


def snippet(text: str, tokens: list[str], width: int = 280) -> str:
    """The stretch of `text` around the first query word it contains, on one line."""
    flat = " ".join(text.split())
    low = flat.lower()
    pos = min((low.find(t) for t in tokens if t in low), default=0)
    start = max(0, pos - width // 3)
    piece = flat[start:start + width]
    return ("…" if start else "") + piece + ("…" if start + width < len(flat) else "")


class KnowledgeSearchParams(Params):
    query: str = Field(min_length=2, max_length=500,
                       description="The user's words or keywords ('xid 79').")
    k: int = Field(5, ge=1, le=20, description="Pages returned (one section each).")


class Hit(Record):
    uri: str = Field(description="knowledge:// URI of the page; read it as an MCP resource.")
    section: str = Field(description="Heading path of the best-matching section.")
    anchor: str = Field(description="Section anchor within the page ('' for the page intro).")
    title: str = Field(description="Page title.")
    summary: str = Field(description="Page summary (one sentence).")
    snippet: str = Field(description="Up to ~280 characters of the section around the query words.")
    score: float = Field(description="BM25 score (higher is better; comparable within one query only).")


class KnowledgeSearchResult(Result):
    hits: list[Hit] = Field(default_factory=list, description="Best first.")


def run(params: KnowledgeSearchParams, progress) -> KnowledgeSearchResult:
    tokens = tokenize(params.query)
    hits = [Hit(uri=page.uri, section=" > ".join(sec.heading_path), anchor=sec.anchor, title=page.title,
                summary=page.summary, snippet=snippet(sec.text, tokens), score=round(score, 3))
            for score, page, sec in search(params.query, params.k)]
    if not hits:
        return KnowledgeSearchResult(findings=[f"Nothing in the knowledge tree matches {params.query!r}; "
                                               "try other words, or read knowledge://index."],
                                     next=["knowledge://index"])
    return KnowledgeSearchResult(
        hits=hits, findings=[f"Best match: {hits[0].title} ({hits[0].uri}) — {hits[0].summary}"],
        next=[h.uri for h in hits[:3]])


SPEC = ToolSpec(
    name="knowledge_search",
    summary="Search the knowledge tree (cheatsheets and insights); returns sections with resource URIs.",
    description=(
        "Answers explanation questions from mleng's knowledge tree without running anything: why, how does X "
        "work, what is, difference between, best practice, should I, is it worth, what should the number be "
        "('why is busbw higher than algbw', 'what does Xid 79 mean', 'how much memory does Adam need per "
        "parameter', 'what is MAMF'). Returns sections with knowledge:// URIs. Covers NCCL and TORCH_ "
        "variables, hangs and NCCL debugging, NVLink/NVLS, InfiniBand, RoCE, EFA, GPUDirect RDMA, Xid/ECC, "
        "MAMF vs datasheet, ZeRO/FSDP and parallelism, mixed precision (fp16/bf16/fp8), loss spikes and NaNs, "
        "memory fragmentation (expandable_segments), /dev/shm, pinned memory, NUMA, checkpointing to shared "
        "filesystems, SLURM and Kubernetes, fault tolerance, serving metrics (TTFT, TPOT), KV cache, "
        "batching, tiny test models. Instant. A figure from the user's own machines needs a measuring tool."),
    Params=KnowledgeSearchParams, Result=KnowledgeSearchResult, run=run, store=False,
)

if __name__ == "__main__":
    from .engine.cli import tool_main

    tool_main(SPEC)
