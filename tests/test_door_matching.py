"""The matcher door: every regex under tools/ is linear on hostile lines at the cap, and loops over outside text take
their lines from the bounded matcher (tools/shared/logscan.py `capped_lines`), never from a raw `splitlines()`.

Patterns are collected, not listed: every module-level `re.Pattern` (also inside module-level dicts, lists and
tuples), every literal pattern handed to `re.compile/match/search/...` anywhere in a function, and the triage
signatures loaded from knowledge/data. Each is timed on lines of MAX_MATCH_CHARS made of runs of spaces, digits and
punctuation, and of its own literal fragments repeated (what made straggler_find's STEP_LINE cubic: "step 1 " x 600).
"""

from __future__ import annotations

import ast
import functools
import importlib
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from tools.shared import logscan

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "tools"
BUDGET_S = 0.05          # a linear pattern scans 8 KB in well under a millisecond
HARD_BUDGET_S = 0.2      # slower than this at the cap fails whatever its growth
RUNAWAY_S = 2.0          # a super-linear one is stopped here (re checks signals between steps)
SCREEN_S = 0.0003        # at 1/8 of the cap: a quadratic pattern that would pass BUDGET_S at the cap is below this
FILLS = ["a", " ", "0", ":", "[", "a:", "0 ", "x.", "'", "1.", ", ", "\t", "[0]", "0:", "a.cu:1: ", "[PG ", "a.so ",
         "|", "| ", "-", "=", "1 1", "a a", "\\", "/", "0.0.", "aA1 ", "x=1 "]
REGEX_CALLS = {"compile", "match", "search", "fullmatch", "findall", "finditer", "sub", "subn", "split"}
MATCH_METHODS = {"match", "search", "fullmatch", "findall", "finditer", "sub", "subn"}

# Loops that match lines of `text.splitlines()` on purpose, each with why its text is not outside text.
RAW_LINES_ALLOWED = {
    "tools/shared/slurm.py": "squeue/sinfo/scontrol output: SLURM's own daemons' fields, one per line",
    "tools/slurm_status.py": "sinfo/squeue output, through shared/slurm's run_cmd",
    "tools/nic_health/read_netdev.py": "ethtool/ip output for this node's own interfaces",
    "tools/straggler_find/probes.py": "/proc/net/snmp and tc output of this node's kernel",
    "tools/fleet_sweep/sweep.py": "lines our own node child printed on the side channel",
    "tools/dist_smoke_test/__init__.py": "lines our own rank children printed",
    "tools/gpu_topology.py": "nvidia-smi topo -m output (a paste is at most 200,000 characters; its patterns are timed)",
    "tools/straggler_find/node.py": "py-spy's output for the ranks being sampled",
    "tools/shared/nccl_tests.py": "nccl-tests output, each line cut at MAX_MATCH_CHARS by hand (:90); with NCCL_DEBUG=INFO "
    "at scale it may exceed MAX_LINES, and the table's header comes first",
}


# Patterns known to be slow at the cap, each with its owner and figure; skipped by the timing test while listed.
KNOWN_SLOW: dict[str, str] = {}   # pattern prefix -> where and why it is slow; empty: every pattern is timed


def _modules() -> list[str]:
    names = []
    for path in sorted(TOOLS.rglob("*.py")):
        if path.name == "__main__.py":
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def _patterns_in(value, depth: int = 0):
    if isinstance(value, re.Pattern):
        yield value
    elif depth < 2 and isinstance(value, dict):
        for v in value.values():
            yield from _patterns_in(v, depth + 1)
    elif depth < 2 and isinstance(value, (list, tuple, set, frozenset)):
        for v in value:
            yield from _patterns_in(v, depth + 1)


def _uses(module, tree: ast.AST, found: dict[tuple[str, int], set[str]]) -> None:
    """How the module calls each pattern it can name: {(pattern, flags): {"match", "search", ...}}; a literal pattern
    in re.match(r"...", line) inside a function is collected here too, evaluated in the module."""
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        method, owner = node.func.attr, node.func.value
        if isinstance(owner, ast.Name) and owner.id == "re" and method in REGEX_CALLS and node.args:
            rx = _literal(module, node)
        else:
            try:
                rx = eval(compile(ast.Expression(owner), "<owner>", "eval"), vars(module)) \
                    if isinstance(owner, (ast.Name, ast.Attribute)) else None
            except Exception:
                rx = None
        if isinstance(rx, re.Pattern) and isinstance(rx.pattern, str):
            methods = found.setdefault((rx.pattern, rx.flags), set())
            if method != "compile":
                methods.add(method)


