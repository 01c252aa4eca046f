"""Structural checks of the knowledge tree: frontmatter, links, tool names, data tables, size."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import yaml

from tools.engine.registry import registry
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[1]
KNOWLEDGE = ROOT / "knowledge"

# Derived, not copied: the catalog is the registry, the areas are the tree's folders.
CATALOG = set(registry())
AREAS = sorted(d.name for d in KNOWLEDGE.iterdir() if d.is_dir() and d.name not in ("data", "__pycache__"))

# A backticked word that looks like one of our tools (ends like a catalog name does).
TOOL_LIKE = re.compile(
    r"^[a-z0-9]+(?:_[a-z0-9]+)*_(?:bench|test|report|health|topology|analyze|triage|estimate|calc|"
    r"roi|status|diagnose|script|specs|search|history|dump|bandwidth|cancel|benchmark|analyzer|analysis)$")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
URI = re.compile(r"knowledge://([\w./-]+\.md)")
MAX_LINES = 400

PAGES = sorted(p for p in KNOWLEDGE.rglob("*.md"))
TOPIC_PAGES = [p for p in PAGES if p.name != "README.md"]


def _split(page: Path) -> tuple[dict, str]:
    text = page.read_text()
    m = re.match(r"^---\n(.*?)\n---\n(.*)$", text, re.S)
    assert m, f"{page.relative_to(ROOT)}: no YAML frontmatter between '---' lines"
    meta = yaml.safe_load(m.group(1))
    assert isinstance(meta, dict), f"{page.relative_to(ROOT)}: frontmatter is not a mapping"
    return meta, m.group(2)


def _ids(pages):
    return [str(p.relative_to(KNOWLEDGE)) for p in pages]


def test_every_area_has_an_index_and_the_tree_is_not_thin():
    missing = [f"{area}/README.md" for area in AREAS if not (KNOWLEDGE / area / "README.md").exists()]
    if not (KNOWLEDGE / "README.md").exists():
        missing.append("README.md")
    assert not missing, f"agreed pages missing: {missing}"
    assert len(TOPIC_PAGES) >= 40


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_page_frontmatter_is_valid(page):
    meta, body = _split(page)
    rel = page.relative_to(ROOT)
    for key in ("title", "summary"):
        assert isinstance(meta.get(key), str) and meta[key].strip(), f"{rel}: '{key}' missing or empty"
    assert meta["summary"].count(". ") == 0, f"{rel}: summary should be one sentence"
    for key in ("symptoms", "tools", "sources"):
        assert isinstance(meta.get(key), list), f"{rel}: '{key}' must be a list"
    assert meta["sources"], f"{rel}: a page needs sources"
    bad = [s for s in meta["sources"] if not re.match(r"^https?://\S+$", str(s))]
    assert not bad, f"{rel}: sources must be URLs: {bad}"
    if page.name != "README.md":
        assert meta["symptoms"], f"{rel}: a topic page needs symptoms users type"
    unknown = set(meta["tools"]) - CATALOG
    assert not unknown, f"{rel}: frontmatter tools not in the catalog: {sorted(unknown)}"
    tokens = MarkdownIt().parse(body)
    assert any(t.type == "heading_open" for t in tokens), f"{rel}: no headings"


def _backticked(body: str) -> set[str]:
    found = set()
    for tok in MarkdownIt().parse(body):
        for child in tok.children or []:
            if child.type == "code_inline":
                found.add(child.content.strip())
    return found


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_backticked_tool_names_are_in_catalog(page):
    _, body = _split(page)
    unknown = {w for w in _backticked(body) if TOOL_LIKE.match(w) and w not in CATALOG}
    assert not unknown, f"{page.relative_to(ROOT)}: tool-like names not in the catalog: {sorted(unknown)}"


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_relative_links_and_uris_resolve(page):
    _, body = _split(page)
    broken = []
    for target in LINK.findall(body):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        if not (page.parent / path).resolve().exists():
            broken.append(target)
    for uri in URI.findall(body):
        if not (KNOWLEDGE / uri).exists():
            broken.append(f"knowledge://{uri}")
    assert not broken, f"{page.relative_to(ROOT)}: broken links: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_page_is_short(page):
    n = len(page.read_text().splitlines())
    assert n <= MAX_LINES, f"{page.relative_to(ROOT)}: {n} lines (max {MAX_LINES}); split the topic"


def test_every_catalog_tool_is_referenced_by_a_page():
    referenced = set()
    for page in PAGES:
        meta, body = _split(page)
        referenced |= set(meta.get("tools") or []) | _backticked(body)
    missing = CATALOG - referenced
    assert not missing, f"catalog tools no page mentions: {sorted(missing)}"


def test_every_page_is_linked_from_its_area_index():
    unlinked = []
    for page in TOPIC_PAGES:
        index = page.parent / "README.md"
        if not index.exists() or f"({page.name})" not in index.read_text():
            unlinked.append(str(page.relative_to(KNOWLEDGE)))
    root = (KNOWLEDGE / "README.md").read_text() if (KNOWLEDGE / "README.md").exists() else ""
    unlinked += [f"{area}/README.md" for area in AREAS if f"({area}/README.md)" not in root]
    assert not unlinked, f"pages no index links to: {unlinked}"


def _render_module():
    spec = importlib.util.spec_from_file_location("knowledge_render", KNOWLEDGE / "render.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_data_tables_in_pages_match_the_data():
    render = _render_module()
    stale = [str(p.relative_to(KNOWLEDGE)) for p in PAGES
             if render.render_text(p.read_text(), p) != p.read_text()]
    assert not stale, f"pages whose tables disagree with knowledge/data: {stale}; run python knowledge/render.py"


def test_render_rewrites_a_stale_block(tmp_path):
    render = _render_module()
    stale = "# x\n<!-- data:interconnects.links -->\n| old | table |\n<!-- /data -->\n"
    out = render.render_text(stale)
    assert "| old | table |" not in out
    assert out.startswith("# x\n<!-- data:interconnects.links -->\n") and out.endswith("<!-- /data -->\n")
    with pytest.raises(KeyError):
        render.render_text("<!-- data:nonsense -->\n<!-- /data -->")


def test_data_pages_carry_the_data_blocks():
    acc = (KNOWLEDGE / "compute" / "accelerators.md").read_text()
    bw = (KNOWLEDGE / "network" / "expected-bandwidth.md").read_text()
    assert "<!-- data:accelerators -->" in acc
    assert "<!-- data:interconnects.expected_busbw -->" in bw


# Figures quoted in prose (outside rendered tables) and the data they must agree with:
# (page, the number as written on the page, data file, record id, dotted key inside the record).
PROSE_FIGURES = [
    ("network/intra-node.md", "370", "interconnects", "expected_busbw", "8x-h100-nvlink4-ring", "busbw_gbps"),
    ("network/intra-node.md", "480", "interconnects", "expected_busbw", "8x-h100-nvlink4-nvls", "busbw_gbps"),
    ("network/intra-node.md", "349", "interconnects", "expected_busbw", "2x-h200-nvlink4-ring-measured", "busbw_gbps"),
    ("network/busbw.md", "480", "interconnects", "expected_busbw", "8x-h100-nvlink4-nvls", "busbw_gbps"),
    ("network/busbw.md", "450", "interconnects", "link", "nvlink4", "per_gpu_unidir_gbps"),
    ("network/inter-node.md", "47", "interconnects", "expected_busbw", "ib-ndr-per-nic", "busbw_gbps"),
    ("insights/lessons.md", "480", "interconnects", "expected_busbw", "8x-h100-nvlink4-nvls", "busbw_gbps"),
    ("compute/theoretical-vs-achievable.md", "989", "accelerators", "accelerator", "h100-sxm", "dense_tflops.bf16"),
    ("compute/amd.md", "668.4", "accelerators", "accelerator", "mi300x", "mamf_bf16_tflops"),
    ("compute/amd.md", "1307.4", "accelerators", "accelerator", "mi300x", "dense_tflops.bf16"),
    ("compute/amd.md", "192", "accelerators", "accelerator", "mi300x", "memory_gb"),
    ("compute/accelerators.md", "141", "accelerators", "accelerator", "h200", "memory_gb"),
    ("compute/accelerators.md", "180", "accelerators", "accelerator", "b200", "memory_gb"),
    ("insights/upgrade-roi.md", "1745", "accelerators", "accelerator", "b200", "mamf_bf16_tflops"),
    ("insights/upgrade-roi.md", "794.5", "accelerators", "accelerator", "h100-sxm", "mamf_bf16_tflops"),
    ("insights/upgrade-roi.md", "7.7", "accelerators", "accelerator", "b200", "memory_bandwidth_tbps"),
    ("insights/upgrade-roi.md", "4.8", "accelerators", "accelerator", "h200", "memory_bandwidth_tbps"),
    ("insights/upgrade-roi.md", "3.35", "accelerators", "accelerator", "h100-sxm", "memory_bandwidth_tbps"),
    ("inference/serving-metrics.md", "3.35", "accelerators", "accelerator", "h100-sxm", "memory_bandwidth_tbps"),
    ("compute/mamf.md", "794.5", "accelerators", "accelerator", "h100-sxm", "mamf_bf16_tflops"),
    ("compute/memory-bandwidth.md", "3.35", "accelerators", "accelerator", "h100-sxm", "memory_bandwidth_tbps"),
    ("compute/memory-bandwidth.md", "4.8", "accelerators", "accelerator", "h200", "memory_bandwidth_tbps"),
    ("compute/memory-bandwidth.md", "989", "accelerators", "accelerator", "h100-sxm", "dense_tflops.bf16"),
]


def _data_value(stem: str, table: str, record_id: str, key: str):
    import tomllib
    with (KNOWLEDGE / "data" / f"{stem}.toml").open("rb") as f:
        records = [r for r in tomllib.load(f).get(table, []) if r.get("id") == record_id]
    assert records, f"{stem}.toml has no [[{table}]] with id '{record_id}'"
    value = records[0]
    for part in key.split("."):
        value = value[part]
    return value


@pytest.mark.parametrize("page,written,stem,table,record_id,key", PROSE_FIGURES,
                         ids=[f"{p[0]}:{p[1]}" for p in PROSE_FIGURES])
def test_prose_figures_agree_with_data(page, written, stem, table, record_id, key):
    text = (KNOWLEDGE / page).read_text()
    assert re.search(rf"(?<![\d.]){re.escape(written)}(?![\d])", text), f"{page} no longer quotes {written}"
    value = float(_data_value(stem, table, record_id, key))
    # the page may round (989 for 989.4), but not disagree
    assert abs(float(written) - value) <= max(0.5, 0.005 * value), (
        f"{page} says {written} but {stem}.toml {record_id}.{key} = {value}; update the page")


def test_knowledge_uris_used_elsewhere_resolve():
    """Tools' `next` lists, data files and SKILL.md point into the tree: those pages must exist."""
    sources = [*ROOT.glob("tools/**/*.py"), *KNOWLEDGE.glob("data/*.toml"), ROOT / "SKILL.md"]
    broken = []
    for path in sources:
        if not path.exists():
            continue
        for uri in URI.findall(path.read_text()):
            if not (KNOWLEDGE / uri).exists():
                broken.append(f"{path.relative_to(ROOT)}: knowledge://{uri}")
    assert not broken, "knowledge:// URIs that point at no page:\n" + "\n".join(broken)
