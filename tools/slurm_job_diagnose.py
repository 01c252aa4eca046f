"""slurm_job_diagnose — why a SLURM job (or array task) ended the way it did, and what to do next.

Collects what SLURM still knows about the job: `scontrol show job` while slurmctld remembers it
(MinJobAge, 300 s by default), `sacct` when accounting runs (steps, per-step exit codes, nodes), the
job-completion log (`sacct -c`) when that is all there is; then finds the job's stdout/stderr files
and runs log_triage on them. Says which of those it could not see.

By hand (login node):
    python -m tools.slurm_job_diagnose --job-id 123456
    python -m tools.slurm_job_diagnose --job-id 123456_7 --json          # one array task
    python -m tools.slurm_job_diagnose --job-id 123456 --log-paths logs/train-123456.out
"""

from __future__ import annotations

import getpass
import os
import re
from pathlib import Path

from pydantic import BaseModel

from tools import _slurm
from tools.harness import Field, Params, Result, ToolFailure, ToolSpec

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
    (re.compile(r"slurmstepd: error: .*(oom[-_]kill|OOM Kill|out-of-memory handler)", re.I), "OUT_OF_MEMORY"),
]
SRUN_TASK_EXIT = re.compile(r"srun: error: (\S+): tasks? ([\d\-,]+): (Exited with exit code (\d+)|Killed|Terminated)")


class SlurmJobDiagnoseParams(Params):
    job_id: str = Field(..., pattern=r"^\d+(_\d+)?$", max_length=40,
                        description="Job id ('123456') or array task ('123456_7').")
    log_paths: list[str] = Field(default_factory=list, max_length=20,
                                 description="Extra log files to triage, e.g. per-rank logs (default: the "
                                             "job's own stdout/stderr, found automatically).")
    search_dirs: list[str] = Field(default_factory=list, max_length=10,
                                   description="Where to look for slurm-<id>.out when SLURM no longer knows "
                                               "the job's files (default: the current directory).")
    triage_logs: bool = Field(True, description="Run log_triage on the job's log files.")


class JobStep(BaseModel):
    step: str = Field(description="Step id: batch, extern, 0, 1, ...")
    name: str = ""
    state: str = ""
    exit_code: int = 0
    signal: int = 0
    nodes: str = ""


class SlurmJobDiagnoseResult(Result):
    job_id: str = ""
    name: str | None = None
    state: str | None = Field(None, description="Final (or current) job state, e.g. FAILED, TIMEOUT.")
    state_explained: str | None = None
    reason: str | None = Field(None, description="SLURM's reason field (e.g. NonZeroExitCode, TimeLimit).")
    exit_code: int | None = Field(None, description="Exit code of the job script (0-255).")
    signal: int | None = Field(None, description="Signal that ended it, 0 if none.")
    elapsed_s: int | None = Field(None, description="Run time, seconds.")
    time_limit_s: int | None = Field(None, description="Time limit, seconds (None: unlimited).")
    partition: str | None = None
    nodes: str | None = Field(None, description="Nodes the job ran on.")
    failing_step: str | None = Field(None, description="First step that did not complete (from sacct).")
    failing_node: str | None = Field(None, description="Node of the failing step/task, when SLURM or srun named it.")
    steps: list[JobStep] = Field(default_factory=list)
    stdout_path: str | None = None
    stderr_path: str | None = None
    sources: list[str] = Field(default_factory=list, description="Where the facts came from.")
    not_seen: list[str] = Field(default_factory=list, description="What could not be checked, and why.")
    log_findings: list[str] = Field(default_factory=list, description="What log_triage found in the logs.")


# ---------------------------------------------------------------------------------------------------
# Sources

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
        if p.is_file() and p not in paths:
            paths.append(p)
    return paths