def _literal(module, call: ast.Call) -> re.Pattern | None:
    flags_node = next((k.value for k in call.keywords if k.arg == "flags"), None)
    position = {"compile": 1, "match": 2, "search": 2, "fullmatch": 2, "findall": 2, "finditer": 2}.get(call.func.attr)
    if flags_node is None and position is not None and len(call.args) > position:
        flags_node = call.args[position]
    try:
        pattern = eval(compile(ast.Expression(call.args[0]), "<pattern>", "eval"), vars(module))
        flags = eval(compile(ast.Expression(flags_node), "<flags>", "eval"), vars(module)) if flags_node else 0
    except Exception:       # built from a function's locals: its module-level parts are collected on their own
        return None
    return re.compile(pattern, flags) if isinstance(pattern, str) else None


@functools.cache
def collect_patterns() -> dict[tuple[str, int], tuple[str, set[str]]]:
    """{(pattern, flags): (where, how it is called)} for every regex under tools/. A pattern called only with
    match/fullmatch is timed from the line's start; any other (search, findall, a pattern kept in a table and
    called from elsewhere) at every position, as search does."""
    from tools.shared.triage import signatures

    where: dict[tuple[str, int], str] = {}
    uses: dict[tuple[str, int], set[str]] = {}
    for name in _modules():
        module = importlib.import_module(name)
        for rx in (p for v in vars(module).values() for p in _patterns_in(v)):
            if isinstance(rx.pattern, str):
                where.setdefault((rx.pattern, rx.flags), name)
        module_uses: dict[tuple[str, int], set[str]] = {}
        _uses(module, ast.parse(Path(module.__file__).read_text()), module_uses)
        for key, methods in module_uses.items():
            where.setdefault(key, name)
            uses.setdefault(key, set()).update(methods)
    for sig in signatures.load_signatures():
        where.setdefault((sig.regex.pattern, sig.regex.flags), f"signature {sig.id}")
    return {key: (at, uses.get(key, set())) for key, at in where.items()}


def _parsed(pattern: str, flags: int):
    try:
        from re import _parser as parser
    except ImportError:                                   # Python < 3.11
        import sre_parse as parser
    try:
        return parser.parse(pattern, flags)
    except Exception:
        return []


def _fragments(items) -> list[str]:
    """Runs of literal characters in the pattern ("step", "Errors: ", "slurmstepd: error: "), longest first."""
    runs: list[str] = []

    def walk(items):
        current = []
        for op, av in items:
            if str(op) == "LITERAL":
                current.append(chr(av))
                continue
            if current:
                runs.append("".join(current))
                current = []
            for sub in _subpatterns(str(op), av):
                walk(sub)
        if current:
            runs.append("".join(current))

    walk(items)
    return sorted({r for r in runs if r.strip()}, key=len, reverse=True)[:8]


def _subpatterns(name: str, av) -> list:
    if name == "SUBPATTERN":
        return [av[-1]]
    if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
        return [av[2]]
    if name == "BRANCH":
        return list(av[1])
    if name in ("ASSERT", "ASSERT_NOT"):
        return [av[1]]
    if name == "ATOMIC_GROUP":
        return [av]
    return []


def _in_class(c: str, items) -> bool:
    tests = {"CATEGORY_DIGIT": str.isdigit, "CATEGORY_SPACE": str.isspace,
             "CATEGORY_WORD": lambda ch: ch.isalnum() or ch == "_"}
    hit, negate = False, False
    for op, av in items:
        name = str(op)
        if name == "NEGATE":
            negate = True
        elif name == "LITERAL":
            hit |= c == chr(av)
        elif name == "RANGE":
            hit |= av[0] <= ord(c) <= av[1]
        elif name == "CATEGORY":
            cat = str(av)
            test = tests.get(cat.replace("_NOT", "").replace("UNI_", ""))
            hit |= bool(test) and (test(c) != ("_NOT_" in cat))
    return hit != negate


