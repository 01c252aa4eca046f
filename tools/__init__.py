"""mleng tools: one module per tool, discovered here.

Every module in this package that defines `SPEC` (a `tools.harness.ToolSpec`) is a tool. Modules whose
names start with an underscore, and the harness modules in _NOT_TOOLS, are not scanned. Adding a tool
is one new file: nothing here, in the CLI or in server.py names a tool.

Discovery is lazy (first call of `registry()`), so a child process that runs one tool imports only
that tool's module.
"""

import functools
import importlib
import logging
import pkgutil
import traceback

_NOT_TOOLS = {"harness", "runner", "jobs", "store", "cli", "child"}

# Modules that failed to import: name -> traceback. A test asserts this stays empty; the server keeps
# serving the other tools rather than dying on one broken file.
BROKEN: dict[str, str] = {}


@functools.cache
def registry() -> dict:
    """name -> ToolSpec for every tool module, sorted by name."""
    from tools.harness import ToolSpec

    specs: dict[str, ToolSpec] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name.startswith("_") or info.name in _NOT_TOOLS or info.ispkg:
            continue
        try:
            module = importlib.import_module(f"{__name__}.{info.name}")
        except Exception:
            BROKEN[info.name] = traceback.format_exc()
            logging.getLogger("mleng").error("tool module tools.%s failed to import:\n%s",
                                             info.name, BROKEN[info.name])
            continue
        spec = getattr(module, "SPEC", None)
        if spec is None:
            continue
        if not isinstance(spec, ToolSpec):
            raise TypeError(f"tools.{info.name}.SPEC is not a ToolSpec")
        if spec.name in specs:
            raise ValueError(f"tool name {spec.name!r} is defined twice")
        specs[spec.name] = spec
    return specs


def get_spec(name: str):
    """The spec for `name`, or a ValueError listing the names that exist."""
    specs = registry()
    if name not in specs:
        raise ValueError(f"unknown tool {name!r}; known tools: {', '.join(specs)}")
    return specs[name]


def load_spec(name: str):
    """Import only tools.<name> and return its SPEC (what a child process does)."""
    if not name.isidentifier() or name.startswith("_") or name in _NOT_TOOLS:
        raise ValueError(f"not a tool module name: {name!r}")
    return importlib.import_module(f"{__name__}.{name}").SPEC