def scan_slurm_lines(paths: list[Path]) -> tuple[str | None, str | None, str | None]:
    """(state SLURM wrote into the log, failing node, evidence line) from SLURM's and srun's own lines."""
    state = node = evidence = None
    for p in paths:
        try:
            with open(p, "rb") as f:
                f.seek(max(0, p.stat().st_size - LOG_BYTES))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        for line in text.splitlines():
            m = SRUN_TASK_EXIT.search(line)
            if m and node is None:
                node, evidence = m.group(1), line.strip()
            for rx, what in SLURM_LINES:
                hit = rx.search(line)
                if hit:
                    if state is None or state == "CANCELLED":  # a specific cause beats plain CANCELLED
                        state, evidence = what, line.strip()
                        if what == "NODE_FAIL" and node is None:
                            node = hit.group(1)
                    break
    return state, node, evidence


def triage(paths: list[Path]) -> tuple[str, list[str], list[str]]:
    """(log_triage's verdict, findings, next) for these files; ('info', [a note], []) without it."""
    try:
        from tools.log_triage import triage_paths
    except ImportError:
        return "info", ["log_triage is not installed in this checkout: read the log files by hand"], []
    try:
        result = triage_paths([str(p) for p in paths])
    except ToolFailure as e:
        return "info", [f"log_triage could not read the logs: {e}"], []
    return result.verdict, list(result.findings), list(result.next)


# ---------------------------------------------------------------------------------------------------
# Reading it

ADVICE = {
    "TIMEOUT": ("It hit its time limit{limit}. Ask for more (--time, up to the partition's MaxTime), or save "
                "checkpoints more often and resume; `#SBATCH --signal=B:USR1@120` gives the script 2 minutes' "
                "warning to save before the kill.",
                ["knowledge://training/checkpoints.md", "knowledge://orchestration/fault-tolerance.md"]),
    "OUT_OF_MEMORY": ("SLURM's memory limit (cgroup) killed it: host RAM, not GPU memory. Ask for more with "
                      "--mem / --mem-per-cpu, or use fewer dataloader workers / smaller host-side buffers.",
                      ["knowledge://cpu-memory/host-memory.md", "memory_estimate"]),
    "NODE_FAIL": ("Node {node} failed under it. Resubmit with --exclude={node} and tell the admins; check that "
                  "node with gpu_health once it is back.", ["slurm_status", "gpu_health",
                                                              "knowledge://compute/gpu-faults.md"]),
    "PREEMPTED": ("A higher-priority job preempted it. Submit with --requeue and resume from checkpoints, or use "
                  "a partition/QOS that is not preemptible.", ["knowledge://orchestration/fault-tolerance.md"]),
    "CANCELLED": ("It was cancelled (scancel by a user or an admin). If nobody did that on purpose, look at "
                  "who did (sacct shows 'CANCELLED by UID').", ["knowledge://orchestration/slurm.md"]),
    "FAILED": ("Its script exited with code {code}{sig}. The cause is in its log; see the log findings.",
               ["log_triage", "knowledge://debugging/logs.md"]),
    "BOOT_FAIL": ("Its node did not boot. Resubmit (optionally --exclude the node) and tell the admins.",
                  ["slurm_status"]),
    "DEADLINE": ("It could not finish before its --deadline.", ["knowledge://orchestration/slurm.md"]),
}

EXIT_MEANING = {137: " (128+9: SIGKILL, often the kernel OOM killer or a hard kill)",
                143: " (128+15: SIGTERM, asked to stop)", 139: " (128+11: SIGSEGV, a crash in native code)",
                134: " (128+6: SIGABRT, an abort, e.g. NCCL/gloo/C++ assertion)", 124: " (timeout(1) expired)",
                127: " (command not found)", 126: " (command not executable)"}


