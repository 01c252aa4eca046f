"""Where mleng's own files are, checkout or wheel, and the data tables every figure comes from.

In a checkout the package is `tools/` and the knowledge tree and eval cases sit beside it
(`knowledge/`, `evals/`). A wheel installs the package under the import name `mleng` and ships those
trees inside it as package data (`mleng/knowledge/`, `mleng/eval_cases/`, `mleng/skill/SKILL.md`):
see setup.py.
"""

import functools
import tomllib
from pathlib import Path

from .spec import ToolFailure

PACKAGE_DIR = Path(__file__).resolve().parent.parent     # tools/ (checkout) or site-packages/mleng/ (wheel)
PACKAGE = __name__.split(".")[0]                         # "tools" or "mleng": how children import us
# The directory that must be on sys.path for `import PACKAGE` to work in a child process.
IMPORT_ROOT = PACKAGE_DIR.parent


def _beside_or_inside(installed: str, checkout: str) -> Path:
    inside = PACKAGE_DIR / installed
    return inside if inside.is_dir() else PACKAGE_DIR.parent / checkout


KNOWLEDGE_DIR = _beside_or_inside("knowledge", "knowledge")
EVAL_CASES_DIR = _beside_or_inside("eval_cases", "evals")
SKILL_FILE = _beside_or_inside("skill", "skills/mleng") / "SKILL.md"


@functools.cache
def load_data(name: str) -> dict:
    """Parsed `knowledge/data/<name>.toml`. Raises ToolFailure naming the file when it is missing."""
    path = KNOWLEDGE_DIR / "data" / f"{name}.toml"
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ToolFailure(f"data table {path} is missing: the installation is incomplete; reinstall mleng") from None
