"""slurm_job_diagnose on a job that ran one of our tools (issue 35: an agent submitted collective_bench
pattern=pairwise as an sbatch job; its exit 3 "fail" verdict was read as "job failed, no known signature")."""

from __future__ import annotations

import contextlib
import io
import time

import pytest

from tools import collective_bench as cb, slurm_job_diagnose as sjd
from tools.engine import store
from tools.engine.cli import _print_result

FOUND = ["Suspect node mln3: slow with 3 of 3 partners (0.021 GB/s busbw against a healthy pair's 0.55 GB/s).",
         "pairwise: 4 nodes, 3 rounds, 6 groups (0 failed or hung), 41 s; a healthy pair: 0.55 GB/s busbw"]


def job_output(tmp_path, as_json: bool, exit_code: int, result_id: int | None = None) -> None:
    """slurm-77.out as `python -m tools.collective_bench --pattern pairwise [--json]` leaves it under sbatch
    (stderr in the same file), and SLURM's record of the job."""
    result = cb.SPEC.Result(verdict="fail", findings=FOUND, next=["env_report", "dist_smoke_test"], nnodes=4,
                            result_id=result_id)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        _print_result(cb.SPEC, result, as_json, None)
    (tmp_path / "slurm-77.out").write_text("srun: error: mln3: task 1: Exited with exit code 1\n" + out.getvalue())
    return {"job_id": "77", "name": "pairwise", "state": "FAILED", "reason": "NonZeroExitCode",
            "exit_code": exit_code, "signal": 0, "elapsed_s": 95, "time_limit_s": 600, "nodes": "mln[1-4]",
            "workdir": str(tmp_path)}


def diagnose(monkeypatch, tmp_path, info: dict):
    monkeypatch.setattr(sjd, "from_scontrol", lambda job_id: info)
    monkeypatch.setattr(sjd, "from_sacct", lambda job_id, not_seen: (None, [], None))
    return sjd.run(sjd.SlurmJobDiagnoseParams(job_id="77", search_dirs=[str(tmp_path)]), lambda f, m: None)


@pytest.mark.parametrize("as_json", [True, False])
def test_a_pairwise_jobs_exit_3_is_read_as_the_tools_fail_verdict_and_findings(monkeypatch, tmp_path, as_json):
    now = time.time()
    rid = store.save("collective_bench", {"pattern": "pairwise"}, {"verdict": "fail", "findings": FOUND},
                     started=now - 95, ended=now, provenance={"host": "mln1"}, job_id="77")
    r = diagnose(monkeypatch, tmp_path, job_output(tmp_path, as_json, 3, rid))
    assert r.verdict == "fail"
    assert r.findings[0] == ("Job 77 (pairwise) ran collective_bench, which answered verdict fail (exit code 3 is "
                             f"collective_bench's \"fail\" verdict, not a crash): {FOUND[0]}"), r.findings
    assert r.findings[1] == f"collective_bench: {FOUND[1]}"
    assert f"stored as result #{rid} (results_history result_id={rid} shows it)" in r.findings[2]
    text = " ".join(r.findings)
    assert "no known" not in text and "Its script exited with code" not in text and r.log_findings == []
    assert r.next[:2] == ["env_report", "dist_smoke_test"] and "results_history" in r.next


def test_a_report_the_exit_code_does_not_match_is_mentioned_not_believed(monkeypatch, tmp_path):
    r = diagnose(monkeypatch, tmp_path, job_output(tmp_path, True, 1))
    assert r.findings[0].startswith("Job 77 (pairwise) is FAILED")
    assert any(f.startswith("Its output ends with a collective_bench report, verdict fail: Suspect node mln3")
               and "exit code 1 is not that verdict's" in f for f in r.findings), r.findings


def test_a_json_that_is_not_one_of_our_reports_changes_nothing(monkeypatch, tmp_path):
    (tmp_path / "slurm-77.out").write_text('Traceback (most recent call last):\n{\n "verdict": "fail", "loss": 1\n}\n')
    info = {"job_id": "77", "name": "train", "state": "FAILED", "exit_code": 3, "signal": 0, "workdir": str(tmp_path)}
    r = diagnose(monkeypatch, tmp_path, info)
    assert r.findings[0].startswith("Job 77 (train) is FAILED") and not any("report" in f for f in r.findings)