def diagnose(info: dict, steps: list[JobStep], log_state: str | None, log_node: str | None,
             evidence: str | None) -> tuple[str, list[str], list[str], str | None, str | None]:
    """(verdict, findings, next, failing_step, failing_node) from what was gathered."""
    state = info.get("state") or log_state or "UNKNOWN"
    if state in ("CANCELLED", "FAILED") and log_state in ("TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY"):
        state = log_state  # e.g. the job-completion log says CANCELLED, SLURM's own log line says why
    code, sig = info.get("exit_code"), info.get("signal") or 0
    elapsed, limit = info.get("elapsed_s"), info.get("time_limit_s")
    findings = [f"Job {info['job_id']} ({info.get('name') or '?'}) is {state}: {_slurm.explain_state(state)}"
                + (f"; reason {info['reason']}" if info.get("reason") not in (None, "None", "") else "") + "."]
    if code is not None and state not in ("PENDING", "RUNNING"):
        findings.append(f"Exit code {code}, signal {sig}" + (f" ({_slurm.signal_name(sig)})" if sig else "")
                        + EXIT_MEANING.get(code, "") + ".")
    if elapsed is not None:
        limit_text = (f"of a {_slurm.format_duration(limit)} limit ({100 * elapsed / limit:.0f}% of it)"
                      if limit else "with no time limit")
        findings.append(f"Ran {_slurm.format_duration(elapsed)} {limit_text}.")
    bad = [s for s in steps if s.step != "extern" and (s.state not in ("COMPLETED", "RUNNING", "PENDING")
                                                       or s.exit_code or s.signal)]
    # The innermost failure: an srun step (0, 1, ...) that failed also fails the batch step around it.
    bad.sort(key=lambda s: s.step in ("batch", "extern"))
    failing_step = bad[0].step if bad else None
    failing_node = log_node or (bad[0].nodes if bad else None)
    if state == "NODE_FAIL" and not failing_node:
        failing_node = info.get("nodes")
    if bad:
        findings.append("Failing step: " + "; ".join(
            f"{s.step} ({s.name}) {s.state} exit {s.exit_code}:{s.signal} on {s.nodes}" for s in bad[:4]) + ".")
    if log_node:
        findings.append(f"srun named the failing node: {evidence}")
    elif evidence:
        findings.append(f"SLURM wrote into the log: {evidence}")

    nxt: list[str] = []
    if state == "COMPLETED":
        verdict = "ok"
    elif state in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "REQUEUED"):
        verdict = "info"
        if state == "PENDING":
            findings.append(f"Pending because of {info.get('reason')}: "
                            f"{_slurm.explain_pending_reason(info.get('reason') or '')}.")
            nxt += ["slurm_status"]
        else:
            nxt += ["hang_stack_dump", "slurm_status"]
    else:
        verdict = "fail"
        text, links = ADVICE.get(state, (f"State {state}: see the log findings.", ["log_triage"]))
        findings.append(text.format(limit=f" of {_slurm.format_duration(limit)}" if limit else "",
                                    node=failing_node or "?", code=code, sig=f", signal {sig}" if sig else ""))
        nxt += links
    nxt.append("knowledge://orchestration/slurm.md")
    return verdict, findings, list(dict.fromkeys(nxt)), failing_step, failing_node


