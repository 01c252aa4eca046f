"""The door "find a job's processes": only tools/shared/process_targets/ reads another process's environment or
working directory, lists processes to pick targets, or decides which of them are ranks. A module that goes around
it fails here, naming the file and line (security review 2026-12-02 R2/R14: targets were picked from any user's
SLURM_JOB_ID; code review: straggler_find's own role rule and environ reader).
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOOR = "tools/shared/process_targets/"
# Modules that list or walk processes for another purpose than picking targets, and why.
MAY_LIST = {
    "tools/engine/processes.py": "kill_tree: walks the children of a process tree it started itself",
    "tools/shared/occupancy.py": "CPU occupancy: counts other users' CPU time, never reads or targets them",
}
# What process_targets offers; its private helpers (listing by env, by launcher, ...) are not for import.
DOOR_NAMES = {"ALLOW_OTHER_USERS_HELP", "Identity", "RunningJob", "TargetRequest", "Targets", "describe", "env_int",
              "frozen_reason", "identity", "is_python", "roles", "running_job", "select", "RANK_VARS",
              "LOCAL_RANK_VARS", "OUR_MARKS", "check_run_id", "check_launcher_match", "check_job_name",
              "cpu_seconds"}  # a process's CPU seconds, read by the kernel door for hang_stack_dump and straggler_find
LISTING = {("psutil", "process_iter"), ("psutil", "pids")}


def _strings(node: ast.AST):
    """(line, text) of every string literal; an f-string's text with {} where its values go."""
    for n in ast.walk(node):
        if isinstance(n, ast.JoinedStr):
            yield n.lineno, "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in n.values)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            yield n.lineno, n.value


def violations(rel: str, source: str) -> list[str]:
    """Every way `source` (the module at `rel`) goes around the door, as 'file:line: what'."""
    out = []
    for n in ast.walk(ast.parse(source)):
        where = f"{rel}:{getattr(n, 'lineno', 0)}"
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
            receiver = n.func.value
            name = n.func.attr
            if name == "environ":
                out.append(f"{where}: reads a process's environment (.environ())")
            elif name == "cwd" and not (isinstance(receiver, ast.Name) and receiver.id in ("Path", "os", "pathlib")):
                out.append(f"{where}: reads a process's working directory (.cwd())")
            elif isinstance(receiver, ast.Name) and (receiver.id, name) in LISTING and rel not in MAY_LIST:
                out.append(f"{where}: lists processes ({receiver.id}.{name})")
            elif name == "children" and rel not in MAY_LIST:
                out.append(f"{where}: walks a process's children (.children())")
        elif isinstance(n, ast.ImportFrom) and (n.module or "").endswith("process_targets"):
            for alias in n.names:
                if alias.name not in DOOR_NAMES:
                    out.append(f"{where}: imports process_targets.{alias.name}, not part of the door "
                               f"({', '.join(sorted(DOOR_NAMES))})")
    for line, text in _strings(ast.parse(source)):
        if text.rstrip("/").endswith(("/environ", "/cwd")) or text in ("environ", "cwd"):
            out.append(f"{rel}:{line}: names /proc/PID/environ or cwd ({text[:40]!r})")
    return out


def _modules():
    for path in sorted((ROOT / "tools").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if not rel.startswith(DOOR):
            yield rel, path.read_text()


def test_no_module_finds_processes_around_the_door():
    found = [v for rel, source in _modules() for v in violations(rel, source)]
    assert not found, "go through tools/shared/process_targets/:\n" + "\n".join(found)


OLD_NODE = '''
from ..shared.process_targets import describe, launcher_targets, processes_with_env

def find_ranks(spec):
    pids = list(spec.get("pids") or [])
    if spec.get("launcher_pid"):
        pids += launcher_targets(int(spec["launcher_pid"]))
    if spec.get("job_id"):
        pids += processes_with_env("SLURM_JOB_ID", str(spec["job_id"]))
    return pids
'''
OLD_FLIGHT = '''
def _whose(pid):
    import psutil
    proc = psutil.Process(pid)
    return proc.environ(), proc.cwd(), proc.uids().real, proc.create_time()
'''


@pytest.mark.parametrize("rel, source, expected", [
    ("tools/straggler_find/node.py", OLD_NODE, "imports process_targets.launcher_targets"),
    ("tools/straggler_find/flight.py", OLD_FLIGHT, "reads a process's environment"),
    ("tools/<any>.py", "import psutil\nfor p in psutil.process_iter(): pass\n", "lists processes"),
    ("tools/<any>.py", "open(f'/proc/{pid}/environ')\n", "names /proc/PID/environ"),
    ("tools/<any>.py", "import psutil\npsutil.Process(1).children(recursive=True)\n", "walks a process's children"),
])
def test_the_door_test_fails_on_code_that_goes_around_it(rel, source, expected):
    """The code straggler_find had at 477fe48 (its node.py and flight.py) is caught, and so are the other ways."""
    assert any(expected in v for v in violations(rel, source)), violations(rel, source)


def test_reading_our_own_working_directory_is_not_a_violation():
    assert violations("tools/<any>.py", "from pathlib import Path\nPath.cwd()\nimport os\nos.getcwd()\n") == []
