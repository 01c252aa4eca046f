"""Render data tables into knowledge pages from knowledge/data/*.toml (one source of truth).

A page marks a block like this (data blocks: accelerators, accelerators.mamf,
interconnects.links, interconnects.gpu_links, interconnects.network, interconnects.expected_busbw,
xid_catalog;
page blocks: index = the pages beside an area README, tree = every area, for knowledge/README.md):

    <!-- data:accelerators -->
    (anything; replaced on render)
    <!-- /data -->

Run `python knowledge/render.py` to rewrite every marked block from the data files;
`python knowledge/render.py --check` exits 1 and names the pages that disagree with the data.
Stdlib + tomllib only.
"""
from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

KNOWLEDGE = Path(__file__).resolve().parent
DATA = KNOWLEDGE / "data"

BLOCK = re.compile(r"(<!-- data:(?P<name>[a-z_.]+) -->\n)(?P<body>.*?)(<!-- /data -->)", re.S)


def _load(stem: str) -> dict | None:
    path = DATA / f"{stem}.toml"
    if not path.exists():
        return None
    with path.open("rb") as f:
        return tomllib.load(f)


def _num(value) -> str:
    if value is None or value == "":
        return "–"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _read_on(records: list[dict], stem: str) -> str:
    """One line under a table: when its figures were read from their sources (`read_on` per record)."""
    dates: dict[str, list[str]] = {}
    for rec in records:
        dates.setdefault(rec.get("read_on", "date not recorded"), []).append(rec.get("id", "?"))
    if len(dates) == 1:
        return f"\n_Figures as read on {next(iter(dates))} from the sources in `knowledge/data/{stem}.toml`._\n"
    parts = [f"{d} ({', '.join(ids)})" for d, ids in sorted(dates.items())]
    return f"\n_Figures as read on {'; '.join(parts)}, from the sources in `knowledge/data/{stem}.toml`._\n"


def _missing(stem: str) -> str:
    return f"_`knowledge/data/{stem}.toml` is not present yet; run `python knowledge/render.py` once it is._\n"


def render_accelerators(data: dict) -> str:
    rows = []
    for acc in data.get("accelerator", []):
        tf = acc.get("dense_tflops", {})
        mamf = acc.get("mamf_bf16_tflops")
        bf16 = tf.get("bf16")
        eff = f"{100 * mamf / bf16:.0f}%" if mamf and bf16 else "–"
        rows.append([
            f"`{acc['id']}`", acc.get("name", ""), _num(acc.get("memory_gb")),
            _num(acc.get("memory_bandwidth_tbps")), _num(bf16), _num(tf.get("fp8")),
            _num(tf.get("fp4")), _num(mamf), eff, acc.get("interconnect", "–"),
            _num(acc.get("interconnect_gbps")), _num(acc.get("tdp_w")),
        ])
    header = ["id", "name", "memory GB", "mem BW TB/s", "bf16 TFLOPS", "fp8 TFLOPS", "fp4 TFLOPS",
              "MAMF bf16 TFLOPS", "MAMF/peak", "interconnect", "link GB/s/dir", "TDP W"]
    return _table(header, rows) + _read_on(data.get("accelerator", []), "accelerators")


def render_links(data: dict) -> str:
    rows = [[f"`{link['id']}`", link.get("name", ""), _num(link.get("per_gpu_unidir_gbps"))]
            for link in data.get("link", [])]
    return _table(["id", "name", "GB/s per GPU, one direction"], rows) + _read_on(data.get("link", []), "interconnects")


def render_expected_busbw(data: dict) -> str:
    rows = []
    for e in data.get("expected_busbw", []):
        gpus = e.get("gpus")
        rows.append([
            f"`{e['id']}`", ", ".join(e.get("accelerators", [])) or "any",
            "per NIC" if gpus == 0 else _num(gpus), e.get("link", ""), e.get("algo", ""),
            e.get("op", ""), _num(e.get("busbw_gbps")), e.get("notes", "").strip().replace("\n", " "),
        ])
    return (_table(["id", "accelerators", "GPUs", "link", "algo", "op", "busbw GB/s", "notes"], rows)
            + _read_on(data.get("expected_busbw", []), "interconnects"))


def render_mamf(data: dict) -> str:
    rows = []
    for acc in data.get("accelerator", []):
        mamf, bf16 = acc.get("mamf_bf16_tflops"), acc.get("dense_tflops", {}).get("bf16")
        if mamf and bf16:
            rows.append([acc.get("name", acc["id"]), _num(bf16), _num(mamf), f"{100 * mamf / bf16:.0f}%"])
    dated = [a for a in data.get("accelerator", []) if a.get("mamf_bf16_tflops")]
    return (_table(["accelerator", "datasheet bf16 TFLOPS (dense)", "published MAMF bf16 TFLOPS", "share"], rows)
            + _read_on(dated, "accelerators"))


def _links(data: dict, kinds: set[str]) -> list[dict]:
    return [link for link in data.get("link", []) if link.get("kind") in kinds]


