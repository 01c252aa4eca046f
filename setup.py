"""Package layout for setuptools (metadata is in pyproject.toml).

The checkout's `tools/` is installed as the package `mleng`: the generic names `tools` and `server`
never reach a user's site-packages. `knowledge/`, `evals/` (the eval cases) and the skill ship inside it
as `mleng/knowledge`, `mleng/eval_cases` and `mleng/skill`; tools/engine/data.py finds them there or, in a checkout,
beside the package.
"""

from setuptools import find_packages, setup

PACKAGES = ["mleng"] + [f"mleng.{name}" for name in find_packages("tools")]

setup(
    packages=PACKAGES + ["mleng.knowledge", "mleng.eval_cases", "mleng.skill"],
    package_dir={"mleng": "tools", "mleng.knowledge": "knowledge", "mleng.eval_cases": "evals",
                 "mleng.skill": "skills/mleng"},
)
