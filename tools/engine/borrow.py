"""The server's packages for a child running in the job's Python (engine/job_python.py). Standard library only:
it runs before anything else of ours is imported, in a Python that may lack pydantic.

processes.child_env names the server's site-packages (SITE_ENV) and its Python's cache tag (ABI_ENV).
`install()`, called from the package's __init__, lets imports the job's Python cannot satisfy (pydantic,
psutil) be found there, searched after the job's own path, when both Pythons are the same version. The
stack the answer is about (STACK_PACKAGES) is never borrowed.
"""

import os
import sys
from importlib.machinery import PathFinder

SITE_ENV = "MLENG_SERVER_SITE"
ABI_ENV = "MLENG_SERVER_ABI"
STACK_PACKAGES = ("torch", "triton", "nvidia", "numpy")


class ServerPackages:
    """A meta-path finder placed after the path finder: the job's own copy of a package always wins."""

    def __init__(self, dirs: list[str]):
        self.dirs = dirs

    def find_spec(self, name, path=None, target=None):
        if path is not None or name in STACK_PACKAGES:
            return None   # submodules follow their parent package; the stack stays the job's own
        return PathFinder.find_spec(name, self.dirs)


def install() -> None:
    dirs = [d for d in os.environ.get(SITE_ENV, "").split(os.pathsep) if d]
    if not dirs or os.environ.get(ABI_ENV) != sys.implementation.cache_tag:
        return
    if not any(isinstance(f, ServerPackages) for f in sys.meta_path):
        sys.meta_path.append(ServerPackages(dirs))


def server_site_env() -> dict[str, str]:
    """What a child needs to borrow this Python's packages."""
    import site

    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    return {SITE_ENV: os.pathsep.join(d for d in dirs if os.path.isdir(d)), ABI_ENV: sys.implementation.cache_tag}
