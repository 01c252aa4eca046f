"""The layout rules of docs/architecture.md, checked on the source: no import cycles, and each folder
imports only what it may.

The graph is built from the AST of every module under tools/ and server.py, imports inside functions
and under `if TYPE_CHECKING:` included (a lazy import is still a dependency), relative imports resolved.
"""

import ast
from pathlib import Path

from tools.engine.registry import registry

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "tools"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def source_files() -> list[Path]:
    return sorted((ROOT / PACKAGE).rglob("*.py")) + [ROOT / "server.py"]


def imports_of(path: Path, known: set[str]) -> set[str]:
    """Our modules that `path` imports (for `from pkg import name`, pkg.name when that is a module)."""
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found |= {f"{target}.{a.name}" for a in node.names}
    return {m for m in found if m in known and m != here}


def import_graph() -> dict[str, set[str]]:
    files = source_files()
    known = {module_name(p) for p in files}
    return {module_name(p): imports_of(p, known) for p in files}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path [a, b, ..., a], or None (iterative DFS, colours white/grey/black)."""
    colour = dict.fromkeys(graph, 0)
    for start in graph:
        if colour[start]:
            continue
        stack = [(start, iter(sorted(graph[start])))]
        path = [start]
        colour[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                colour[node] = 2
                stack.pop()
                path.pop()
            elif colour.get(child) == 1:
                return path[path.index(child):] + [child]
            elif colour.get(child) == 0:
                colour[child] = 1
                path.append(child)
                stack.append((child, iter(sorted(graph.get(child, ())))))
    return None


def folder_of(module: str) -> str:
    """engine | shared | evals | a tool's name | server | tools (the package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_graph_sees_relative_lazy_and_type_checking_imports():
    graph = import_graph()
    assert "tools.engine.spec" in graph["tools.engine.runner"]          # top-level relative import
    assert "tools.engine.mcp_server" in graph["tools.evals.run"]        # import inside a function
    assert "tools.engine.mcp_server" in graph["server"]                 # absolute import


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_engine_imports_no_tool_and_no_shared_helper():
    tools = set(registry())
    for module, deps in import_graph().items():
        if folder_of(module) != "engine":
            continue
        bad = {d for d in deps if folder_of(d) in tools | {"shared"}}
        assert not bad, f"{module} imports {sorted(bad)}: the engine must not depend on tools or shared helpers"


def test_shared_helpers_import_no_tool():
    tools = set(registry())
    for module, deps in import_graph().items():
        if folder_of(module) == "shared":
            bad = {d for d in deps if folder_of(d) in tools}
            assert not bad, f"{module} imports tool modules {sorted(bad)}: shared code must not depend on a tool"


def test_a_tool_imports_no_other_tool():
    tools = set(registry())
    for module, deps in import_graph().items():
        owner = folder_of(module)
        if owner in tools:
            bad = {d for d in deps if folder_of(d) in tools and folder_of(d) != owner}
            assert not bad, f"{module} imports another tool {sorted(bad)}: move what they share to tools/shared/"


def test_nothing_under_tools_imports_by_the_package_name():
    """Inside the package imports are relative: the wheel installs it as `mleng`, not `tools`."""
    for path in (ROOT / PACKAGE).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == PACKAGE:
                raise AssertionError(f"{path.relative_to(ROOT)}:{node.lineno} imports `{node.module}` absolutely")
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] == PACKAGE for a in node.names):
                raise AssertionError(f"{path.relative_to(ROOT)}:{node.lineno} imports `tools` absolutely")


def test_every_tool_with_helpers_is_a_package_and_every_folder_is_known():
    """No `_helper.py` files beside the tools: a helper belongs to a tool package or to shared/."""
    tools = set(registry())
    for entry in (ROOT / PACKAGE).iterdir():
        if entry.name.startswith(("_", ".")) or entry.name == "README.md":
            continue
        name = entry.stem
        assert name in tools | {"engine", "shared", "evals"}, f"tools/{entry.name} is neither a tool nor a known folder"
