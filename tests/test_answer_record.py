"""collective_bench pairwise's answer as a model reads it (rendering.answer_record), directly and followed
through job_status: the nodes and every suspect whole, never cut to their first item.

The bug this holds: the isolation report sits inside the result, where the model view cut lists to their first
item, so a 4-node pairwise report followed through job_status read isolation.nodes == ['mln1'] and a slow link
as one of its ends (tests/test_pair_agent_seat.py in the clean-clone CI run, issue 35)."""

from tools.collective_bench import CollectiveBenchResult
from tools.collective_bench.isolation import GroupRecord, IsolationReport, Suspect
from tools.engine.rendering import answer_record
from tools.job_status import JobInfo, JobStatusResult

NODES = ["mln1", "mln2", "mln3", "mln4"]


def pairwise_result(result_id: int | None = 5) -> CollectiveBenchResult:
    groups = [GroupRecord(round=r, nodes=[a, b], status="ok", busbw_gbps=0.3)
              for r, (a, b) in enumerate([("mln1", "mln2"), ("mln3", "mln4"), ("mln1", "mln3")], start=1)]
    suspects = [Suspect(kind="link", nodes=["mln1", "mln2"], evidence="slow twice"),
                Suspect(kind="node", nodes=["mln4"], evidence="slow with 3 of 3 partners")]
    matrix = [[None, 0.3, 0.31, 0.29], [0.3, None, 0.3, 0.3], [0.31, 0.3, None, 0.3], [0.29, 0.3, 0.3, None]]
    return CollectiveBenchResult(verdict="fail", findings=["one"], result_id=result_id, isolation=IsolationReport(
        pattern="pairwise", nodes=NODES, rounds=3, groups=groups, suspects=suspects, busbw_matrix=matrix,
        unconfirmed=[Suspect(kind="link", nodes=["mln3", "mln4"], evidence="fine again")]))


def test_the_nodes_and_every_suspect_are_whole_and_the_bulk_is_left_to_results_history():
    view = answer_record(pairwise_result())
    report = view["isolation"]
    assert report["nodes"] == NODES                                   # was ['mln1']
    assert [s["nodes"] for s in report["suspects"]] == [["mln1", "mln2"], ["mln4"]]   # was one suspect, one end
    assert report["unconfirmed"][0]["nodes"] == ["mln3", "mln4"]
    assert "groups" not in report and "busbw_matrix" not in report   # no longer cut to a first group, [[None]]
    assert "isolation.groups" in view["not_shown"] and "results_history result_id=5" in view["not_shown"]


def test_job_status_hands_the_same_answer():
    result = pairwise_result()
    status = JobStatusResult(verdict="fail", jobs=[JobInfo(job_id="j", tool="collective_bench", state="done",
                                                           elapsed_s=1.0, fraction_done=1.0, message="")],
                             result=answer_record(result))
    assert answer_record(status)["result"] == answer_record(result)


def test_a_result_that_is_not_stored_keeps_its_groups():
    report = answer_record(pairwise_result(result_id=None))["isolation"]
    assert len(report["groups"]) >= 1 and report["nodes"] == NODES
