"""The docs are code: every repository path and `python -m tools...` module named in a README, page,
docstring, comment or data table resolves, so nobody is sent to a file that moved."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = (".md", ".py", ".toml", ".sh", ".json")
PATH = re.compile(r"(?<![\w/.-])((?:tools|tests|bench|scripts|knowledge|evals|docs|skills)/[\w./-]*\w)")
MODULE = re.compile(r"python3? -m (tools(?:\.\w+)+)")
# Not paths: MCP method names, and templates whose last part is a placeholder.
NOT_PATHS = {"tools/list", "tools/call", "tools/README"}
# (file, path) pairs named before the path lands on main from another branch; drop each once it has.
PENDING: set[tuple[str, str]] = set()
PLACEHOLDER = re.compile(r"(\.|/)(X|TOOL|NAME|<\w+>)$|_$")


def _files():
    for path in ROOT.rglob("*"):
        parts = path.relative_to(ROOT).parts
        if (path.is_file() and path.suffix in SCANNED and path != Path(__file__).resolve()
                and not {".venv", ".git", "__pycache__", "fixtures"} & set(parts)):
            yield path


def _resolves(ref: str) -> bool:
    target = ROOT / ref
    return target.exists() or target.with_suffix(".py").exists() or Path(str(target) + ".py").exists()


def _external(ref: str) -> bool:
    """Paths inside other projects' repositories, quoted as sources (NCCL's and DeepSpeed's docs/*.rst)."""
    return ref.endswith(".rst")


def test_every_repository_path_and_module_named_resolves():
    stale = []
    for path in _files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for m in PATH.finditer(text):
            ref = m.group(1).rstrip(".")
            if ref in NOT_PATHS or PLACEHOLDER.search(ref) or _external(ref) or any(c in ref for c in "*{}<>"):
                continue
            if not _resolves(ref) and (str(path.relative_to(ROOT)), ref) not in PENDING:
                stale.append(f"{path.relative_to(ROOT)}: {ref}")
        for m in MODULE.finditer(text):
            module = m.group(1)
            if PLACEHOLDER.search(module):
                continue
            target = ROOT.joinpath(*module.split("."))
            if not (target.with_suffix(".py").is_file() or (target / "__init__.py").is_file()):
                stale.append(f"{path.relative_to(ROOT)}: python -m {module}")
    assert stale == [], "\n".join(stale)


def test_the_check_itself_finds_a_moved_file(tmp_path):
    assert not _resolves("tools/_matmul_search.py") and _resolves("tools/matmul_bench/search.py")
    assert PATH.search("see tools/store.py for") and not PATH.search("pkg/tools/store.py")


def test_every_mleng_run_line_names_a_tool():
    """Docs say `mleng run <tool>` (works installed, from any directory); the tool it names exists."""
    from tools.engine.registry import registry

    stale = []
    for path in _files():
        for name in re.findall(r"mleng run ([a-z0-9]+_\w+)", path.read_text(encoding="utf-8", errors="replace")):
            if name not in registry():
                stale.append(f"{path.relative_to(ROOT)}: mleng run {name}")
    assert stale == [], "\n".join(stale)
