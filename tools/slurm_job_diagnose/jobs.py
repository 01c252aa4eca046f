"""Where slurm_job_diagnose gets its facts (private: no SPEC): scontrol while slurmctld remembers the
job, sacct (with accounting) or the job-completion log (without), the job's log files, and the lines
slurmstepd and srun write into them. Pure parsing is unit-tested in tests/test_slurm_unit.py.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from pydantic import Field

from ..shared import slurm as _slurm
from ..shared.logscan import capped_lines
from ..shared.safe_read import read_tail
from ..engine.redact import redact
from ..engine.spec import Record

SACCT_FIELDS = ["JobID", "JobIDRaw", "JobName", "State", "ExitCode", "DerivedExitCode", "Elapsed", "Timelimit",
                "NodeList", "Partition", "WorkDir", "SubmitLine"]
SACCT_FIELDS_MIN = ["JobID", "JobName", "State", "ExitCode", "Elapsed", "Timelimit", "NodeList", "Partition"]
LOG_BYTES = 4 * 1024 * 1024  # only the tail of a huge log is read for SLURM's own lines

# Lines slurmstepd itself writes into job output (not the program's own words), and what they tell.
_CANCEL = r"\*\*\* (?:JOB|STEP) \S+ ON (\S+) CANCELLED AT \S+"
SLURM_LINES = [
    (re.compile(_CANCEL + r" DUE TO TIME LIMIT"), "TIMEOUT"),
    (re.compile(_CANCEL + r" DUE TO PREEMPTION"), "PREEMPTED"),
    (re.compile(_CANCEL + r" DUE TO NODE FAILURE"), "NODE_FAIL"),
    (re.compile(_CANCEL), "CANCELLED"),
    # A bounded gap, not `.*`: over a line of repeated "slurmstepd: error: " `.*` is quadratic.
    (re.compile(r"slurmstepd: error: .{0,400}?(oom[-_]kill|OOM Kill|out-of-memory handler)", re.I), "OUT_OF_MEMORY"),
]
SRUN_TASK_EXIT = re.compile(r"srun: error: (\S+): tasks? ([\d\-,]+): (Exited with exit code (\d+)|Killed|Terminated)")


class JobStep(Record):
    step: str = Field(description="Step id: batch, extern, 0, 1, ...")
    name: str = Field("", description="Step name (the command srun ran).")
    state: str = Field("", description="Step state, e.g. COMPLETED, FAILED, CANCELLED.")
    exit_code: int = Field(0, description="Exit code of the step (0-255).")
    signal: int = Field(0, description="Signal that ended the step, 0 if none.")
    nodes: str = Field("", description="Nodes the step ran on.")



def from_scontrol(job_id: str) -> dict | None:
    try:
        out = _slurm.run_cmd(["scontrol", "show", "job", "-o", job_id])
    except _slurm.SlurmError as e:
        if "Invalid job id" in str(e):
            return None
        raise
    lines = [_slurm.parse_kv_line(line) for line in out.splitlines() if line.startswith("JobId=")]
    if not lines:
        return None
    array_task = job_id.partition("_")[2]
    f = next((x for x in lines if array_task and x.get("ArrayTaskId") == array_task), lines[0])
    code, sig = _slurm.parse_exit_code(f.get("ExitCode", "0:0"))
    return {"name": f.get("JobName"), "state": f.get("JobState"), "reason": f.get("Reason"),
            "exit_code": code, "signal": sig, "elapsed_s": _slurm.parse_duration_s(f.get("RunTime")),
            "time_limit_s": _slurm.parse_duration_s(f.get("TimeLimit")), "partition": f.get("Partition"),
            "nodes": f.get("NodeList"), "batch_host": f.get("BatchHost"), "stdout": f.get("StdOut"),
            "stderr": f.get("StdErr"), "workdir": f.get("WorkDir"), "user": (f.get("UserId") or "").split("(")[0],
            "array_job": f.get("ArrayJobId"), "array_task": f.get("ArrayTaskId")}


def parse_sacct(text: str, fields: list[str], job_id: str) -> tuple[dict | None, list[JobStep]]:
    job, steps = None, []
    for line in text.splitlines():
        cols = line.split("|")
        if len(cols) < len(fields):
            continue
        row = dict(zip(fields, cols[:len(fields)] if "SubmitLine" not in fields else
                       cols[:len(fields) - 1] + ["|".join(cols[len(fields) - 1:])]))
        jid = row["JobID"]
        base, _, step = jid.partition(".")
        if base != job_id and row.get("JobIDRaw", "").partition(".")[0] != job_id:
            continue
        code, sig = _slurm.parse_exit_code(row.get("ExitCode", "0:0"))
        if not step:
            state = row["State"].split()[0] if row["State"] else ""
            job = {"name": row.get("JobName"), "state": state, "state_full": row["State"], "exit_code": code,
                   "signal": sig, "elapsed_s": _slurm.parse_duration_s(row.get("Elapsed")),
                   "time_limit_s": _slurm.parse_duration_s(row.get("Timelimit")),
                   "partition": row.get("Partition"), "nodes": row.get("NodeList"),
                   "workdir": row.get("WorkDir"), "submit_line": row.get("SubmitLine")}
        else:
            steps.append(JobStep(step=step, name=row.get("JobName", ""), state=row["State"].split()[0],
                                 exit_code=code, signal=sig, nodes=row.get("NodeList", "")))
    return job, steps


def from_sacct(job_id: str, not_seen: list[str]) -> tuple[dict | None, list[JobStep], str | None]:
    """(job, steps, source) from sacct with accounting, else from the job-completion log."""
    for fields in (SACCT_FIELDS, SACCT_FIELDS_MIN):
        try:
            out = _slurm.run_cmd(["sacct", "-P", "-n", "-j", job_id, "-o", ",".join(fields)])
        except _slurm.SlurmError as e:
            msg = str(e)
            if "Invalid field" in msg:
                continue
            if "accounting storage is disabled" in msg or "not configured" in msg or "slurmdbd" in msg:
                break
            not_seen.append(f"sacct failed ({msg[:200]}): no step-level accounting")
            return None, [], None
        job, steps = parse_sacct(out, fields, job_id)
        return job, steps, ("sacct" if job else None)
    not_seen.append("accounting (slurmdbd) is off here: no per-step states, exit codes or nodes")
    try:
        out = _slurm.run_cmd(["sacct", "-c", "-P", "-n", "-j", job_id.partition("_")[0], "-o",
                              ",".join(SACCT_FIELDS_MIN)])
    except _slurm.SlurmError:
        return None, [], None
    job, _ = parse_sacct(out, SACCT_FIELDS_MIN, job_id.partition("_")[0])
    return job, [], ("job completion log (sacct -c)" if job else None)


def expand_log_pattern(pattern: str, info: dict, job_id: str) -> str:
    """Fill sbatch filename patterns: %j %A %a %x %u %N %n %t %%."""
    base, _, task = job_id.partition("_")
    values = {"j": str(info.get("raw_id") or base), "A": str(info.get("array_job") or base),
              "a": task or str(info.get("array_task") or "4294967294"), "x": info.get("name") or "",
              "u": info.get("user") or "", "N": (info.get("batch_host") or ""), "n": "0", "t": "0", "%": "%"}
    return re.sub(r"%(\d*)([jAaxuNnt%])", lambda m: values[m.group(2)].zfill(int(m.group(1) or 0)), pattern)


def log_paths_from_submit_line(submit_line: str | None) -> list[str]:
    """-o/--output and -e/--error values of an sbatch command line (as sacct's SubmitLine shows it)."""
    words = (submit_line or "").split()
    found = []
    for i, w in enumerate(words):
        for flag in ("-o", "--output", "-e", "--error"):
            if w == flag and i + 1 < len(words):
                found.append(words[i + 1])
            elif w.startswith(flag + "=") or (len(flag) == 2 and w.startswith(flag) and len(w) > 2 and w[2] != "-"):
                found.append(w.split("=", 1)[1] if "=" in w else w[2:])
    return found


def find_logs(info: dict, job_id: str, search_dirs: list[str]) -> list[Path]:
    candidates: list[str] = [p for p in (info.get("stdout"), info.get("stderr")) if p and p != "/dev/null"]
    workdir = info.get("workdir") or ""
    if not candidates:
        for pat in log_paths_from_submit_line(info.get("submit_line")):
            candidates.append(os.path.join(workdir, pat) if workdir and not pat.startswith("/") else pat)
        base, _, task = job_id.partition("_")
        default = f"slurm-{base}_{task}.out" if task else f"slurm-{base}.out"
        for d in ([workdir] if workdir else []) + (search_dirs or [os.getcwd()]):
            candidates.append(os.path.join(d, default))
    paths = []
    for c in candidates:
        p = Path(expand_log_pattern(c, info, job_id))
        if os.path.isfile(p) and p not in paths:   # never raises (Path.is_file does on EACCES); safe_read decides
            paths.append(p)
    return paths


def scan_slurm_lines(paths: list[Path]) -> tuple[str | None, str | None, str | None]:
    """(state SLURM wrote into the log, failing node, evidence line) from SLURM's and srun's own lines."""
    state = node = evidence = None
    for p in paths:
        try:
            text = read_tail(p, LOG_BYTES).decode("utf-8", "replace")
        except OSError:
            continue
        for line in capped_lines(text, last=True):
            m = SRUN_TASK_EXIT.search(line)
            if m and node is None:
                node, evidence = m.group(1), redact(line.strip())
            for rx, what in SLURM_LINES:
                hit = rx.search(line)
                if hit:
                    if state is None or state == "CANCELLED":  # a specific cause beats plain CANCELLED
                        state, evidence = what, redact(line.strip())
                        if what == "NODE_FAIL" and node is None:
                            node = hit.group(1)
                    break
    return state, node, evidence


def triage(paths: list[Path]) -> tuple[str, list[str], list[str], list]:
    """(log_triage's verdict, findings, next, hits with their actions) for these files; ('info', [a note], [], [])
    when log_triage is missing or breaks: a fault there must not hide what SLURM itself says about the job."""
    try:
        from ..shared.triage.core import triage_paths
    except Exception as e:  # noqa: BLE001
        return "info", [f"log_triage is not usable here ({type(e).__name__}: {e}): read the log files by hand"], [], []
    try:
        result = triage_paths([str(p) for p in paths])
    except Exception as e:  # noqa: BLE001
        return "info", [f"log_triage could not read the logs ({type(e).__name__}: {e})"], [], []
    return result.verdict, list(result.findings), list(result.next), list(result.signatures)
