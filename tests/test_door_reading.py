"""The reading door: a file someone else wrote is opened only through tools/shared/safe_read.py (regular files only,
no kernel pseudo-files, a non-blocking open, bounded reads). An AST walk of tools/ fails on every raw read (`open()` for
reading, `Path.read_text`, `Path.read_bytes`, `io.open`, `gzip.open`) in a module not listed below with its reason:
the layering test's twin, so the next reader cannot walk around the door without saying why.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Modules that read files raw, each with whose files they are. Kernel files (/proc, /sys) have no door of their own
# yet (the 2026-12-02 code review's "kernel files" row); each such reader names its fixed path.
RAW_READS_ALLOWED = {
    "tools/shared/safe_read.py": "the door itself (and /proc/self/mountinfo, the kernel's list of our mounts)",
    "tools/engine/data.py": "knowledge/data/*.toml: our own files, shipped with the package",
    "tools/engine/knowledge.py": "knowledge/*.md pages: our own files, the path checked against traversal",
    "tools/engine/mcp_server.py": "our own package files (the tool-list cache digest, knowledge resources)",
    "tools/collective_bench/rank.py": "sysfs: /sys/class/infiniband port attributes (kernel files)",
    "tools/fleet_sweep/cpu_probe.py": "/proc/cpuinfo (kernel file)",
    "tools/gpu_health/pcie.py": "sysfs PCIe link attributes (kernel files)",
    "tools/memory_bandwidth_bench/measure.py": "sysfs numa_node of a PCI device (kernel file)",
    "tools/shared/occupancy.py": "/proc/pressure and /proc/<pid> files (kernel files)",
    "tools/shared/process_targets/kernel.py": "/proc/<pid>/stat, cgroup and the cgroup freezer files (kernel files)",
    "tools/evals/drills/stamps.py": "/proc/<pid>/stat start times of the processes the drill itself started",
    "tools/engine/job_python.py": "torch's own version.py in the job's Python, parsed as data (literals only)",
    "tools/shared/pyspy.py": "/proc/sys/kernel/yama/ptrace_scope (kernel file)",
    "tools/shared/topology.py": "sysfs topology attributes (kernel files)",
    "tools/straggler_find/probes.py": "/proc and /sys counters of this node (kernel files)",
    "tools/shared/cgroup_cpu.py": "/proc/<pid>/cgroup and the cgroup quota files under /sys/fs/cgroup (kernel files)",
    "tools/straggler_find/node.py": "py-spy's raw output, written by the py-spy we started into our own temp folder",
    "tools/storage_bench/storage_io.py": "its own test files, and /proc/mounts (kernel file)",
    "tools/evals/embed.py": "dev-only evals harness: the embedding model's config in our own cache",
    "tools/evals/metrics.py": "dev-only evals harness: its own results files",
    "tools/evals/routers.py": "dev-only evals harness: our own SKILL.md",
    "tools/evals/inspect_task.py": "dev-only evals harness: our own SKILL.md",
    "tools/evals/run.py": "dev-only evals harness: --descriptions, a file the developer names",
    "tools/evals/drills/cluster.py": "drills (not served): the drill's own state and output files",
    "tools/evals/drills/faults.py": "drills (not served): state.json, being validated by the drills work (R4)",
    "tools/evals/drills/scenarios.py": "drills (not served): our own scenario fixtures",
}


def _is_read_mode(call: ast.Call) -> bool:
    mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
    if mode is None:
        return True
    return not (isinstance(mode, ast.Constant) and isinstance(mode.value, str) and set(mode.value) & set("wax"))


def raw_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for each raw file read in the module."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == "open" and _is_read_mode(node):
            out.append((node.lineno, "open()"))
        elif isinstance(func, ast.Attribute) and func.attr in ("read_text", "read_bytes"):
            out.append((node.lineno, f".{func.attr}()"))
        elif (isinstance(func, ast.Attribute) and func.attr == "open" and isinstance(func.value, ast.Name)
              and func.value.id in ("io", "gzip", "bz2", "lzma") and _is_read_mode(node)):
            out.append((node.lineno, f"{func.value.id}.open()"))
    return sorted(out)


def reads_around_the_door(root: Path = ROOT) -> tuple[list[str], set[str]]:
    """(raw reads in modules not allowed to make them, allowed modules that make none any more)."""
    found, used = [], set()
    for path in sorted((root / "tools").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        reads = raw_reads(ast.parse(path.read_text()))
        if rel in RAW_READS_ALLOWED:
            if reads:
                used.add(rel)
            continue
        found += [f"{rel}:{line}: {what}" for line, what in reads]
    return found, used


def test_files_from_outside_are_read_only_through_safe_read():
    """A new raw read: use tools/shared/safe_read.py (read_head, read_tail, read_limited, open_regular), or, for
    our own files or a kernel file, add the module to RAW_READS_ALLOWED with whose files they are."""
    found, used = reads_around_the_door()
    assert not found, found
    stale = set(RAW_READS_ALLOWED) - used
    assert not stale, f"these modules no longer read raw: remove them from RAW_READS_ALLOWED: {stale}"


# straggler_find's log_paths reader at 477fe48: isfile, then a blocking open of a path the caller names.
OLD_STEP_LINES = '''
def _step_lines(paths):
    out = []
    for raw in paths:
        path = os.path.abspath(os.path.expanduser(raw))
        if not os.path.isfile(path):
            raise ToolFailure(f"log_paths: {raw!r} is not a regular file")
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 65536))
            lines = [ln for ln in f.read().decode(errors="replace").splitlines() if STEP_LINE.search(ln)]
        out += lines[-3:]
    return out
'''


def test_the_rule_sees_the_old_straggler_find_reader(tmp_path):
    module = tmp_path / "tools" / "straggler_find" / "__init__.py"
    module.parent.mkdir(parents=True)
    module.write_text(OLD_STEP_LINES + "\ndef diagnosis(p):\n    return Path(p).read_text()\n"
                      "\ndef write(p):\n    with open(p, 'w') as f:\n        f.write('x')\n")
    found, _ = reads_around_the_door(tmp_path)
    assert found == ["tools/straggler_find/__init__.py:8: open()", "tools/straggler_find/__init__.py:15: .read_text()"]
