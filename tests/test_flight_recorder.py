"""flight_recorder_analyze against real flight-recorder dumps of deliberately broken gloo jobs.

The dumps in tests/fixtures/flight_recorder/ were made by make_dumps.py there (torch 2.13.0+cpu):
each scenario's docstring line says what the right diagnosis is, and the tests assert exactly that.
"""

import json
import pickle
import shutil
from pathlib import Path

import pytest

from tools.flight_recorder_analyze import SPEC, FlightRecorderParams, analyse, read_dumps, run
from tools.shared.culprits import rank_list
from tools.engine.spec import ToolFailure

FIXTURES = Path(__file__).parent / "fixtures" / "flight_recorder"


def analyse_dir(path, **kw):
    return run(FlightRecorderParams(path=str(path), **kw), lambda f, m: None)


def bad_group(result):
    bad = [g for g in result.groups if g.problem not in ("none", "stuck")]
    assert len(bad) == 1, [g.model_dump() for g in result.groups]
    return bad[0]


@pytest.mark.parametrize("fmt", ["pickle", "json"])
def test_healthy_job_has_no_culprit(fmt):
    r = analyse_dir(FIXTURES / "healthy" / fmt)
    assert r.verdict == "ok"
    assert r.culprit_ranks == [] and r.ranks_found == [0, 1, 2, 3] and r.ranks_without_dump == []
    assert r.groups[0].problem == "none" and r.groups[0].last_seq == {"0": 8, "1": 8, "2": 8, "3": 8}
    assert r.backend == "gloo" and r.dump_version == "2.10"


@pytest.mark.parametrize("fmt", ["pickle", "json"])
def test_op_mismatch_names_the_rank_that_broadcast(fmt):
    r = analyse_dir(FIXTURES / "op_mismatch" / fmt)
    g = bad_group(r)
    assert r.verdict == "fail" and r.culprit_ranks == [2]
    assert (g.problem, g.seq, g.waiting_ranks) == ("op_mismatch", 6, [0, 1, 3])
    assert g.expected.startswith("all_reduce #6") and g.found["2"].startswith("broadcast #6")
    assert "Culprit: rank 2" in " ".join(r.findings)


def test_pickle_findings_point_at_the_calling_line():
    r = analyse_dir(FIXTURES / "op_mismatch" / "pickle")
    g = bad_group(r)
    assert "train_step (flight_recorder/make_dumps.py:" in g.expected      # where ranks 0,1,3 called from
    assert "worker (flight_recorder/make_dumps.py:" in g.found["2"]


def test_skipped_collective_names_the_rank_that_ran_ahead():
    r = analyse_dir(FIXTURES / "skipped")
    g = bad_group(r)
    assert r.culprit_ranks == [1] and g.problem == "op_mismatch"
    assert g.found["1"].startswith("barrier #6")


@pytest.mark.parametrize("fmt", ["pickle", "json"])
def test_hung_rank_is_named_with_its_last_collective(fmt):
    r = analyse_dir(FIXTURES / "hung" / fmt)
    g = bad_group(r)
    assert r.culprit_ranks == [3] and g.problem == "missing_ranks" and g.seq == 6
    assert g.waiting_ranks == [0, 1, 2]
    assert g.found["3"].startswith("last issued barrier #5") and "completed" in g.found["3"]
    assert "ranks 0-2 entered all_reduce #6" in r.findings[1] and "wait for rank 3" in r.findings[1]


def test_rank_that_left_no_dump_is_the_suspect():
    r = analyse_dir(FIXTURES / "size_mismatch")         # gloo aborted rank 1 before it could dump
    g = bad_group(r)
    assert r.ranks_found == [0, 2, 3] and r.ranks_without_dump == [1]
    assert g.problem == "no_dump" and r.culprit_ranks == [1] and g.waiting_ranks == [0, 2, 3]
    assert r.verdict == "fail"


def test_silent_dtype_mismatch_is_caught_even_though_it_completed():
    r = analyse_dir(FIXTURES / "dtype_mismatch")
    g = bad_group(r)
    assert r.culprit_ranks == [1] and g.problem == "dtype_mismatch" and g.waiting_ranks == [0, 2, 3]
    assert r.verdict == "fail"
    assert "Double" in g.found["1"] and "Float" in g.expected


@pytest.mark.parametrize("fmt", ["pickle", "json"])
def test_subgroup_hang_is_reported_in_its_own_group(fmt):
    r = analyse_dir(FIXTURES / "subgroup" / fmt)
    g = bad_group(r)
    assert (g.name, g.desc) == ("2", "pair_b")
    assert r.culprit_ranks == [2] and g.waiting_ranks == [3] and g.expected.startswith("all_gather #2")
    others = {x.desc: x.problem for x in r.groups if x is not g}
    assert others == {"default_pg": "none", "pair_a": "none"}


def test_two_ranks_disagreeing_is_a_tie_not_a_guess():
    r = analyse_dir(FIXTURES / "two_ranks")
    g = bad_group(r)
    assert g.problem == "op_mismatch" and g.waiting_ranks == [] and sorted(g.culprit_ranks) == [0, 1]
    assert "no majority" in " ".join(r.findings)


