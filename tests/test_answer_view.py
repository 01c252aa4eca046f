"""The model view of an answer (rendering.answer_record / answer_text): each fact once, the detail a finding already
says left out and named, the stored record whole behind results_history result_id=N, the output schema kept."""

import json
from pathlib import Path

import anyio
import pytest
from mcp import Client

from tools.engine.mcp_server import build_server
from tools.engine.registry import registry
from tools.engine.rendering import answer_record, answer_text
from tools.engine.spec import Field, Record, Result

ROOT = Path(__file__).resolve().parent.parent
CRASH_LOG = ROOT / "tests" / "fixtures" / "logs" / "gloo_crash.log"
pytestmark = pytest.mark.anyio


class _Row(Record):
    detail_fields = ("samples",)
    name: str = Field(description="Required: stays even when empty.")
    host: str = Field("", description="Empty in a row: left out.")
    gpu: int | None = Field(None, description="Null in a row: left out.")
    samples: list[int] = Field(default_factory=list, description="Detail.")
    evidence: list[str] = Field(default_factory=list, description="Only the first line is shown.")


class _Answer(Result):
    detail_fields = ("seconds", "every_row")
    culprit_rank: int | None = Field(None, description="The culprit.")
    drain: list[str] = Field(default_factory=list, description="Top level: an empty list stays.")
    rows: list[_Row] = Field(default_factory=list, description="Rows.")
    every_row: list[_Row] = Field(default_factory=list, description="Detail.")
    seconds: float = Field(0.0, description="Detail.")


def _answer(**kw) -> _Answer:
    rows = [_Row(name="", samples=[1, 2, 3], evidence=["first line " + "x" * 400, "second line"])]
    return _Answer(verdict="fail", findings=["Rank 3 is the culprit."], next=["hang_stack_dump"], culprit_rank=3,
                   rows=rows, every_row=rows * 5, seconds=1.5, **kw)


def test_the_view_leaves_out_detail_and_says_where_it_is():
    view = answer_record(_answer(result_id=42))
    assert view["findings"] == ["Rank 3 is the culprit."] and view["next"] == ["hang_stack_dump"]
    assert view["culprit_rank"] == 3 and view["drain"] == [] and view["job"] is None
    assert "seconds" not in view and "every_row" not in view
    row = view["rows"][0]
    assert row["name"] == "" and "host" not in row and "gpu" not in row and "samples" not in row
    assert row["evidence"][0].startswith("first line") and row["evidence"][0].endswith("…[cut]") and \
        len(row["evidence"]) == 1
    assert view["not_shown"] == "every_row, rows.samples, seconds; whole: results_history result_id=42"
    _Answer.model_validate(view)                       # still the tool's contract


def test_the_text_says_each_fact_once_and_where_the_rest_is():
    text = answer_text(registry()["log_triage"], _answer(result_id=42))
    assert text.count("Rank 3 is the culprit.") == 1 and "culprit_rank: 3" in text
    assert "1.5" not in text and "samples=" not in text and "every_row[" not in text    # named in not_shown only
    assert "results_history result_id=42" in text and "stored as result" not in text


def test_an_answer_not_stored_keeps_its_detail_nothing_else_could_return_it():
    view = answer_record(_answer())
    # figures inside a row stay whole (up to RECORD_INNER_NAMES): a cut list of ranks reads as another answer
    assert view["seconds"] == 1.5 and len(view["every_row"]) == 5 and view["rows"][0]["samples"] == [1, 2, 3]
    assert view["not_shown"] is None and len(view["rows"][0]["evidence"]) == 1    # quotes are still cut


def test_detail_fields_must_be_fields_with_defaults():
    with pytest.raises(TypeError, match="name no field"):
        type("Bad", (Record,), {"__annotations__": {"a": int}, "a": 0, "detail_fields": ("b",)})
    with pytest.raises(TypeError, match="need a default"):
        type("Bad", (Record,), {"__annotations__": {"a": int}, "detail_fields": ("a",)})


def test_every_tool_declares_detail_that_exists():
    for spec in registry().values():      # the import check ran for each; the view of an empty result is valid
        spec.Result.model_validate(answer_record(spec.Result()))


