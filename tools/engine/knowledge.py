"""The knowledge tree as data: pages with their frontmatter, split into sections by heading.

Shared by the knowledge_search tool and the server's knowledge://index resource. Parsing uses
markdown-it-py (headings, not regexes over raw text, so code blocks with '#' lines are not headings).
"""

import dataclasses
import functools
import re
from pathlib import Path

import yaml
from markdown_it import MarkdownIt

from .data import KNOWLEDGE_DIR


@dataclasses.dataclass(eq=False)  # identity hash: pages are cached and used as index keys
class Section:
    heading_path: list[str]   # ["Page title", "Heading", "Subheading"]
    anchor: str               # GitHub-style slug of the last heading ('' for the intro)
    text: str


@dataclasses.dataclass(eq=False)  # identity hash: pages are cached and used as index keys
class Page:
    path: str                 # relative to knowledge/, e.g. "network/busbw.md"
    title: str
    summary: str
    symptoms: list[str]
    tools: list[str]
    sources: list[str]
    sections: list[Section]

    @property
    def uri(self) -> str:
        return f"knowledge://{self.path}"


class FrontmatterError(ValueError):
    pass


def split_frontmatter(text: str) -> tuple[dict, str]:
    """YAML between leading '---' lines -> (dict, body). Raises FrontmatterError when malformed."""
    if not text.startswith("---\n"):
        return {}, text
    end = text.find("\n---", 4)
    if end < 0:
        raise FrontmatterError("frontmatter starts with '---' but never ends")
    try:
        meta = yaml.safe_load(text[4:end]) or {}
    except yaml.YAMLError as e:
        raise FrontmatterError(f"frontmatter is not valid YAML: {e}") from None
    if not isinstance(meta, dict):
        raise FrontmatterError("frontmatter must be a mapping")
    body = text[end + 4:]
    return meta, body.split("\n", 1)[1] if "\n" in body else ""


def slug(heading: str) -> str:
    s = re.sub(r"[^\w\- ]", "", heading.lower()).strip()
    return re.sub(r"\s+", "-", s)


def parse_sections(title: str, body: str) -> list[Section]:
    md = MarkdownIt("commonmark").enable("table")
    tokens = md.parse(body)
    lines = body.splitlines()
    heads = []  # (line_start, line_end, level, text)
    for i, tok in enumerate(tokens):
        if tok.type == "heading_open" and tok.map:
            heads.append((tok.map[0], tok.map[1], int(tok.tag[1]), tokens[i + 1].content))
    sections, path = [], []
    boundaries = [h[0] for h in heads] + [len(lines)]
    intro = "\n".join(lines[:boundaries[0]]).strip()
    if intro:
        sections.append(Section([title], "", intro))
    for (start, end, level, text), stop in zip(heads, boundaries[1:]):
        path = [p for p in path if p[0] < level] + [(level, text)]
        content = "\n".join(lines[end:stop]).strip()
        hp = [title] + [t for lvl, t in path if not (lvl == 1 and t == title)]
        sections.append(Section(hp, slug(text), content))
    return sections


def load_page(path) -> Page:
    text = path.read_text()
    meta, body = split_frontmatter(text)
    rel = path.relative_to(KNOWLEDGE_DIR).as_posix()
    title = str(meta.get("title") or rel)
    return Page(path=rel, title=title, summary=str(meta.get("summary") or ""),
                symptoms=[str(s) for s in meta.get("symptoms") or []], tools=[str(t) for t in meta.get("tools") or []],
                sources=[str(s) for s in meta.get("sources") or []], sections=parse_sections(title, body))


def _inside_tree(path: Path) -> bool:
    """A regular file of the tree itself: no symlink anywhere on its way, nothing outside the tree."""
    root = KNOWLEDGE_DIR.resolve()
    try:
        rel = path.relative_to(KNOWLEDGE_DIR)
    except ValueError:
        return False
    step = KNOWLEDGE_DIR
    for part in rel.parts:
        step = step / part
        if step.is_symlink():
            return False
    return path.resolve().is_relative_to(root) and path.is_file()


def tree_files(pattern: str = "*.md") -> list[Path]:
    """Regular files of the tree matching `pattern`, symlinks (and what they point to) left out: a link
    planted in the tree must not make the index, the search or a resource serve a file outside it."""
    return sorted(p for p in KNOWLEDGE_DIR.rglob(pattern) if _inside_tree(p))


def knowledge_file(rel_path: str) -> Path | None:
    """The page (.md) or data table (.toml) at `rel_path` inside the tree, or None."""
    target = KNOWLEDGE_DIR / rel_path
    if target.suffix not in (".md", ".toml") or ".." in Path(rel_path).parts or not _inside_tree(target):
        return None
    return target


def _tree_signature() -> tuple:
    return tuple((p.as_posix(), p.stat().st_mtime_ns) for p in tree_files("*.md"))


@functools.lru_cache(maxsize=2)
def _load_all(signature: tuple) -> tuple[Page, ...]:
    return tuple(load_page(Path(p)) for p, _ in signature)


def load_pages() -> tuple[Page, ...]:
    """Every page of the tree, re-read when a file changes (cached on paths and mtimes)."""
    return _load_all(_tree_signature())
