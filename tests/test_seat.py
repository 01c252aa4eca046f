"""The agent's seat (tools/evals/seat.py): a real server over HTTP, called as a host calls it, each call logged."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LOG = ROOT / "evals" / "scenarios" / "fixtures" / "torchrun_oom_rank3.log"


def seat(*args: str, home: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools.evals.seat", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "MLENG_HOME": str(home)})


@pytest.mark.slow
def test_the_seat_answers_as_a_host_and_logs_each_call(tmp_path):
    home = tmp_path / "home"
    started = seat("start", home=home)
    assert started.returncode == 0, started.stderr
    try:
        listed = seat("tools", home=home).stdout
        assert "## log_triage" in listed and "input schema:" in listed
        answer = seat("call", "log_triage", json.dumps({"paths": [str(LOG)]}), home=home).stdout
        assert answer.startswith("log_triage: FAIL") and "rank 3" in answer and "Result JSON" not in answer
        assert "ERROR" in seat("call", "log_triage", '{"nope": 1}', home=home).stdout
        logged = [json.loads(line) for line in seat("log", home=home).stdout.splitlines()]
        assert [(c["tool"], c["error"]) for c in logged] == [("log_triage", False), ("log_triage", True)]
    finally:
        assert seat("stop", home=home).returncode == 0
    assert not (home / "seat" / "seat.json").exists()


@pytest.mark.slow
def test_the_structured_view_hands_the_json_a_claude_code_host_reads(tmp_path):
    home = tmp_path / "home"
    assert seat("start", "--view", "structured", home=home).returncode == 0
    try:
        answer = seat("call", "log_triage", json.dumps({"paths": [str(LOG)]}), home=home).stdout
        record = json.loads(answer)          # the structuredContent itself, not the text blocks
        assert "rank 3" in json.dumps(record) and not answer.startswith("log_triage: FAIL")
        error = seat("call", "log_triage", '{"nope": 1}', home=home).stdout
        assert error.startswith("ERROR") and "nope" in error    # no structured content: the text, as hosts show it
        assert [c["view"] for c in map(json.loads, seat("log", home=home).stdout.splitlines())] == ["structured"] * 2
    finally:
        assert seat("stop", home=home).returncode == 0