def _sample(items) -> str:
    """One string the pattern's items accept, roughly: the prefix that takes a matcher deep into the pattern."""
    out = []
    for op, av in items:
        name = str(op)
        if name == "LITERAL":
            out.append(chr(av))
        elif name in ("NOT_LITERAL", "ANY", "IN"):
            out.append(next((c for c in "a0 x:.-_/|[" if name == "ANY" or (
                c != chr(av) if name == "NOT_LITERAL" else _in_class(c, av))), "a"))
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            out.append(_sample(av[2]) * max(1, min(av[0], 3)))
        elif name in ("SUBPATTERN", "BRANCH", "ATOMIC_GROUP"):
            out.append(_sample(_subpatterns(name, av)[0]))
    return "".join(out)


def hostile_lines(pattern: str, flags: int, length: int) -> list[str]:
    """Lines of `length` characters that make a super-linear pattern show it, each ending in a character that
    makes the match fail late: a string the pattern's start accepts, then a long run; its literal pieces repeated."""
    items = _parsed(pattern, flags)
    fragments, sample = _fragments(items), _sample(items)
    lead = "".join(fragments[:3])
    pieces = [lead + " " + fill * length for fill in FILLS]
    for start in {sample, sample[:len(sample) // 2]}:
        pieces += [start + fill * length for fill in (" ", "a", "0", "a ", "0 ", "\t", ":", "|", sample or "a")]
    for frag in fragments:
        pieces += [frag * length, (frag + " ") * length, (frag + " 1 ") * length, frag + " " * length,
                   frag + "0" * length, (frag + "a") * length]
    return [(p[:length - 2] + "\x01b") for p in pieces]


def _scan_s(rx: re.Pattern, line: str, anchored: bool) -> float:
    t0 = time.perf_counter()
    if anchored:
        rx.match(line)
    else:
        for _ in rx.finditer(line):
            pass
    return time.perf_counter() - t0


def _grows_faster_than_linear(rx: re.Pattern, line: str, anchored: bool, took: float) -> bool:
    """Whether a quarter of the line takes more than a sixth of the time (linear: a quarter; quadratic: 1/16)."""
    quarter = line[:len(line) // 4 - 2] + "\x01b"
    return took > 6 * min(_timed(rx, quarter, anchored), _timed(rx, quarter, anchored))


class Runaway(Exception):
    pass


def _timed(rx: re.Pattern, line: str, anchored: bool = False) -> float:
    """Seconds for one scan; RUNAWAY_S when it was stopped there (main thread only: signals)."""
    if threading.current_thread() is not threading.main_thread():
        return _scan_s(rx, line, anchored)

    def stop(*_):
        raise Runaway()

    old = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, RUNAWAY_S)
    try:
        return _scan_s(rx, line, anchored)
    except Runaway:
        return RUNAWAY_S
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def slow_inputs(rx: re.Pattern, methods: set[str] = frozenset(), length: int = logscan.MAX_MATCH_CHARS,
                first_only: bool = False) -> list:
    """(the hostile line's start, seconds) for each line this pattern takes longer than BUDGET_S on, called as the
    code calls it. Screened at 1/8 of the length first (a linear scan of 1 KB takes microseconds), then timed at the
    full length, best of three (the machine is shared: one slow scan may be another process's). Between BUDGET_S and
    HARD_BUDGET_S a line counts only when a quarter of it is more than 6x faster (super-linear growth)."""
    anchored = bool(methods) and methods <= {"match", "fullmatch"}
    slow = []
    for short, line in zip(hostile_lines(rx.pattern, rx.flags, length // 8), hostile_lines(rx.pattern, rx.flags, length)):
        if _timed(rx, short, anchored) < SCREEN_S:
            continue
        took = _timed(rx, line, anchored)
        if BUDGET_S < took < RUNAWAY_S:
            took = min(took, _timed(rx, line, anchored), _timed(rx, line, anchored))
        if BUDGET_S < took < HARD_BUDGET_S and not _grows_faster_than_linear(rx, line, anchored, took):
            continue             # a bounded gap on a loaded machine: linear, only slow today
        if took > BUDGET_S:
            slow.append((line[:40], round(took, 2)))
            if first_only:
                break
    return slow


@pytest.mark.slow
def test_the_collector_finds_the_patterns_of_every_door():
    """The collection is what makes the timing test mean something: the readers' patterns must be in it."""
    from tools.gpu_health import dcgm_text, pasted
    from tools.slurm_job_diagnose import jobs
    from tools.straggler_find import STEP_WORD

    found = collect_patterns()
    for rx in (dcgm_text.ROW, pasted.GPU_LINE, STEP_WORD, jobs.SRUN_TASK_EXIT, *[rx for rx, _ in jobs.SLURM_LINES]):
        assert (rx.pattern, rx.flags) in found, rx.pattern
    assert len(found) > 250, len(found)


@pytest.mark.slow
def test_every_regex_under_tools_is_linear_at_the_cap():
    slow = {}
    for (pattern, flags), (where, methods) in collect_patterns().items():
        if any(pattern.startswith(prefix) for prefix in KNOWN_SLOW):
            continue
        if hits := slow_inputs(re.compile(pattern, flags), methods):
            slow[f"{where}: {pattern[:70]}"] = hits[:2]
    assert not slow, slow


def test_the_known_slow_patterns_are_still_there():
    """KNOWN_SLOW names patterns, not a blanket: an entry whose pattern is gone (rewritten) must go too."""
    patterns = [pattern for pattern, _ in collect_patterns()]
    assert all(any(p.startswith(prefix) for p in patterns) for prefix in KNOWN_SLOW), KNOWN_SLOW


# The patterns this door replaced, as 477fe48 called them: what the timing test exists to catch.
OLD_PATTERNS = [
    (r"(?i)\b(step|iter(ation)?)\b.*\d.*\b(ms|s|sec|time|elapsed|it/s|s/it|tokens/s|tflops|mfu)\b", "search"),  # straggler_find
    (r"^\s*\|([^|]*)\|(.*?)\|?\s*$", "match"),                                          # gpu_health dcgmi row
    (r"^\s*GPU (\d+): (.+?)(?: \(UUID: ([^)]*)\)?)?\s*$", "match"),                      # gpu_health nvlink
    (r"\s*(State|Physical state|Rate|Link layer):\s*(.+?)\s*$", "match"),                 # nic_health ibstat
]
# slurm_job_diagnose's `slurmstepd: error: .*(oom...)` was quadratic over uncut lines of a 4 MiB tail; cut at the cap it
# costs 20 ms (0.15 s loaded), under the budget: what caught it is the loop rule below (text.splitlines() + search).


@pytest.mark.parametrize("pattern, method", OLD_PATTERNS)
def test_the_old_super_linear_patterns_fail_the_timing(pattern, method):
    assert slow_inputs(re.compile(pattern), {method}, first_only=True), pattern


def _raw_line_loops(tree: ast.AST):
    """(line, what) for each loop or comprehension over `<x>.splitlines()` that calls a regex method in its body."""
    def over_splitlines(it):
        return (isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute) and it.func.attr == "splitlines") or (
            isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "enumerate" and it.args
            and over_splitlines(it.args[0]))

    def matches(nodes):
        return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in MATCH_METHODS
                   for body in nodes for n in ast.walk(body))

    for node in ast.walk(tree):
        if isinstance(node, ast.For) and over_splitlines(node.iter) and matches(node.body):
            yield node.lineno, ast.unparse(node.iter)
        elif isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            for gen in node.generators:
                if over_splitlines(gen.iter) and matches([node]):
                    yield node.lineno, ast.unparse(gen.iter)


def raw_line_matchers(root: Path = ROOT) -> list[str]:
    out = []
    for path in sorted((root / "tools").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in RAW_LINES_ALLOWED:
            continue
        out += [f"{rel}:{line}: regex over {it}" for line, it in _raw_line_loops(ast.parse(path.read_text()))]
    return out


def test_outside_text_is_matched_only_through_capped_lines():
    """A loop that matches regexes over `text.splitlines()` takes lines of any length and number: use
    logscan.capped_lines(text) (or add the module to RAW_LINES_ALLOWED saying whose text it is)."""
    assert not raw_line_matchers(), raw_line_matchers()


def test_the_rule_sees_the_old_step_lines_reader(tmp_path):
    old = tmp_path / "tools" / "old.py"
    old.parent.mkdir()
    old.write_text("def _step_lines(f):\n"
                   "    return [ln for ln in f.read().decode(errors='replace').splitlines() if STEP_LINE.search(ln)]\n"
                   "def parse(text):\n    for line in text.splitlines():\n        if m := ROW.match(line):\n"
                   "            yield m\n")
    found = raw_line_matchers(tmp_path)
    assert len(found) == 2, found
