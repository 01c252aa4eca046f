"""DCGM diagnostics: run `dcgmi diag -r N -j` where DCGM is installed, or read a saved or pasted output, and turn
each test result and DCGM_FR code into a finding with an action.

Both JSON layouts are read: DCGM 4.x ('DCGM Diagnostic', entity ids, test_summary) and 3.x ('DCGM GPU
Diagnostic', 'gpu_ids' strings); so is the table dcgmi prints without -j (dcgm_text.py), which is what users
paste. Codes, severities and known false positives: knowledge/data/dcgm_errors.toml. Levels 3 and 4 occupy the
GPUs for 15 minutes to hours, so they run only when asked for by number.
"""

import json
import re
import shutil
import subprocess

from ..engine.data import load_data
from ..shared.actions import HealthFinding
from .dcgm_text import DcgmResult, looks_like_table, parse as parse_table

SECONDS = re.compile(r"totaling ([0-9.]+) seconds")


def dcgmi_path() -> str | None:
    return shutil.which("dcgmi")


def run_diag(level: int, timeout_s: float) -> tuple[str | None, str]:
    """(JSON text, note). None and a plain reason when DCGM is missing or the run gave no JSON."""
    path = dcgmi_path()
    if not path:
        return None, ("DCGM is not installed here (no `dcgmi` on PATH): DCGM diagnostics not run. Install "
                      "datacenter-gpu-manager and start nv-hostengine to use them.")
    try:
        out = subprocess.run([path, "diag", "-r", str(level), "-j"], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None, f"`dcgmi diag -r {level} -j` did not finish within {timeout_s:.0f} s"
    text = out.stdout[out.stdout.find("{"):] if "{" in out.stdout else ""
    if not text:
        code = out.returncode - 256 if out.returncode > 127 else out.returncode
        return None, (f"`dcgmi diag -r {level} -j` exited {out.returncode} ({code} as DCGM's signed status; -30 "
                      f"is an NVVS error, see /var/log/nvidia-dcgm/nvvs.log) without JSON: "
                      f"{(out.stderr or out.stdout).strip()[:300]}")
    return text, f"ran `dcgmi diag -r {level} -j` (exit {out.returncode})"


def parse(text: str) -> tuple[list[DcgmResult], str | None]:
    """(results, DCGM version) from `dcgmi diag -j` output. ValueError names what is missing.

    The file may be anyone's: entries of the wrong shape are skipped (and counted in a result saying so),
    never a crash, and nesting too deep for the JSON reader is "not JSON". The table dcgmi prints without -j
    is read by dcgm_text.py."""
    if looks_like_table(text):
        return parse_table(text)
    try:
        doc = json.loads(text[text.find("{"):])
    except (ValueError, RecursionError) as e:
        raise ValueError(f"not JSON from `dcgmi diag -j`: {type(e).__name__}: {str(e)[:200]}") from None
    root = doc.get("DCGM Diagnostic") or doc.get("DCGM GPU Diagnostic") if isinstance(doc, dict) else None
    if not isinstance(root, dict) or not isinstance(root.get("test_categories"), list):
        raise ValueError("no 'DCGM Diagnostic' (4.x) or 'DCGM GPU Diagnostic' (3.x) object with a "
                         "test_categories list")
    names = {int(k): v["name"] for k, v in load_data("dcgm_errors")["code"].items()}
    meta = doc.get("metadata")
    version = (meta.get("DCGM Version") if isinstance(meta, dict) else None) or root.get("version") or doc.get("version")
    out, skipped = [], 0
    for cat in root["test_categories"]:
        if not isinstance(cat, dict):
            skipped += 1
            continue
        for test in _dicts(cat.get("tests")):
            skipped += _not_dicts(test.get("results"))
            for r in _dicts(test.get("results")):
                try:
                    out += _results_of(cat, test, r, names)
                except (ValueError, TypeError, AttributeError):  # pydantic's ValidationError is a ValueError
                    skipped += 1
    if skipped:
        out.append(DcgmResult(category="", test="(unreadable entries)", gpu="?", status="Warn",
                              message=f"{skipped} entries of the file are not in dcgmi's layout and were skipped"))
    return out, version if isinstance(version, str) else None


def _dicts(value) -> list[dict]:
    """The dict items of a list (anything else in a field that should hold a list of objects: none)."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _not_dicts(value) -> int:
    return sum(not isinstance(v, dict) for v in value) if isinstance(value, list) else 0


def _results_of(cat: dict, test: dict, r: dict, names: dict) -> list[DcgmResult]:
    gpu = str(r.get("entity_id", r.get("gpu_ids", r.get("gpu_id", "?"))))[:64]
    out = []
    for w in _dicts(r.get("warnings")) or [{}]:
        code = w.get("error_id")
        if code is not None and (not isinstance(code, int) or isinstance(code, bool)):
            raise ValueError(f"error_id {str(code)[:20]!r} is not an integer")
        out.append(DcgmResult(category=str(cat.get("category", "")), test=str(test.get("name", "")), gpu=gpu,
                              status=str(r.get("status", "")).capitalize(), code=code,
                              code_name=names.get(code, "") if code is not None else "",
                              message=str(w.get("warning", ""))))
    return out


def false_positive(r: DcgmResult) -> str | None:
    """Why a result is a known false alarm (or a false pass), else None."""
    for rule in load_data("dcgm_errors")["false_positive"].values():
        if r.code not in rule["codes"]:
            continue
        if rule["rule"] == "violation time below 1 s":
            secs = SECONDS.search(r.message)
            if secs and float(secs.group(1)) < 1.0:
                return rule["why"]
        elif rule["rule"] == "status Pass":
            if r.status == "Pass":
                return rule["why"]
        else:
            return rule["why"]
    return None


def judge(r: DcgmResult) -> HealthFinding | None:
    """The finding for one result; None for a clean pass or a skip without a code."""
    if r.status == "Pass" and r.code is None:
        return None
    if r.status == "Skip" and r.code in (None, 48, 117):
        return None
    data = load_data("dcgm_errors")
    row = data["code"].get(str(r.code)) if r.code is not None else None
    action = data["severity"][str(_severity_number(row))]["action"] if row else ("drain_node" if r.status == "Fail" else "monitor")
    fp = false_positive(r)
    subject = f"GPU {r.gpu}"
    what = f"DCGM {r.test} {r.status}" + (f" ({r.code_name}, {r.code})" if r.code is not None else "") + \
           (f": {r.message}" if r.message else "")
    if fp:
        action = "monitor" if r.status == "Pass" else "none"
        what += f" — known false {'pass' if r.status == 'Pass' else 'alarm'}: {fp}"
    return HealthFinding(text=what, action=action, subject=subject, code=r.code_name or r.test, source="dcgm")


def _severity_number(row: dict) -> int:
    order = ["NONE", "MONITOR", "ISOLATE", "UNKNOWN", "TRIAGE", "CONFIG", "RESET"]
    return order.index(row["severity"]) if row["severity"] in order else 3
