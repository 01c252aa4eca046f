"""Secrets never leave in an answer (security review 2026-12-02, R8): the redactor's corpus of forms, and
one redaction on the way out of the engine for every tool's answer (findings and rows quoting a pasted
table or a file the agent never saw), job errors and progress included."""

import json
import sqlite3
import time
from pathlib import Path

import pytest
from mcp import Client

from tools.engine.mcp_server import build_server
from tools.engine.redact import redact

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "fixtures" / "secrets" / "forms.jsonl"
DCGMI = ROOT / "tests" / "fixtures" / "dcgm" / "dcgmi_r3_row_remap_error_mlengineering.txt"
IBDIAGNET = ROOT / "tests" / "fixtures" / "nic_text" / "ibdiagnet_pm_rose_ncar.txt"


def _text(result) -> str:
    return "\n".join(getattr(block, "text", "") for block in result.content)


def _stored(home: Path) -> str:
    with sqlite3.connect(home / "results.sqlite3") as db:
        return " ".join(p + r for p, r in db.execute("SELECT params, result FROM results"))


def test_the_corpus_holds_over_a_hundred_forms_and_clean_lines_and_every_form_is_caught():
    rows = [json.loads(line) for line in CORPUS.read_text().splitlines()]
    secrets_, clean = [r for r in rows if r["secret"]], [r for r in rows if not r["secret"]]
    assert len(secrets_) >= 100 and len(clean) >= 30
    missed = [r["form"] for r in secrets_ if r["secret"] in redact(r["line"])]
    changed = [r["form"] for r in clean if redact(r["line"]) != r["line"]]
    assert not missed and not changed, (missed, changed)


# The review's leaked forms, each inside the kind of line a crashing rank prints.
LEAKS = {
    "xapp-1-A0TESTAPP-1111111111-deadbeefcafe0123deadbeefcafe0123": "deadbeefcafe0123deadbeefcafe0123",
    "bearer eyAbCdEf0123456789LOWERBEARER": "eyAbCdEf0123456789LOWERBEARER",
    '{\\"password\\": \\"EscJsonPw-55\\"}': "EscJsonPw-55",
    "DB_PASS=DbPassValue-99": "DbPassValue-99",
    "redis-cli -a RedisCliSecret-14 ping": "RedisCliSecret-14",
    "docker login -u deploy -p DockerLoginPw-15 nvcr.io": "DockerLoginPw-15",
    "nvapi-Zz9Yy8Xx7Ww6Vv5Uu4Tt3Ss2Rr1Qq0PpOoNnMmLl": "Zz9Yy8Xx7Ww6Vv5Uu4Tt3Ss2Rr1Qq0PpOoNnMmLl",
    "whsec_5f1a2b3c4d5e6f708192a3b4c5d6e7f8": "5f1a2b3c4d5e6f708192a3b4c5d6e7f8",
    "password%3DUrlEncPw-17": "UrlEncPw-17",
    "sv=2021-08-06&ss=b&sp=r&sig=QXp1cmVTaWdTZWNyZXQy": "QXp1cmVTaWdTZWNyZXQy",
}


@pytest.mark.anyio
async def test_the_reviews_leaked_forms_in_rank_errors_leave_neither_in_the_answer_nor_in_the_store(mleng_home):
    log = "\n".join(f"[rank{i}]: RuntimeError: ncclSystemError: System call failed {form}"
                    for i, form in enumerate(LEAKS))
    async with Client(build_server()) as c:
        r = await c.call_tool("log_triage", {"text": log, "evidence_lines": 20})
    assert not r.is_error, _text(r)
    answer = json.dumps(r.structured_content) + _text(r)
    assert "ncclSystemError" in answer and "[REDACTED]" in answer
    stored = _stored(mleng_home)
    leaked = [s for s in LEAKS.values() if s in answer or s in stored]
    assert not leaked, leaked


@pytest.mark.anyio
async def test_gpu_health_quotes_a_pasted_dcgmi_table_with_its_secrets_redacted(mleng_home):
    table = DCGMI.read_text().replace(
        "|  remappings are pending                        |",
        "|  remappings are pending HF_TOKEN=hf_LEAKabcdefghij0123 api_key=LEAKZZ99 |")
    assert "LEAKZZ99" in table
    async with Client(build_server()) as c:
        r = await c.call_tool("gpu_health", {"text": table})
    assert not r.is_error, _text(r)
    answer = json.dumps(r.structured_content) + _text(r)
    assert "remapp" in answer.lower(), answer[:2000]
    for secret in ("hf_LEAKabcdefghij0123", "LEAKZZ99"):
        assert secret not in answer and secret not in _stored(mleng_home), secret


@pytest.mark.anyio
async def test_nic_health_quotes_a_pasted_ibdiagnet_line_with_its_secrets_redacted(mleng_home):
    text = IBDIAGNET.read_text().replace("r9i1n24/U1/P1", "r9i1n24/U1/P1;password=LEAKNIC77")
    async with Client(build_server()) as c:
        r = await c.call_tool("nic_health", {"text": text})
    assert not r.is_error, _text(r)
    answer = json.dumps(r.structured_content) + _text(r)
    assert "r9i1n24" in answer and "LEAKNIC77" not in answer and "LEAKNIC77" not in _stored(mleng_home)


def test_a_job_error_and_its_progress_messages_are_redacted():
    from tools.engine.jobs import Job
    from tools.engine.registry import get_spec

    spec = get_spec("mfu_calc")
    job = Job(spec, spec.Params.model_construct(), timeout_s=5)    # never started: only its records are used
    job._progress(0.5, "reading --password ProgressPw-41 from the launcher")
    assert "ProgressPw-41" not in job.message and "ProgressPw-41" not in json.dumps(job.progress_log)
    job._end("failed", error="srun: error: token=ErrTok-42 refused")
    assert "ErrTok-42" not in job.error and "[REDACTED]" in job.error
