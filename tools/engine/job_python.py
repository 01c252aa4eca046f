"""The job's Python: the interpreter that measures, with the torch, CUDA and NCCL the user's jobs train with.

The server itself needs no torch (the default install is light: a laptop or login node never runs a
kernel). A tool whose spec sets `job_python` runs its child in the job's Python instead of the server's:
`mleng serve --python PATH`, else $MLENG_PYTHON, else the server's own interpreter. The child imports our
package from the server's tree (processes.child_env puts it on PYTHONPATH), so the job's Python needs only
torch and what the tool itself needs; the server's site-packages fill the gaps (pydantic, psutil) when the
two Pythons are the same version, but never the stack the answer is about (engine/borrow.py).
"""

import os
import sys
from pathlib import Path

from .borrow import STACK_PACKAGES

ENV = "MLENG_PYTHON"


def job_python() -> str:
    """The job's Python (an absolute path): $MLENG_PYTHON, else this interpreter."""
    return os.environ.get(ENV) or sys.executable


def set_job_python(path: str) -> None:
    """`mleng serve --python PATH`: checked now, so a typo is refused at start and not at the first run."""
    python = Path(path).expanduser()
    if not (python.is_file() and os.access(python, os.X_OK)):
        raise SystemExit(f"--python {path}: not an executable file; give the path of the Python your jobs "
                          "use, e.g. /path/to/venv/bin/python")
    os.environ[ENV] = str(python.absolute())


def missing_module_message(tool: str, module: str, python: str) -> str:
    """What to set when the job's Python lacks a module the tool needs (torch above all)."""
    if module.split(".")[0] in STACK_PACKAGES:
        return (f"{tool} needs {module} in the job's Python ({python}), which has none: set "
                f"{ENV}=/path/to/venv/bin/python or `mleng serve --python ...` to the Python your jobs use, "
                "or install mleng[torch] to measure in the server's own Python.")
    return (f"{tool} needs the module {module!r} in the job's Python ({python}), which has none: install it "
            f"there (pip install {module.split('.')[0]}), or point {ENV} / `mleng serve --python` at a Python "
            f"{sys.version_info.major}.{sys.version_info.minor} like the server's, whose packages it then borrows.")


def stack_line(provenance: dict) -> str | None:
    """The one line a measured answer carries about its stack, from the child's provenance."""
    if not provenance.get("torch"):
        return None
    cuda = provenance.get("cuda") or "none (CPU build)"
    nccl = provenance.get("nccl") or "not available"
    return (f"Measured with Python {provenance.get('python', '?')} at {provenance.get('python_path', '?')}: "
            f"torch {provenance['torch']}, CUDA {cuda}, NCCL {nccl}.")


def stack_provenance() -> dict:
    """torch / CUDA / NCCL of this (the job's) Python, without importing torch when the run did not: torch's
    version.py is read as data (literal assignments only, nothing executed) and NCCL is the version of the
    nvidia-nccl package torch loads (pip wheels); a torch the run imported answers for itself."""
    import ast
    import importlib.util
    from importlib import metadata

    if "torch" in sys.modules:
        from .store import torch_provenance

        return torch_provenance()
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return {}
    try:
        tree = ast.parse((Path(spec.submodule_search_locations[0]) / "version.py").read_text())
    except (OSError, SyntaxError, ValueError):
        return {}
    values = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and isinstance(node.value, ast.Constant):
            values[target.id] = node.value.value
    nccl = next((d.version for d in metadata.distributions()
                 if (d.metadata["Name"] or "").lower().startswith("nvidia-nccl")), None)
    return {"torch": values.get("__version__"), "cuda": values.get("cuda") or values.get("hip"), "nccl": nccl}