async def test_through_the_server_the_answer_names_the_culprit_and_the_store_has_the_rest():
    async with Client(build_server()) as client:     # the client validates structured content against the schema
        answer = await client.call_tool("log_triage", {"paths": [str(CRASH_LOG)]})
        view = answer.structured_content
        stored = await client.call_tool("results_history", {"result_id": view["result_id"]})
    assert view["culprit_kind"] == "rank" and view["culprit"]["rank"] == 1, view["findings"]
    assert view["first_failure"]["rank"] == 1 and "signatures" not in view
    assert f"results_history result_id={view['result_id']}" in view["not_shown"]
    whole = stored.structured_content["shown"]["result"]
    assert len(whole["signatures"]) >= 3 and whole["signatures"][0]["evidence"], whole["signatures"]
    text = answer.content[0].text
    assert "rank 1" in text and "signatures[" not in text
    assert len(json.dumps(view)) < len(json.dumps(whole)) / 2
    # A host that reads only the text reaches the rest too: the stored record, whole, without its findings again.
    stored_text = stored.content[0].text
    assert '"signatures": [{"id": "python_exception"' in stored_text, stored_text[-2000:]
    assert stored_text.count(view["findings"][0]) == 1


async def test_job_status_gives_the_finished_tools_answer_with_each_finding_once():
    async with Client(build_server()) as client:
        handle = (await client.call_tool("log_triage", {"paths": [str(CRASH_LOG)], "wait_s": 0.001})).structured_content
        assert handle["job"], "the run outlived a 1 ms wait: a job handle"
        for _ in range(100):
            status = await client.call_tool("job_status", {"job_id": handle["job"]["job_id"]})
            if status.structured_content["jobs"][0]["state"] != "running":
                break
            await anyio.sleep(0.1)
    answer = status.structured_content["result"]
    assert answer["culprit"]["rank"] == 1 and "signatures" not in answer and answer["verdict"] == "fail"
    first = answer["findings"][0]
    assert json.dumps(status.structured_content).count(json.dumps(first)[1:-1]) == 1
    assert status.content[0].text.count(json.dumps(first)[1:-1]) == 1


def test_a_row_keeps_its_list_of_ranks_whole_and_cuts_its_prose():
    """The real model read a flight-recorder group's waiting_ranks as [0] when the finding said ranks 0-2."""
    from tools.flight_recorder_analyze import FlightRecorderResult, GroupReport
    result = FlightRecorderResult(groups=[GroupReport(name="0", ranks=[0, 1, 2, 3], waiting_ranks=[0, 1, 2],
                                                      culprit_ranks=[3])], result_id=7)
    group = answer_record(result)["groups"][0]
    assert (group["ranks"], group["waiting_ranks"], group["culprit_ranks"]) == ([0, 1, 2, 3], [0, 1, 2], [3])


def test_a_stragglers_next_steps_are_never_cut():
    """Model round 10 read "a sleep or a lock wait is the loader's own co…[cut]": advice cut mid-word."""
    from tools.straggler_find import StragglerFindResult
    from tools.straggler_find.answer import next_steps
    from tools.straggler_find.models import Straggler

    s = Straggler(rank=2, host="mln3", pid=31831, reason="data_loading")
    s.next_steps = next_steps(s)
    assert max(len(step) for step in s.next_steps) > 160                # long enough to have been cut
    shown = answer_record(StragglerFindResult(stragglers=[s], result_id=7))["stragglers"][0]["next_steps"]
    assert shown == s.next_steps


def test_whole_records_inside_a_result_are_written_as_json():
    """A real model's pairwise run through the server (cl-slow-node, 2026-12-03) got "Object of type Suspect is not
    JSON serializable" after 7 minutes of measuring: the text view wrote the report's whole_fields (records, not
    dicts) with json.dumps. Every tool's answer with a suspect named went the same way."""
    from tools.collective_bench.isolation import IsolationReport, Suspect
    from tools.collective_bench import CollectiveBenchResult

    report = IsolationReport(pattern="pairwise", nodes=["mln1", "mln2", "mln3"], suspects=[
        Suspect(kind="node", nodes=["mln3"], evidence="slow with 2 of 2 partners")])
    result = CollectiveBenchResult(verdict="fail", findings=["Suspect node mln3."], isolation=report, result_id=7)
    text = answer_text(registry()["collective_bench"], result)
    line = next(x for x in text.splitlines() if x.startswith("  isolation.suspects: "))
    assert json.loads(line.split(": ", 1)[1]) == [{"kind": "node", "nodes": ["mln3"],
                                                   "evidence": "slow with 2 of 2 partners", "cleared": False}]
