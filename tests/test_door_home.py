"""The home door: under tools/, files and folders are created only through tools/engine/home.py (under
$MLENG_HOME) and tools/shared/safe_write.py (a path a caller named). Every other place that creates one is
listed below with the reason it is not under the home; a new one fails until it goes through the door or
is listed with its reason (security review 2026-12-02, R1: the GPU lock, the token file, the drill folder
and the caches each created files their own way, and each was a way in for another user).

What counts as creating: os.open with O_CREAT, open()/.open()/os.fdopen() in a mode that writes ("w", "a",
"x", "+"), mkdir/makedirs, np.save/savez, Path.write_text/write_bytes/touch, shutil copies, a SQLite
connect (store.py only), and mkdtemp/NamedTemporaryFile/TemporaryDirectory.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / "tools"
DOORS = {"tools/engine/home.py", "tools/shared/safe_write.py"}

# (file, what) -> why this creation is not under $MLENG_HOME, or is the door's own use.
ALLOWED: dict[tuple[str, str], str] = {
    ("tools/engine/store.py", "sqlite3.connect"): "the results database, in private_dir() after private_file() made it 0600",
    ("tools/evals/embed.py", "np.savez"): "into an io.BytesIO; the bytes reach the home through write_private",
    ("tools/flight_recorder_analyze/torch_trace.py", "tempfile.TemporaryDirectory"):
        "a fresh 0700 temp folder (mkdtemp) for fr_trace's input copies, removed at the end; not the home",
    ("tools/flight_recorder_analyze/torch_trace.py", ".write_bytes"): "inside that private temp folder",
    ("tools/evals/drills/faults.py", "open(write)"): "an ssh-launched drill job's output, in the drill's work "
                                                     "folder, which private_dir('drill', 'work') made 0700",
    ("tools/launch_script/__init__.py", ".mkdir"): "the job's log folder in the caller's work dir, which SLURM needs",
    ("tools/shared/scratch.py", "tempfile.mkdtemp"): "the ranks' own TMPDIR on the host that starts them "
                                                     "(0700, locked while in use, removed after the run)",
    ("tools/storage_bench/__init__.py", "tempfile.mkdtemp"): "the benchmark's scratch folder on the filesystem "
                                                             "the caller asked to measure",
    ("tools/storage_bench/storage_io.py", "os.open(O_CREAT)"): "an O_DIRECT probe in that scratch folder",
    ("tools/storage_bench/storage_io.py", "os.makedirs"): "the small-files folder in that scratch folder",
    ("tools/storage_bench/storage_io.py", "open(write)"): "the small files the benchmark times, in that folder",
    ("tools/straggler_find/node.py", "tempfile.TemporaryDirectory"): "py-spy's raw output, a fresh 0700 temp "
                                                                     "folder removed at the end",
}


def _mode_writes(node: ast.Call, position: int) -> bool:
    mode = node.args[position] if len(node.args) > position else next(
        (k.value for k in node.keywords if k.arg == "mode"), None)
    return isinstance(mode, ast.Constant) and isinstance(mode.value, str) and any(c in mode.value for c in "wax+")


def _names(node: ast.AST) -> set[str]:
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)} | {
        n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _dotted(func: ast.AST) -> str:
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
    return ".".join(reversed(parts))


CREATORS = {"mkdir", "makedirs", "save", "savez", "savez_compressed", "write_text", "write_bytes", "touch",
            "copy", "copy2", "copyfile", "copytree", "mkdtemp", "mkstemp", "NamedTemporaryFile",
            "TemporaryDirectory"}


def creations(source: str) -> list[tuple[int, str]]:
    """(line, what) for every call in `source` that creates a file or a folder."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        last = name.rsplit(".", 1)[-1]
        if name == "os.open" and len(node.args) > 1 and "O_CREAT" in _names(node.args[1]):
            found.append((node.lineno, "os.open(O_CREAT)"))
        elif name == "open" and _mode_writes(node, 1):
            found.append((node.lineno, "open(write)"))
        elif name == "os.fdopen":
            continue                   # wraps a descriptor something above opened (and was checked)
        elif last == "open" and isinstance(node.func, ast.Attribute) and _mode_writes(node, 0):
            found.append((node.lineno, ".open(write)"))
        elif last in CREATORS and (last not in ("save", "copy") or name.startswith(("np.", "numpy.", "shutil."))):
            found.append((node.lineno, name if "." in name and name.split(".")[0] in ("os", "np", "shutil",
                                                                                       "tempfile") else f".{last}"))
        elif name == "sqlite3.connect":
            found.append((node.lineno, name))
    return found


def test_files_are_created_only_through_the_home_door_or_with_a_stated_reason():
    unlisted, used = [], set()
    for path in sorted(TOOLS.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in DOORS:
            continue
        for line, what in creations(path.read_text()):
            key = (rel, what)
            if key in ALLOWED:
                used.add(key)
            else:
                unlisted.append(f"{rel}:{line} {what}")
    assert not unlisted, ("files or folders created outside tools/engine/home.py and tools/shared/safe_write.py "
                          "(use private_dir / write_private / open_lock, or list it in ALLOWED with why it is "
                          "not under $MLENG_HOME):\n  " + "\n  ".join(unlisted))
    assert not set(ALLOWED) - used, f"ALLOWED entries that match nothing any more: {sorted(set(ALLOWED) - used)}"


OLD_RUNNER_LOCK = '''
def gpu_locks(devices, cancel, progress):
    lock_dir = store.private_dir("locks", socket.gethostname())
    for device in devices:
        f = open(lock_dir / f"gpu{device}.lock", "a+")
'''


def test_the_door_test_catches_the_old_ways():
    """Each way the 2026-12-02 review found is seen: the runner's lock, the token file's O_TRUNC open, the
    drill's mkdir, the embed cache's np.savez, a write_text."""
    assert creations(OLD_RUNNER_LOCK) == [(5, "open(write)")]
    assert creations("fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)") == [
        (1, "os.open(O_CREAT)")]
    assert [w for _, w in creations("drill_dir().mkdir(parents=True)\nnp.savez(tmp, **v)\np.write_text('x')\n"
                                     "shutil.copyfile(a, b)\nsqlite3.connect(db)")] == [
        ".mkdir", "np.savez", ".write_text", "shutil.copyfile", "sqlite3.connect"]
    assert creations("open(p)\nopen(p, 'rb')\nos.open(p, os.O_RDONLY)\nnp.load(p)\n") == []