def render_gpu_links(data: dict) -> str:
    rows = [[link.get("name", link["id"]), _num(link.get("links_per_gpu")), _num(link.get("per_gpu_unidir_gbps"))]
            for link in _links(data, {"nvlink", "pcie"})]
    return (_table(["link", "links per GPU", "GB/s per GPU, one direction"], rows)
            + _read_on(_links(data, {"nvlink", "pcie"}), "interconnects"))


def render_network(data: dict) -> str:
    per_nic = {e["link"]: e.get("busbw_gbps") for e in data.get("expected_busbw", []) if e.get("gpus") == 0}
    rows = []
    for link in _links(data, {"infiniband", "roce", "efa"}):
        gbits = link.get("per_nic_gbits")
        rows.append([link.get("name", link["id"]), f"{_num(gbits)} Gb/s" if gbits else "–",
                     _num(link.get("per_gpu_unidir_gbps")), _num(per_nic.get(link["id"]))])
    return (_table(["fabric", "line rate per NIC", "GB/s per NIC", "all_reduce busbw per NIC, Ring (GB/s)"], rows)
            + _read_on(_links(data, {"infiniband", "roce", "efa"}), "interconnects"))


def render_xid(data: dict) -> str:
    cat = data.get("catalog", {})
    rows = [[code, r["description"] + (f": {r['note']}" if r.get("note") else ""), r["immediate"],
             r["action"], r["on_repeat"]]
            for code, r in sorted(data.get("xid", {}).items(), key=lambda kv: int(kv[0]))]
    head = (f"_From NVIDIA's Xid catalog ({cat.get('source', '')}, read {cat.get('read', '?')}; {cat.get('version', '')})."
            " `NVIDIA` is the catalog's immediate resolution bucket; `now` / `if it repeats` are what mleng's tools"
            " answer (knowledge/data/xid_catalog.toml says why 64 and 79 differ)._\n\n")
    return head + _table(["Xid", "meaning", "NVIDIA", "now", "if it repeats"], rows)


def _frontmatter(page: Path) -> dict[str, str]:
    """title and summary from a page's frontmatter (simple one-line keys; no YAML dependency)."""
    m = re.match(r"^---\n(.*?)\n---\n", page.read_text(), re.S)
    meta = {}
    for line in (m.group(1).splitlines() if m else []):
        key, sep, value = line.partition(":")
        if sep and key in ("title", "summary"):
            meta[key] = value.strip()
    return meta


def render_index(page: Path | None) -> str:
    """List the topic pages beside an area README, with their one-sentence summaries."""
    if page is None:
        raise ValueError("the index block needs the page it is rendered into")
    rows = []
    for topic in sorted(page.parent.glob("*.md")):
        if topic.name == "README.md":
            continue
        meta = _frontmatter(topic)
        rows.append(f"- [{meta.get('title', topic.stem)}]({topic.name}) — {meta.get('summary', '')}")
    return "\n".join(rows) + "\n"


def render_tree(page: Path | None) -> str:
    """List every area index and its pages, for knowledge/README.md."""
    root = page.parent if page is not None else KNOWLEDGE
    lines = []
    for index in sorted(root.glob("*/README.md")):
        area = index.parent.name
        meta = _frontmatter(index)
        pages = [f"[{p.stem}]({area}/{p.name})" for p in sorted(index.parent.glob("*.md")) if p.name != "README.md"]
        lines.append(f"- **[{meta.get('title', area)}]({area}/README.md)** — {', '.join(pages)}")
    return "\n".join(lines) + "\n"


PAGE_RENDERERS = {"index": render_index, "tree": render_tree}

# block name -> (data file stem, renderer taking that file's parsed TOML)
RENDERERS = {
    "accelerators": ("accelerators", render_accelerators),
    "accelerators.mamf": ("accelerators", render_mamf),
    "interconnects.gpu_links": ("interconnects", render_gpu_links),
    "interconnects.network": ("interconnects", render_network),
    "interconnects.links": ("interconnects", render_links),
    "interconnects.expected_busbw": ("interconnects", render_expected_busbw),
    "xid_catalog": ("xid_catalog", render_xid),
}


def render_text(text: str, page: Path | None = None) -> str:
    """Return the page text with every marked data block re-rendered (page: where it lives)."""
    def sub(m: re.Match) -> str:
        name = m.group("name")
        if name in PAGE_RENDERERS:
            return m.group(1) + PAGE_RENDERERS[name](page) + m.group(4)
        if name not in RENDERERS:
            raise KeyError(f"unknown data block '{name}'; known: {sorted(RENDERERS) + sorted(PAGE_RENDERERS)}")
        stem, renderer = RENDERERS[name]
        data = _load(stem)
        return m.group(1) + (renderer(data) if data is not None else _missing(stem)) + m.group(4)
    return BLOCK.sub(sub, text)


def pages() -> list[Path]:
    return sorted(p for p in KNOWLEDGE.rglob("*.md"))


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for page in pages():
        text = page.read_text()
        new = render_text(text, page)
        if new != text:
            stale.append(page.relative_to(KNOWLEDGE))
            if not check:
                page.write_text(new)
    verb = "disagree with the data (run python knowledge/render.py)" if check else "re-rendered"
    for p in stale:
        print(f"{p}: {verb}")
    return 1 if (check and stale) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
