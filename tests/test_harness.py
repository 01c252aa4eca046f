"""The harness: registry, runner faults (timeout, cancel, crash), GPU locks, results store."""

import threading
import time

import psutil
import pytest

import fault_tools
from tools.engine.registry import BROKEN, registry
from tools.engine.spec import Result, ToolFailure
from tools.engine.runner import Cancelled, execute
from tools.engine import store



def test_every_tool_module_imports():
    registry()
    assert not BROKEN, "tool modules failed to import:\n" + "\n".join(BROKEN.values())


def test_registry_names_are_catalog_names_and_specs_are_complete():
    specs = registry()
    assert len(specs) >= 24  # the catalog only grows (names are the interface; README/SKILL.md tables list them)
    for spec in specs.values():
        assert len(spec.description) > 120, f"{spec.name}: the description must tell an agent when to use it"
        assert spec.summary and len(spec.summary) < 130, spec.name
        assert issubclass(spec.Result, Result)
        spec.Result()  # every field has a default: a job handle can be returned in its place


def _wait_gone(pids, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return []
        time.sleep(0.1)
    return alive


@pytest.mark.slow
def test_timeout_kills_child_and_its_grandchild_in_another_session(tmp_path):
    pid_file = tmp_path / "pids"
    params = fault_tools.FaultParams(pid_file=str(pid_file))
    started = time.monotonic()
    with pytest.raises(ToolFailure, match="did not finish within its timeout of 3 s"):
        execute(fault_tools.SLEEPER, params, timeout_s=3)
    assert time.monotonic() - started < 12
    pids = [int(p) for p in pid_file.read_text().split()]
    assert len(pids) == 2
    assert _wait_gone(pids) == []


def test_cancel_kills_the_run(tmp_path):
    pid_file = tmp_path / "pids"
    cancel = threading.Event()
    threading.Timer(2.5, cancel.set).start()
    with pytest.raises(Cancelled):
        execute(fault_tools.SLEEPER, fault_tools.FaultParams(pid_file=str(pid_file)), cancel=cancel, timeout_s=60)
    assert _wait_gone([int(p) for p in pid_file.read_text().split()]) == []


def test_aborting_child_is_a_clear_error_and_the_next_run_works(tmp_path):
    with pytest.raises(ToolFailure, match="crashed: killed by SIGABRT"):
        execute(fault_tools.ABORTER, fault_tools.FaultParams())
    result = execute(fault_tools.NOISY, fault_tools.FaultParams())
    assert result.verdict == "ok" and result.findings == ["done"]


def test_progress_events_reach_the_caller(tmp_path):
    seen = []
    cancel = threading.Event()

    def progress(fraction, message):
        seen.append((fraction, message))
        cancel.set()

    with pytest.raises(Cancelled):
        execute(fault_tools.SLEEPER, fault_tools.FaultParams(pid_file=str(tmp_path / "p")), progress, cancel=cancel)
    assert seen[0] == (0.1, "sleeping forever")


def test_two_runs_on_one_gpu_serialise(tmp_path):
    log = tmp_path / "log"
    params = fault_tools.FaultParams(seconds=1.0, log_file=str(log))
    threads = [threading.Thread(target=execute, args=(fault_tools.GPU_LOCKED, params)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    events = [line.split() for line in log.read_text().splitlines()]
    assert [e[0] for e in events] == ["start", "end", "start", "end"], events
    assert float(events[2][1]) >= float(events[1][1])


def test_result_is_stored_with_provenance():
    result = execute(fault_tools.GPU_LOCKED, fault_tools.FaultParams(seconds=0, log_file="/dev/null"))
    rows = store.query(tool="test_gpu_locked")
    assert len(rows) == 1 and rows[0]["id"] == result.result_id
    row = rows[0]
    assert row["host"] and row["python"] and row["torch"]
    assert row["metric_name"] == "slept_s" and row["metric_value"] == 0
    assert row["params"]["seconds"] == 0 and row["started"] <= row["ended"]


def _plant(tool, host, value, started, params=None):
    return store.save(tool, params or {"dtype": "bf16"}, {"verdict": "ok", "mamf": value}, started=started,
                      ended=started + 1, provenance={"host": host}, metric_name="mamf")


def test_results_history_flags_planted_outlier_and_regression():
    from tools.results_history import ResultsHistoryParams, run

    now = time.time()
    for i, host in enumerate(["node1", "node2", "node3", "node4"]):
        _plant("matmul_bench", host, 780.0 + i, now - 100 + i)
    slow = _plant("matmul_bench", "node5", 610.0, now)
    for day, value in [(3, 790.0), (2, 788.0), (1, 700.0)]:  # node6 got slower than its own past
        _plant("matmul_bench", "node6", value, now - 86400 * day if day > 1 else now - 10)
    result = run(ResultsHistoryParams(tool="matmul_bench"), None)
    flags = {(f.kind, f.machine): f for f in result.flags}
    assert ("outlier", "node5") in flags and flags[("outlier", "node5")].result_id == slow
    assert flags[("outlier", "node5")].worse_by_pct > 20
    assert ("regression", "node6") in flags
    assert not any(m in ("node1", "node2", "node3", "node4") for _, m in flags)
    assert result.verdict == "warn"


def test_results_history_counts_every_match_beyond_the_rows_it_analyses(monkeypatch):
    import tools.results_history as history

    monkeypatch.setattr(history, "ANALYSED_ROWS", 3)
    now = time.time()
    for i in range(5):
        _plant("matmul_bench", f"node{i}", 780.0, now - i)
    result = history.run(history.ResultsHistoryParams(tool="matmul_bench"), None)
    assert result.total_matching == 5, "the count is of every matching row, not of the rows analysed"
    assert any("newest 3 of them" in f for f in result.findings)


def test_sigterm_to_the_cli_kills_the_run(tmp_path):
    """`timeout N python -m tools.X` sends SIGTERM: the run's whole tree must go with it."""
    import os
    import signal
    import subprocess
    import sys

    pid_file = tmp_path / "pids"
    script = ("import sys; sys.path.insert(0, 'tests'); import fault_tools; from tools.engine.cli import run_tool_cli; "
              f"sys.exit(run_tool_cli(fault_tools.SLEEPER, ['--pid-file', {str(pid_file)!r}], prog='x'))")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=repo, env={**os.environ, "MLENG_HOME": str(tmp_path)})
    deadline = time.time() + 30
    while time.time() < deadline and not (pid_file.exists() and pid_file.read_text()):
        time.sleep(0.1)
    pids = [int(p) for p in pid_file.read_text().split()]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 130
    assert _wait_gone(pids) == []


def test_every_output_field_is_described():
    """Results and the records inside them: an agent reading structured content learns each field from here."""
    import typing

    from pydantic import BaseModel

    seen, missing = set(), []

    def walk(cls, tool):
        if cls in seen:
            return
        seen.add(cls)
        for name, field in cls.model_fields.items():
            if not field.description:
                missing.append(f"{tool}: {cls.__name__}.{name}")
            stack = [field.annotation]
            while stack:
                ann = stack.pop()
                stack.extend(typing.get_args(ann))
                if isinstance(ann, type) and issubclass(ann, BaseModel):
                    walk(ann, tool)

    for name, spec in registry().items():
        walk(spec.Result, name)
    assert missing == []
