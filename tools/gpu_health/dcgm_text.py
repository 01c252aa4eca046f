"""The table `dcgmi diag` prints without -j -> the same DcgmResult records the JSON reader gives.

Two layouts, both from dcgmi's own printer (NVIDIA/DCGM dcgmi/Diag.cpp, read 2026-12-01):
- DCGM 3.x: one row per test with one status for all GPUs ("| Memory | Pass |"), or split by GPU
  ("| GPU Memory | Pass - GPUs: 1, 2 |" then "|  | Fail - GPU: 0 |"); problems in "| Warning | GPU 0 ... |" or
  "| Error | GPU 3 ... |" rows, the text wrapped over the rows below at the column width.
- DCGM 4.x: the test's overall status ("| memory | Fail |"), then one row per entity ("|  | GPU0: Fail |") and
  its problems as "| Warning: GPU0 | ... |" (Info rows only with -v).
Category rows ("|-----  Deployment  ----", "+-----  Hardware  ----") name the category; Metadata rows carry the
DCGM version. A text without the table is refused by the caller with the formats it expects.
"""

from __future__ import annotations

import re

from ..engine.spec import Field, Record
from ..shared.logscan import capped_lines

# Each runs on one line cut by capped_lines, with no two unbounded repeats that can share characters: linear.
CATEGORY = re.compile(r"^\s*[|+]-{3,}\s+(\w+(?: \w+)*)\s+-+[+|]")
ROW = re.compile(r"^\s*\|([^|]*)\|(.*)$")          # the right cell, its closing '|' and blanks taken off in _right
HEADER = re.compile(r"^\s*\|\s*Diagnostic\s*\|\s*Result\s*\|")
STATUS_ROW = re.compile(r"^\s*\|([^|]*)\|\s*(?:Pass|Fail|Warn|Skip)\b")
WORD = re.compile(r"\w")
HEAD_CHARS = 1 << 20   # the table (or a fragment) shows itself in the first MiB: a whole `dcgmi diag` output is ~10 KB
GPU_STATUS = re.compile(r"^GPU(\d+): (\w[\w ]*)$")                      # 4.x "GPU0: Pass"
SPLIT_STATUS = re.compile(r"^(Pass|Fail|Warn|Skip)\s*-\s*GPUs?:\s*([\d, ]+)$")   # 3.x "Fail - GPU: 0"
MESSAGE_ROW = re.compile(r"^(Warning|Error|Info)(?::\s*GPU(\d+))?$")
MESSAGE_GPU = re.compile(r"\bGPU (\d+)\b")
STATUSES = {"pass": "Pass", "fail": "Fail", "warn": "Warn", "warning": "Warn", "skip": "Skip", "not run": "Skip"}


class DcgmResult(Record):
    category: str = Field(description="Deployment, Hardware, Integration, Stress, ...")
    test: str = Field(description="Test name as DCGM prints it (software, memory, pcie, targeted_stress ...).")
    gpu: str = Field(description="GPU id(s) the result is for.")
    status: str = Field(description="Pass | Fail | Warn | Skip (as DCGM wrote it).")
    code: int | None = Field(None, description="DCGM_FR code (error_id).")
    code_name: str = Field("", description="DCGM_FR_* name.")
    message: str = Field("", description="DCGM's warning text.")


def looks_like_table(text: str) -> bool:
    """The header, a category row, or a test row with a status (a paste may be a fragment of the table)."""
    for line in capped_lines(text[:HEAD_CHARS]):
        if HEADER.match(line) or CATEGORY.match(line) or ((m := STATUS_ROW.match(line)) and WORD.search(m.group(1))):
            return True
    return False


class _Test:
    def __init__(self, category: str, name: str, status: str):
        self.category, self.name, self.status = category, name, status
        self.by_gpu: dict[str, str] = {}
        self.messages: list[list[str]] = []   # [kind, gpu or "", text]; text grows over the wrapped rows


def parse(text: str) -> tuple[list[DcgmResult], str | None]:
    """(results, DCGM version) from the printed table; ValueError when it holds no test row."""
    tests, version = _tests(text)
    if not tests:
        raise ValueError("a `dcgmi diag` table with no test rows (expected '| <test> | Pass |' rows under the header)")
    return [r for t in tests for r in _results(t)], version


def _tests(text: str) -> tuple[list[_Test], str | None]:
    tests: list[_Test] = []
    category, version, message = "", None, None
    for line in capped_lines(text):
        if m := CATEGORY.match(line):
            category, message = m.group(1), None
            continue
        if not (m := ROW.match(line)) or set(line.strip()) <= set("+-=|"):
            continue
        left, raw = m.group(1).strip(), _right(m.group(2))
        right = raw.strip()
        if left == "Diagnostic" and right == "Result":
            continue
        if category == "Metadata" or left in ("DCGM Version", "Driver Version Detected", "GPU Device IDs Detected"):
            version = right if left == "DCGM Version" else version
            continue
        if left and (mm := MESSAGE_ROW.match(left)):
            if not tests or tests[-1].category != category:   # a problem row with no test above it (3.x Error)
                tests.append(_Test(category, category or "(no test named)", "Fail" if mm.group(1) == "Error" else "Warn"))
            message = [mm.group(1), mm.group(2) or "", raw[1:].rstrip()]
            tests[-1].messages.append(message)
        elif left:
            tests.append(_Test(category, left, _status(right) or "Pass"))
            message = None
            _per_gpu(tests[-1], right)
        elif tests and (GPU_STATUS.match(right) or SPLIT_STATUS.match(right)):   # next GPU's row (4.x, 3.x)
            message = None
            _per_gpu(tests[-1], right)
        elif message is not None:                    # wrapped text: dcgmi cuts at the column width, mid-word
            message[2] += raw[1:].rstrip()
    return tests, version


def _right(cell: str) -> str:
    """The right cell as dcgmi printed it: the text before the row's closing '|' and the blanks after it."""
    cell = cell.rstrip()
    return cell[:-1] if cell.endswith("|") else cell


def _status(cell: str) -> str | None:
    return STATUSES.get(cell.strip().lower())


def _per_gpu(test: _Test, cell: str) -> None:
    if m := GPU_STATUS.match(cell):
        test.by_gpu[m.group(1)] = _status(m.group(2)) or m.group(2)
    elif m := SPLIT_STATUS.match(cell):
        for gpu in re.findall(r"\d+", m.group(2)):
            test.by_gpu[gpu] = m.group(1)


def _results(t: _Test) -> list[DcgmResult]:
    out = {gpu: DcgmResult(category=t.category, test=t.name, gpu=gpu, status=status)
           for gpu, status in t.by_gpu.items()}
    for kind, gpu, text in t.messages:
        if kind == "Info":
            continue
        gpu = gpu or (m.group(1) if (m := MESSAGE_GPU.search(text)) else "")
        status = t.by_gpu.get(gpu) or ("Fail" if kind == "Error" else t.status if t.status != "Pass" else "Warn")
        key = gpu or "all"
        r = out.setdefault(key, DcgmResult(category=t.category, test=t.name, gpu=gpu or "all", status=status))
        r.message = f"{r.message} {text}".strip()
    if not out:
        out["all"] = DcgmResult(category=t.category, test=t.name, gpu="all", status=t.status)
    return list(out.values())
