"""The tool registry: every module or package directly under the package that defines `SPEC`.

A tool is `tools/<name>.py` or `tools/<name>/__init__.py` with `SPEC = ToolSpec(...)`, named after
its file. Nothing else is a tool: the engine, the shared helpers and the eval harness define no SPEC,
so discovery needs no list of exceptions, and nothing here, in the CLI or in the MCP wiring names a
tool. Modules whose names start with an underscore (`__main__`) are never imported by discovery.

Discovery is lazy (first call of `registry()`), so a child process that runs one tool imports only
that tool's module.
"""

import functools
import importlib
import importlib.util
import logging
import pkgutil
import sys
import traceback

from .data import PACKAGE, PACKAGE_DIR
from .spec import ToolSpec

# Modules that failed to import: name -> traceback. A test asserts this stays empty; the server keeps
# serving the other tools rather than dying on one broken file.
BROKEN: dict[str, str] = {}


@functools.cache
def registry() -> dict[str, ToolSpec]:
    """name -> ToolSpec for every tool module, sorted by name."""
    specs: dict[str, ToolSpec] = {}
    for info in sorted(pkgutil.iter_modules([str(PACKAGE_DIR)]), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        try:
            module = importlib.import_module(f"{PACKAGE}.{info.name}")
        except Exception:
            BROKEN[info.name] = traceback.format_exc()
            logging.getLogger("mleng").error("tool module %s.%s failed to import:\n%s",
                                             PACKAGE, info.name, BROKEN[info.name])
            continue
        spec = getattr(module, "SPEC", None)
        if spec is None:
            continue
        if not isinstance(spec, ToolSpec):
            raise TypeError(f"{PACKAGE}.{info.name}.SPEC is not a ToolSpec")
        if spec.name != info.name:
            raise ValueError(f"{PACKAGE}/{info.name} defines tool {spec.name!r}: name the file after the tool")
        specs[spec.name] = spec
    return specs


def get_spec(name: str) -> ToolSpec:
    """The spec for `name`, or a ValueError listing the names that exist."""
    specs = registry()
    if name not in specs:
        raise ValueError(f"unknown tool {name!r}; known tools: {', '.join(specs)}")
    return specs[name]


def load_spec(name: str, module: str | None = None) -> ToolSpec:
    """Import only the module that defines tool `name` (default PACKAGE.<name>) and return its spec.

    This is what a child process does. `module` may be a dotted name or a path to a .py file (tests use
    it for fault-injection tools that must not be in the registry).
    """
    if module is None:
        if not name.isidentifier() or name.startswith("_"):
            raise ValueError(f"not a tool module name: {name!r}")
        module = f"{PACKAGE}.{name}"
    if module.endswith(".py"):
        loader_spec = importlib.util.spec_from_file_location(f"_mleng_ext_{name}", module)
        mod = importlib.util.module_from_spec(loader_spec)
        loader_spec.loader.exec_module(mod)
    else:
        mod = importlib.import_module(module)
    for value in vars(mod).values():
        if isinstance(value, ToolSpec) and value.name == name:
            return value
    raise ValueError(f"no tool spec named {name!r} in {module}")


def module_of(spec: ToolSpec) -> str | None:
    """Where a child finds `spec`: None for PACKAGE.<name>, else a dotted name or a .py path."""
    modname = spec.run.__module__
    if modname in (f"{PACKAGE}.{spec.name}", "__main__") or modname.startswith(f"{PACKAGE}.{spec.name}."):
        return None
    if modname.startswith(f"{PACKAGE}."):
        return modname
    return getattr(sys.modules.get(modname), "__file__", None)
