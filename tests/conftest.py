"""Shared test setup: every test gets its own results store, and GPU tests skip without a GPU."""

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # `import server` and `import evals` from the tests


@pytest.fixture(autouse=True)
def mleng_home(tmp_path, monkeypatch):
    """Results store, locks and job files of this test live in a temp dir, never the user's."""
    home = tmp_path / "mleng-home"
    monkeypatch.setenv("MLENG_HOME", str(home))
    return home


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _has_nvidia_gpu() -> bool:
    from tools.engine.processes import local_gpu_count

    return local_gpu_count() > 0


def pytest_collection_modifyitems(config, items):
    if any(item.get_closest_marker("gpu") for item in items) and not _has_nvidia_gpu():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU (NVML finds none); run on the GPU machine with -m gpu")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)