def test_missing_rank_file_is_reported(tmp_path):
    for f in (FIXTURES / "hung" / "pickle").iterdir():
        if f.name != "fr_1":
            shutil.copy(f, tmp_path / f.name)
    r = analyse_dir(tmp_path)
    assert r.ranks_without_dump == [1] and r.culprit_ranks == [3]
    assert any("No dump from rank 1" in f for f in r.findings)


def test_older_torch_layout_is_read(tmp_path):
    """Dumps of torch <= 2.3 used `seq_id` and had no dtypes / is_p2p; the analysis must not need them."""
    for f in (FIXTURES / "hung" / "pickle").iterdir():
        data = pickle.loads(f.read_bytes())
        data["version"] = "2.2"
        for e in data["entries"]:
            e["seq_id"] = e.pop("collective_seq_id")
            for k in ("input_dtypes", "output_dtypes", "is_p2p", "p2p_seq_id", "timeout_ms", "thread_id"):
                e.pop(k, None)
            e["profiling_name"] = e["profiling_name"].replace("gloo:", "nccl:")
        (tmp_path / f"nccl_trace_rank_{f.name[3:]}").write_bytes(pickle.dumps(data))
    r = analyse_dir(tmp_path, prefix="nccl_trace_rank_")
    assert r.culprit_ranks == [3] and r.dump_version == "2.2" and r.backend == "nccl"


def test_nccl_style_pg_config_gives_membership(tmp_path):
    """NCCL dumps carry a usable pg_config: a member with no dump at all must be listed."""
    for f in (FIXTURES / "healthy" / "json").iterdir():
        data = json.loads(f.read_text())
        data["pg_config"] = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3, 4, 5]"}}
        (tmp_path / f.name).write_text(json.dumps(data))
    r = analyse_dir(tmp_path)
    assert r.ranks_without_dump == [4, 5] and r.verdict == "warn"


def test_default_location_comes_from_env(tmp_path, monkeypatch):
    for f in (FIXTURES / "hung" / "json").iterdir():
        shutil.copy(f, tmp_path / f"trace_{f.name[3:]}")
    monkeypatch.setenv("TORCH_FR_DUMP_TEMP_FILE", str(tmp_path / "trace_"))
    assert analyse_dir("").culprit_ranks == [3]


@pytest.mark.parametrize("content,why", [
    (b"", "empty file"),
    (b"\x80\x04\x95\x10\x00\x00", "truncated or corrupt"),
    (bytes(range(256)) * 4, "neither a pickle nor a JSON"),
    (b'{"version": "2.10", "entries": [', "not valid JSON"),
    (b'{"hello": 1}', "not a flight-recorder dump"),
])
def test_bad_files_give_clear_errors(tmp_path, content, why):
    (tmp_path / "fr_0").write_bytes(content)
    with pytest.raises(ToolFailure, match=why):
        analyse_dir(tmp_path)


def test_truncated_dump_next_to_good_ones_is_reported_not_fatal(tmp_path):
    for f in (FIXTURES / "hung" / "pickle").iterdir():
        shutil.copy(f, tmp_path / f.name)
    data = (tmp_path / "fr_2").read_bytes()
    (tmp_path / "fr_2").write_bytes(data[: len(data) // 2])
    r = analyse_dir(tmp_path)
    assert r.ranks_without_dump == [2] and "fr_2" in r.unreadable_files[0]
    assert r.verdict in ("warn", "fail") and r.culprit_ranks      # rank 3 still sits behind, rank 2 silent


def test_pickle_that_would_run_code_is_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))
    (tmp_path / "fr_0").write_bytes(pickle.dumps({"version": "2.10", "entries": [Evil()]}))
    with pytest.raises(ToolFailure, match=r"refused \(unsafe content\): it asks to load builtins.print") as e:
        analyse_dir(tmp_path)
    assert "corrupt" not in str(e.value) and "truncated" not in str(e.value)


def test_missing_directory_says_where_dumps_go():
    with pytest.raises(ToolFailure, match="TORCH_FR_DUMP_TEMP_FILE"):
        analyse_dir("/nonexistent/fr")


def test_rank_list_compresses_ranges():
    assert rank_list([0, 1, 2, 3, 5, 7, 8]) == "0-3, 5, 7, 8"
    assert rank_list([4]) == "4"


def test_spec_runs_in_a_subprocess_and_is_read_only():
    # Dumps are untrusted files of any size: the analysis runs under the runner's deadline and cancel.
    assert SPEC.runs == "subprocess" and SPEC.read_only and SPEC.name == "flight_recorder_analyze"


def test_pickle_and_json_dumps_agree():
    for scenario in ("op_mismatch", "hung", "subgroup"):
        a, _, _ = read_dumps(str(FIXTURES / scenario / "pickle"))
        b, _, _ = read_dumps(str(FIXTURES / scenario / "json"))
        ra, rb = analyse(a), analyse(b)
        assert [(g.problem, g.seq, g.culprit_ranks) for g in ra.groups] == \
               [(g.problem, g.seq, g.culprit_ranks) for g in rb.groups]


