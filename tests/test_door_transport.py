"""The door "reach a node": only the node transport (tools/engine/srun.py, tools/engine/transport.py) builds an
srun or ssh argv. A module that writes its own fails here, naming the file and line (code review 2026-12-02:
srun argv was built in 7 places, with 3 parsers of what srun said).
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOOR = {"tools/engine/srun.py", "tools/engine/transport.py"}
LAUNCHERS = {"srun", "ssh"}
# Modules still building srun or ssh argv themselves (file -> what, and why it cannot go through the transport).
# Empty since issue 38's last three moved (straggler_find's and hang_stack_dump's job steps, collective_bench's
# RDMA rounds); an entry whose module no longer builds one must go: the list is the work left.
BYPASSES: dict[str, str] = {}


def violations(rel: str, source: str) -> list[str]:
    """Every list or tuple written in `source` whose first word is srun or ssh, as 'file:line: what'."""
    out = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, (ast.List, ast.Tuple)) and n.elts:
            first = n.elts[0]
            if isinstance(first, ast.Constant) and first.value in LAUNCHERS:
                out.append(f"{rel}:{n.lineno}: builds a {first.value} argv itself (use SrunTransport / SshTransport)")
    return out


def all_violations() -> dict[str, list[str]]:
    found = {}
    for path in sorted((ROOT / "tools").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel not in DOOR and (bad := violations(rel, path.read_text())):
            found[rel] = bad
    return found


def test_only_the_transport_builds_srun_or_ssh_argv():
    found = all_violations()
    outside = [line for rel, lines in found.items() if rel not in BYPASSES for line in lines]
    assert not outside, "\n".join(outside)


def test_the_list_of_bypasses_is_the_work_left():
    moved = sorted(set(BYPASSES) - set(all_violations()))
    assert not moved, f"no longer building srun argv, remove from BYPASSES: {moved}"


def test_the_check_sees_an_argv_written_by_hand():
    assert violations("x.py", 'cmd = ["srun", "--overlap", *argv]\nssh = ("ssh", host, "true")\n') == [
        "x.py:1: builds a srun argv itself (use SrunTransport / SshTransport)",
        "x.py:2: builds a ssh argv itself (use SrunTransport / SshTransport)"]
    assert violations("x.py", 'mode = ["sbatch", "srun", "torchrun"]\nwords = ["ssh is a transport"]\n') == []
