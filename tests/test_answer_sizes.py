"""The answers a model reads in the drills stay at most half of what they were at 6dba660 (issue 36), in both views a
host may hand it (the text, the structured content) and in characters and WordPiece tokens, as
bench/answer_sizes.py measures them: the scripted baseline plays every local drill through the real server.

When this fails, an answer grew: say a fact once (a finding, or a row, not both), or list the field in its class's
`detail_fields` (the store keeps it; the answer's `not_shown` says how to get it). docs/benchmarks.md has the table.
"""

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# `python bench/answer_sizes.py --before <worktree of 6dba660> --json`, the "before" medians over every answer of
# the 10 drills 6dba660 has (report["before"]["median_common"]); WordPiece counted without the file's padding.
BASELINE_DRILLS = ("pm-clean-log", "pm-crash-first-rank", "pm-flight-recorder-hang", "pm-gpu-off-the-bus",
                   "pm-init-hang", "pm-oom-one-rank", "pm-rank-files-dataloader", "pm-silent-rank",
                   "pm-socket-fallback", "pm-watchdog-missing-rank")
BEFORE = {"text": {"chars": 5_905, "tokens_wordpiece": 2_792},
          "structured": {"chars": 4_554, "tokens_wordpiece": 2_226}}


@pytest.mark.slow
def test_the_median_answer_on_the_drills_is_at_most_half_of_6dba660s(tmp_path):
    # --drills: only the ten the budget is over (of 18 local drills), each played through the real server
    out = subprocess.run([sys.executable, str(REPO / "bench" / "answer_sizes.py"), "--json", "--drills", *BASELINE_DRILLS],
                         cwd=REPO,
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "MLENG_HOME": str(tmp_path / "home")})
    assert out.returncode == 0, out.stderr[-2000:]
    drills = json.loads(out.stdout.strip().splitlines()[-1])["now"]["drills"]
    assert set(BASELINE_DRILLS) == set(drills), sorted(drills)
    assert all(drills[d]["score"] == 1.0 for d in BASELINE_DRILLS), {d: drills[d]["score"] for d in BASELINE_DRILLS}
    over = {}
    for view, units in BEFORE.items():
        for unit, before in units.items():
            sizes = [n for d in BASELINE_DRILLS for n in drills[d][view].get(unit, [])]
            assert sizes, f"no {unit} counted: the test extra's MiniLM tokenizer is not installed"
            if statistics.median(sizes) > before / 2:
                over[f"{view} {unit}"] = (statistics.median(sizes), before // 2)
    assert not over, f"median answer over half of 6dba660's (now, budget): {over}"
