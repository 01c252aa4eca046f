"""The gpu_child marker (tests/conftest.py): the test body runs in a pytest process of its own, so what it
allocates ends with that process; its failure fails the parent test."""

import os
import subprocess
import sys

import pytest

from conftest import CHILD_ENV, REPO

FAILING = '''
import pytest

@pytest.mark.gpu_child
def test_fails_in_its_child():
    assert False, "the child's own failure"
'''


@pytest.mark.gpu_child
def test_a_marked_test_runs_in_a_child_pytest():
    assert os.environ.get(CHILD_ENV) == "1"
    assert "pytest" in " ".join(open(f"/proc/{os.getpid()}/cmdline").read().split("\0"))


@pytest.mark.gpu_child
@pytest.mark.parametrize("micro_batch, seq_len", [(1, 4096)])    # a node id with brackets, as the GPU tests have
def test_a_parametrized_marked_test_runs_in_a_child_pytest(micro_batch, seq_len):
    assert os.environ.get(CHILD_ENV) == "1" and (micro_batch, seq_len) == (1, 4096)


def test_a_child_that_fails_fails_its_parent(tmp_path):
    (tmp_path / "test_probe.py").write_text(FAILING)
    env = {k: v for k, v in os.environ.items() if k != CHILD_ENV}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest", "test_probe.py"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**env, "PYTHONPATH": f"{REPO / 'tests'}:{REPO}"})
    assert out.returncode == 1 and "1 failed" in out.stdout, out.stdout[-2000:]
    assert "in its child pytest: exit 1" in out.stdout and "the child's own failure" in out.stdout, out.stdout[-2000:]