@_slurm.failures_as_tool_failure
def run(params: SlurmJobDiagnoseParams, progress) -> SlurmJobDiagnoseResult:
    job_id, not_seen, sources = params.job_id, [], []
    progress(0.1, f"asking slurmctld about job {job_id}")
    info: dict = {"job_id": job_id, "user": os.environ.get("USER") or getpass.getuser()}
    live = from_scontrol(job_id)
    if live:
        info.update({k: v for k, v in live.items() if v not in (None, "")})
        sources.append("scontrol")
    else:
        not_seen.append("slurmctld no longer remembers the job (finished longer ago than MinJobAge) or never had it")
    progress(0.3, "reading accounting")
    acct, steps, acct_source = from_sacct(job_id, not_seen)
    if acct:
        sources.append(acct_source)
        for k, v in acct.items():
            if v in (None, "") or (k in info and live and k not in ("submit_line",)):
                continue  # scontrol is fresher while it knows the job
            info[k] = v
        if live is None or info.get("state") in ("RUNNING", "COMPLETING") and acct["state"] not in ("RUNNING",):
            info["state"] = acct["state"]
    if not live and not acct:
        info["state"] = None

    progress(0.5, "looking for the job's log files")
    logs = find_logs(info, job_id, params.search_dirs)
    extra = [Path(p) for p in params.log_paths]
    missing = [str(p) for p in extra if not p.is_file()]
    if missing:
        not_seen.append(f"log files not found: {', '.join(missing)}")
    all_logs = logs + [p for p in extra if p.is_file() and p not in logs]
    if not all_logs:
        not_seen.append("the job's stdout/stderr files were not found (give log_paths or search_dirs)")
    else:
        sources.append("log files")
    if not live and not acct and not all_logs:
        raise ToolFailure(f"nothing is known about job {job_id}: slurmctld has forgotten it (or never had it), "
                          "sacct has no record, and no log file was found. Check the id, give log_paths to the "
                          "job's output, or search_dirs where slurm-<id>.out was written.")
    log_state, log_node, evidence = scan_slurm_lines(all_logs)
    progress(0.7, "triaging logs")
    log_verdict, log_findings, log_next = (triage(all_logs) if params.triage_logs and all_logs
                                           else ("info", [], []))

    verdict, findings, nxt, failing_step, failing_node = diagnose(info, steps, log_state, log_node, evidence)
    if not live and not acct:
        findings.insert(0, "Only the log files were available: the state comes from the lines SLURM wrote there"
                           + (" (none here: state unknown)." if not log_state else "."))
        if not log_state:  # nothing to judge from SLURM: the logs decide
            verdict = log_verdict if log_verdict in ("fail", "warn") else "info"
    if log_findings and not log_findings[0].startswith("log_triage is not installed"):
        findings.extend(f"Log: {f}" for f in log_findings[:5])
        # What the log points to, before the SLURM page; log_triage itself has run already.
        nxt = [n for n in dict.fromkeys(nxt[:-1] + log_next + nxt[-1:])
               if n not in ("log_triage", "slurm_job_diagnose")]
    if not_seen:
        findings.append("Could not see: " + "; ".join(not_seen) + ".")
    progress(1.0, "done")
    stdout = str(all_logs[0]) if all_logs else None
    stderr = info.get("stderr") if info.get("stderr") and Path(info["stderr"]).is_file() else stdout
    return SlurmJobDiagnoseResult(
        verdict=verdict, findings=findings, next=nxt, job_id=job_id, name=info.get("name"),
        state=info.get("state") or log_state, state_explained=_slurm.explain_state(info.get("state") or log_state or ""),
        reason=info.get("reason"), exit_code=info.get("exit_code"), signal=info.get("signal"),
        elapsed_s=info.get("elapsed_s"), time_limit_s=info.get("time_limit_s"), partition=info.get("partition"),
        nodes=info.get("nodes"), failing_step=failing_step, failing_node=failing_node, steps=steps,
        stdout_path=stdout, stderr_path=stderr, sources=sources, not_seen=not_seen, log_findings=log_findings)


SPEC = ToolSpec(
    name="slurm_job_diagnose",
    summary="Why a SLURM job failed: state, exit code/signal, time limit, OOM, node failure, failing step, log triage.",
    description=(
        "Diagnose one SLURM job or array task by id: its state (FAILED, TIMEOUT, OUT_OF_MEMORY, NODE_FAIL, "
        "PREEMPTED, CANCELLED...), exit code and signal, elapsed time against the limit, the failing step and "
        "node, and the causes log_triage finds in its stdout/stderr files (found automatically); ends with what "
        "to do next. Works without accounting (scontrol while slurmctld remembers the job, then the log files) "
        "and says what it could not see. Use for 'my job died', 'job killed', 'TIMEOUT', 'exit code 137', "
        "'NODE_FAIL'. Read-only, a few seconds; needs the SLURM client commands. Not for jobs still pending "
        "(slurm_status) or hung jobs (hang_stack_dump)."),
    Params=SlurmJobDiagnoseParams, Result=SlurmJobDiagnoseResult, run=run,
    runs="subprocess", read_only=True, destructive=False, idempotent=True, open_world=True,
    timeout_s=120, store=False,
)

if __name__ == "__main__":
    from tools.harness import main

    main(SPEC)
