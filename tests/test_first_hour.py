"""What a new user trips on in the first hour (issue 37; review 2026-12-02-first-run): each a test."""

import json
import os
import subprocess
import sys

from tools.engine.doctor import doctor_text, server_launcher
from tools.engine.rendering import clip

from conftest import REPO

SMOKE = ("All 2 ranks on 1 host(s) joined, passed the barrier and an exact all_reduce check (gloo); slowest rank "
         "per stage: init 0.219 s, barrier 0.005 s, all_reduce 0.052 s.")


def test_doctor_cuts_a_long_finding_at_a_word_and_says_what_to_do_next():
    text = doctor_text({"host": "vm", "gpu_names": []}, [("dist_smoke_test", "ok", 5.2, SMOKE)], ["matmul_bench"], [])
    row = next(line for line in text.splitlines() if "dist_smoke_test" in line)
    assert row.endswith("slowest rank per…") and "per sta" not in row   # was: "... slowest rank per sta"
    assert len(clip(SMOKE, 110)) <= 110 and clip("short", 110) == "short"
    assert f"claude mcp add -s user mleng -- {server_launcher()}" in text
    assert "mleng run <tool> --help" in text


def test_the_server_launcher_starts_from_any_directory(tmp_path):
    """What doctor tells hosts to run is an absolute command, not a bare `python` that a host resolves elsewhere."""
    launcher = server_launcher()
    assert launcher.startswith(sys.executable) and os.path.isabs(launcher.split()[1])
    out = subprocess.run(launcher.split() + ["--help"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--python" in out.stdout


def test_mleng_run_help_shows_usage_and_the_tools():
    from tools.engine.registry import registry

    for args in (["run", "--help"], ["run"], ["run", "-h"]):
        out = subprocess.run([sys.executable, "-m", "tools", *args], cwd=REPO, capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr    # was: rc 2, "the following arguments are required: tool, rest"
        assert out.stdout.startswith("usage: mleng run TOOL") and all(name in out.stdout for name in registry())


def test_a_validation_error_says_the_rule_without_library_leftovers():
    import pydantic
    import pytest

    from tools.engine.registry import get_spec
    from tools.engine.rendering import validation_message, validation_problems

    spec = get_spec("straggler_find")
    with pytest.raises(pydantic.ValidationError) as caught:
        spec.Params()
    line, = validation_problems(caught.value, flag_style=True)
    assert line.startswith("give exactly one of") and "slurm_job_id" in line
    assert "Value error" not in line and "(arguments)" not in line and "(got {})" not in line
    with pytest.raises(pydantic.ValidationError) as caught:
        spec.Params(pids=[1], window_s=2)
    assert "window_s: Input should be greater than or equal to 5 (got 2)" in validation_message(spec, caught.value)


def test_memory_estimate_takes_a_gpu_count_and_hugging_face_ids():
    import pydantic
    import pytest

    from tools.memory_estimate import MemoryParams, run

    def total(**kw):
        return run(MemoryParams(sharding="zero3", accelerator="h100", **kw), lambda *_: None).total_gib

    assert total(model="meta-llama/Meta-Llama-3-70B", num_gpus=64) == total(model="llama-3-70b", dp=64)
    assert total(model="https://huggingface.co/meta-llama/llama-3.1-70b-instruct", num_gpus=64, tp=8) == \
        total(model="llama-3-70b", dp=8, tp=8)
    for bad, said in [(dict(model="llama-3-70b", num_gpus=64, tp=3), "not a multiple of tp x pp x cp = 3"),
                      (dict(model="llama-3-70b", num_gpus=64, dp=4), "num_gpus=64 and dp=4 disagree"),
                      (dict(model="meta-llama/Llama-9-1T"), "not a known preset or Hugging Face id")]:
        with pytest.raises(pydantic.ValidationError, match=said):
            MemoryParams(**bad)


def test_drill_list_has_a_header_and_drill_start_shows_the_diagnosis_format(capsys):
    from tools.evals.drills.cli import main, start_text
    from tools.evals.drills.grade import parse_diagnosis

    assert main(["list"]) == 0
    header, first = capsys.readouterr().out.splitlines()[:2]
    assert header.split() == ["id", "runs", "on", "topic", "ci"] and first.split()[0] != "id"
    text = start_text("pm-crash-first-rank", {"message": "My job died.", "server": ["mleng", "serve"]})
    assert '"culprit_kind": "node|link|rank|gpu|setting|none|inconclusive"' in text
    assert "mleng drill grade pm-crash-first-rank --diagnosis FILE" in text
    shown = text.split("write the diagnosis as JSON, ")[1].split(", to FILE")[0]
    assert parse_diagnosis(shown.replace("node|link|rank|gpu|setting|none|inconclusive", "rank")).culprit_kind == "rank"
    # Two faults and a link, as the notes beside the format spell them (a model round graded "link mln1, link
    # mln2" for a link given as two names, and had nowhere to put the second fault).
    notes = text.split(", to FILE (")[1]
    assert '"mln1-mln2"' in notes and 'also: [{"culprit_kind": "node", "culprit": ["mln4"]}]' in notes
    also = json.loads(notes.split("also: ")[1].split("); then")[0])
    assert parse_diagnosis(json.dumps({"culprit_kind": "link", "culprit": ["mln1-mln2"], "also": also})).also[0].culprit == ["mln4"]


def test_the_eval_readme_counts_are_the_files_counts():
    import collections
    import json
    import re

    text = (REPO / "evals" / "README.md").read_text()
    cases = [json.loads(line) for line in (REPO / "evals" / "cases.jsonl").read_text().splitlines() if line.strip()]
    splits = collections.Counter(c["split"] for c in cases)
    firsts = collections.Counter(c["expected"][0] for c in cases)
    said = re.search(r"(\d+) cases, one JSON object a line", text).group(1)
    assert int(said) == len(cases)
    assert f"{sum(c['difficulty'] == 'hard' for c in cases)} are `hard`" in text
    assert f"`split`: {splits['tune']} `tune`, {splits['heldout']} `heldout`" in text
    assert f"{firsts.pop('(none)')} cases are" in text
    lo, hi = re.search(r"expected first call (\d+)–(\d+) times \(([^)]*)\)", text).group(1, 2)
    outside = dict(re.findall(r"`(\w+)` (\d+)", re.search(r"first call \d+–\d+ times \(([^)]*)\)", text).group(1)))
    assert {k: str(v) for k, v in firsts.items() if not int(lo) <= v <= int(hi)} == outside
    public = [json.loads(line) for line in (REPO / "evals" / "public_cases.jsonl").read_text().splitlines() if line]
    assert f"{len(public)} cases, each drawn from one public" in text
    psplit = collections.Counter(c["split"] for c in public)
    assert f"{psplit['heldout']} `heldout`,\n{psplit['tune']} `tune`" in text
