"""mleng: the engine (engine/), helpers shared by several tools (shared/), and one module or package
per tool. docs/architecture.md describes the parts; tools/README.md says how to add a tool."""

from .engine import borrow as _borrow

_borrow.install()   # a child in the job's Python finds pydantic & co. in the server's tree (engine/job_python.py)
