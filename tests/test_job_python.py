"""The job's Python (engine/job_python.py): a light server without torch, measuring tools run in the Python
the user's jobs use, a clear error naming what to set when that Python has no torch, and the stack said."""

import os
import subprocess
import sys

import pytest
from mcp import Client, StdioServerParameters

from tools.engine import job_python
from tools.engine.registry import get_spec, registry
from tools.engine.runner import execute

from conftest import REPO

pytestmark = pytest.mark.anyio

# A sitecustomize that makes torch and matplotlib absent, in the server and in every child it starts (they
# keep PYTHONPATH): the light install's environment, without building one.
NO_TORCH = """import sys
class _Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "matplotlib"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, _Absent())
"""


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory):
    """A Python of the server's version with nothing installed (no torch, no pydantic)."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    return str(venv / "bin" / "python")


def _cli(*args, env_extra):
    env = {**os.environ, **env_extra}
    return subprocess.run([sys.executable, "-m", "tools", "run", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_job_python_without_torch_is_refused_naming_what_to_set(bare_python):
    out = _cli("matmul_bench", "--device", "cpu", env_extra={job_python.ENV: bare_python})
    assert out.returncode == 1
    assert f"matmul_bench needs torch in the job's Python ({bare_python})" in out.stderr
    assert "MLENG_PYTHON=" in out.stderr and "mleng serve --python" in out.stderr and "mleng[torch]" in out.stderr
    assert "Traceback" not in out.stderr


def test_the_job_python_borrows_the_server_packages_but_not_its_torch(bare_python, monkeypatch):
    """env_report in a bare Python reports ITS stack (no torch), though the server's tree has torch."""
    monkeypatch.setenv(job_python.ENV, bare_python)
    result = execute(get_spec("env_report"), get_spec("env_report").Params(probe_torch=True))
    assert result.torch is None and "torch not installed" in result.findings[0]


@pytest.mark.slow
def test_a_measured_answer_says_the_stack_of_the_job_python(monkeypatch):
    monkeypatch.setenv(job_python.ENV, sys.executable)
    spec = get_spec("dist_smoke_test")
    result = execute(spec, spec.Params(nproc_per_node=2))
    import torch

    stack = [f for f in result.findings if f.startswith("Measured with Python")]
    assert len(stack) == 1 and stack[0].startswith(
        f"Measured with Python {'.'.join(map(str, sys.version_info[:3]))} at {sys.executable}: "
        f"torch {torch.__version__}, CUDA {torch.version.cuda or 'none (CPU build)'}, NCCL ")
    if torch.version.cuda is None:
        assert stack[0].endswith("NCCL not available.")


def test_serve_python_refuses_a_path_that_is_not_a_python(tmp_path):
    with pytest.raises(SystemExit, match="not an executable file"):
        job_python.set_job_python(str(tmp_path / "nope"))


def test_every_tool_that_imports_torch_in_its_child_declares_it():
    needs = {name for name, spec in registry().items() if spec.needs_torch}
    assert needs == {"collective_bench", "dist_smoke_test", "matmul_bench", "memory_bandwidth_bench", "p2p_bandwidth"}
    assert all(registry()[n].job_python for n in needs | {"env_report", "fleet_sweep"})


async def test_the_server_lists_every_tool_and_reads_logs_without_torch(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(NO_TORCH)
    env = {"MLENG_HOME": str(tmp_path / "home"), "PATH": os.environ["PATH"],
           "PYTHONPATH": str(tmp_path / "site")}
    params = StdioServerParameters(command=sys.executable, args=["server.py"], cwd=REPO, env=env)
    async with Client(params) as c:
        names = {t.name for t in (await c.list_tools()).tools}
        assert names == set(registry())
        log = REPO / "tests" / "fixtures" / "logs" / "gloo_crash.log"
        r = await c.call_tool("log_triage", {"paths": [str(log)]})
        assert not r.is_error and r.structured_content["verdict"] == "fail"
        r = await c.call_tool("p2p_bandwidth", {})
        assert r.is_error and "needs torch in the job's Python" in r.content[0].text
        assert "Traceback" not in r.content[0].text


def test_server_py_in_a_python_without_its_packages_says_so_in_one_line(bare_python, tmp_path):
    """What a host's log shows when it started the wrong Python: the cause and the fix, not a traceback."""
    out = subprocess.run([bare_python, str(REPO / "server.py")], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith(f"mleng: {bare_python} lacks ") and "by its absolute path" in out.stderr