GPU_MACHINE_DIRS = sorted(p.parent for p in FIXTURES.glob("*/expected.json"))


@pytest.mark.skipif(not GPU_MACHINE_DIRS, reason="no dumps from the GPU machine yet: run scripts/gpu_fr_dumps.sh "
                                                 "there and copy its nccl_* and torch*_gloo_* directories here")
@pytest.mark.parametrize("scenario", GPU_MACHINE_DIRS, ids=[p.name for p in GPU_MACHINE_DIRS])
def test_dumps_from_the_gpu_machine(scenario):
    """NCCL dumps written by PyTorch's watchdog, and gloo dumps from that machine's (other) torch version."""
    expected = json.loads((scenario / "expected.json").read_text())
    r = analyse_dir(scenario, prefix=expected.get("prefix", ""))
    assert r.backend == ("nccl" if scenario.name.startswith("nccl_") else "gloo")
    if not expected["culprit_ranks"]:
        assert r.verdict == "ok" and r.culprit_ranks == []
        return
    problems = {g.problem for g in r.groups if set(expected["culprit_ranks"]) <= set(g.culprit_ranks)}
    assert problems & set(expected["problems"]), (r.findings, [g.model_dump() for g in r.groups])


@pytest.mark.parametrize("scenario,needle", [
    ("op_mismatch/json", "Culprit rank 2"),        # JSON dumps are re-pickled for it
    ("hung/pickle", "missing ranks: {3}"),
])
def test_pytorch_analyser_second_opinion_agrees(scenario, needle):
    pytest.importorskip("torch")
    r = analyse_dir(FIXTURES / scenario, torch_analyser=True)
    assert any(needle in line for line in r.torch_analyser_output), r.torch_analyser_output
    assert len(r.torch_analyser_output) <= 40


def test_max_groups_never_hides_the_broken_group():
    r = analyse_dir(FIXTURES / "subgroup" / "pickle", max_groups=1)
    assert [g.desc for g in r.groups] == ["pair_b"] and r.culprit_ranks == [2]


def test_point_to_point_entries_are_counted_not_compared(tmp_path):
    for f in (FIXTURES / "healthy" / "json").iterdir():
        data = json.loads(f.read_text())
        data["entries"].append({**data["entries"][-1], "is_p2p": True, "profiling_name": "nccl:send 0->1",
                                "collective_seq_id": 0, "p2p_seq_id": 1})
        (tmp_path / f.name).write_text(json.dumps(data))
    r = analyse_dir(tmp_path)
    assert r.p2p_ops == 4 and r.culprit_ranks == [] and r.verdict == "ok"
    assert any("point-to-point" in f for f in r.findings)


def test_gap_in_sequence_numbers_is_skipped(tmp_path):
    """A sequence number no rank recorded (dropped from every ring buffer) is not a disagreement."""
    for f in (FIXTURES / "hung" / "json").iterdir():
        data = json.loads(f.read_text())
        data["entries"] = [e for e in data["entries"] if e["collective_seq_id"] != 5]   # rank 3 stops at 4
        (tmp_path / f.name).write_text(json.dumps(data))
    r = analyse_dir(tmp_path)
    assert r.culprit_ranks == [3] and bad_group(r).seq == 6


@pytest.mark.anyio
async def test_through_the_mcp_server():
    from mcp import Client

    from tools.engine.mcp_server import build_server

    async with Client(build_server()) as c:
        r = await c.call_tool("flight_recorder_analyze", {"path": str(FIXTURES / "hung" / "pickle")})
        assert not r.is_error and r.structured_content["culprit_ranks"] == [3]
        bad = await c.call_tool("flight_recorder_analyze", {"path": "/nonexistent/fr"})
        assert bad.is_error and "TORCH_FR_DUMP_TEMP_FILE" in bad.content[0].text


def test_every_rank_inside_the_same_collective_is_stuck_not_a_mismatch(tmp_path):
    """All ranks issued #6 and none finished: nothing to blame in the dumps; point at the network/NCCL."""
    stuck_op = next(e for e in json.loads((FIXTURES / "hung" / "json" / "fr_0.json").read_text())["entries"]
                    if e["collective_seq_id"] == 6)
    for f in (FIXTURES / "hung" / "json").iterdir():
        data = json.loads(f.read_text())
        if not any(e["collective_seq_id"] == 6 for e in data["entries"]):
            data["entries"].append(stuck_op)
        (tmp_path / f.name).write_text(json.dumps(data))
    r = analyse_dir(tmp_path)
    g = r.groups[0]
    assert (g.problem, g.seq, g.waiting_ranks, r.culprit_ranks) == ("stuck", 6, [0, 1, 2, 3], [])
    assert r.verdict == "warn" and "nccl_log_analyze" in r.next
    assert any("the collective itself is stuck" in f for f in r.findings)
