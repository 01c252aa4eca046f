"""Package layout for setuptools (metadata is in pyproject.toml).

The checkout's `tools/` is installed as the package `mleng`: the generic names `tools` and `server`
never reach a user's site-packages. `knowledge/` (pages and data tables), `evals/` (the eval cases)
and the skill ship inside it as `mleng/knowledge`, `mleng/eval_cases` and `mleng/skill`;
tools/engine/data.py finds them there or, in a checkout, beside the package. Every folder is listed
as a package (the data folders as namespace packages), so that setuptools copies their files.
"""

from setuptools import find_namespace_packages, find_packages, setup

FOLDERS = {"mleng": "tools", "mleng.knowledge": "knowledge", "mleng.eval_cases": "evals", "mleng.skill": "skills/mleng"}


def packages_under(name: str, folder: str, code: bool) -> list[str]:
    found = find_packages(folder) if code else find_namespace_packages(folder, exclude=["__pycache__*"])
    return [name] + [f"{name}.{sub}" for sub in found]


PACKAGES = [p for name, folder in FOLDERS.items() for p in packages_under(name, folder, code=name == "mleng")]
# The drills' fixtures are real logs and dumps of any name (fr_0, slurm-81234.out): ship every file there.
DRILL_FILES = {p: ["*"] for p in PACKAGES if p.startswith("mleng.eval_cases.scenarios")}

setup(
    packages=PACKAGES,
    package_dir=FOLDERS,
    package_data={"": ["*.md", "*.toml", "*.jsonl"], **DRILL_FILES},
)
