"""What an agent reads before its first call (SKILL.md + the model's view of tools/list + the server
instructions) stays within issue 27's budget: at most half of what it was at c795dde, in characters and in
WordPiece tokens, as bench/agent_reading_cost.py measures them.

Anything added to SKILL.md, a tool description or a published schema is paid by every session of every
user; when this fails, take as much out as you put in (tools/engine/schemas.py says what is not published).
"""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# bench/agent_reading_cost.py --before <worktree of c795dde>, total_model_reads of the "before" checkout
# (WordPiece counted without the tokenizer file's padding to 128).
BEFORE = {"chars": 119_428, "tokens_wordpiece": 45_736}


def test_what_the_model_reads_first_is_at_most_half_of_c795dde():
    out = subprocess.run([sys.executable, str(REPO / "bench" / "agent_reading_cost.py"), "--json"], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    now = json.loads(out.stdout)["total_model_reads"]
    assert "tokens_wordpiece" in now, "the test extra's MiniLM tokenizer is not installed"
    over = {key: (now[key], before // 2) for key, before in BEFORE.items() if now[key] > before // 2}
    assert not over, f"over half of c795dde (now, budget): {over}"
