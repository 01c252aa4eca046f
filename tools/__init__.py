"""mleng tools: one module per tool, discovered here.

Every module in this package that defines `SPEC` (a `tools.harness.ToolSpec`) is a tool. Modules whose
names start with an underscore, and the harness modules in _NOT_TOOLS, are not scanned. Adding a tool
is one new file: nothing here, in the CLI or in server.py names a tool.

Discovery is lazy (first call of `registry()`), so a child process that runs one tool imports only
that tool's module.
"""

import functools
import importlib
import importlib.util
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
        if spec.name != info.name:
            raise ValueError(f"tools/{info.name}.py defines tool {spec.name!r}: name the file after the tool")
        specs[spec.name] = spec
    return specs


def get_spec(name: str):
    """The spec for `name`, or a ValueError listing the names that exist."""
    specs = registry()
    if name not in specs:
        raise ValueError(f"unknown tool {name!r}; known tools: {', '.join(specs)}")
    return specs[name]


def load_spec(name: str, module: str | None = None):
    """Import only the module that defines tool `name` (default tools.<name>) and return its spec.

    This is what a child process does. `module` may be a dotted name or a path to a .py file.
    """
    from tools.harness import ToolSpec

    if module is None:
        if not name.isidentifier() or name.startswith("_") or name in _NOT_TOOLS:
            raise ValueError(f"not a tool module name: {name!r}")
        module = f"{__name__}.{name}"
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


def module_of(spec) -> str | None:
    """Where a child finds `spec`: None for tools.<name>, else a dotted name or a .py path."""
    import sys

    modname = spec.run.__module__
    if modname in (f"{__name__}.{spec.name}", "__main__"):
        return None
    if modname.startswith(f"{__name__}."):
        return modname
    return getattr(sys.modules.get(modname), "__file__", None)
