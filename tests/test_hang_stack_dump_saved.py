"""hang_stack_dump on saved py-spy dumps (tests/fixtures/pyspy/SOURCE.md): text and --json forms, per node folder
and local rank, pasted text; the same grouping and the same odd rank as a live dump, named first."""

import subprocess
import sys
from pathlib import Path

import pytest

from tools.engine.spec import ToolFailure
from tools.hang_stack_dump import HangStackDumpParams, run

DUMPS = Path(__file__).parent / "fixtures" / "pyspy"


def _run(**kw):
    return run(HangStackDumpParams(**kw), lambda *a: None)


@pytest.mark.parametrize("form", ["text", "json"])
def test_saved_dumps_per_node_name_the_odd_rank_first(form):
    r = _run(dump_paths=[str(DUMPS / form)])
    assert r.odd_ranks == [3] and r.odd_nodes == ["node2"] and r.dumped == 4
    assert r.culprit_kind == "rank" and r.culprit.rank == 3 and r.culprit.node == "node2"
    assert r.findings[0].startswith("Odd one out: rank 3 (node2, local rank 1) is in load_next_batch")
    assert "ranks 0-2 wait in all_reduce" in r.findings[0]
    assert any("host order (node1, node2) x 2 + local rank" in f for f in r.findings)


def test_pasted_dumps_group_without_ranks():
    text = "\n".join((DUMPS / "text" / node / f"local_rank{i}.txt").read_text()
                     for node in ("node1", "node2") for i in (0, 1))
    r = _run(dump_text=text)
    assert r.dumped == 4 and sorted(len(g.pids) for g in r.groups) == [1, 3]
    odd = r.groups[0]
    assert odd.where.startswith("load_next_batch") and not odd.in_collective


def test_a_public_paste_is_read_with_its_main_thread():
    r = _run(dump_paths=[str(DUMPS / "public" / "accelerate_3104_rank.txt")])
    assert r.dumped == 1 and r.groups[0].called_from.startswith("training_loop (src/model_back")
    assert r.culprit is None


def test_not_a_dump_is_refused_saying_what_is_accepted(tmp_path):
    bad = tmp_path / "notes.txt"
    bad.write_text("the job hung at step 300\n")
    with pytest.raises(ToolFailure, match="expected `py-spy dump` output"):
        _run(dump_paths=[str(bad)])
    with pytest.raises(ToolFailure, match="not both"):
        _run(dump_paths=[str(bad)], pids=[1])


@pytest.mark.parametrize("dump", ['[{"pid":1e400,"frames":[]}]', '[{"pid":[1],"frames":[]}]',
                                  '[{"pid":1,"frames":5}]', '[{"pid":1,"frames":[5]}]'])
def test_crafted_py_spy_json_is_an_error_naming_the_form_not_a_traceback(tmp_path, dump):
    """Red team of round 4: each of these ended in a traceback (OverflowError, TypeError, AttributeError)."""
    path = tmp_path / "rank0.json"
    path.write_text(dump)
    out = subprocess.run([sys.executable, "-m", "tools", "run", "hang_stack_dump", "--dump-paths", str(path)],
                         capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent, timeout=120)
    assert out.returncode != 0 and "Traceback" not in out.stderr + out.stdout
    assert "py-spy" in out.stderr + out.stdout
