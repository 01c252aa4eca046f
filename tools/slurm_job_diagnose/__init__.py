"""slurm_job_diagnose — why a SLURM job (or array task) ended the way it did, and what to do next.

Collects what SLURM still knows about the job: `scontrol show job` while slurmctld remembers it
(MinJobAge, 300 s by default), `sacct` when accounting runs (steps, per-step exit codes, nodes), the
job-completion log (`sacct -c`) when that is all there is; then finds the job's stdout/stderr files
and runs log_triage on them. Says which of those it could not see. A job that ran one of our own tools
(its output is that tool's answer, exit 3 for "fail") is read as that tool's verdict and findings.

By hand (login node):
    mleng run slurm_job_diagnose --job-id 123456
    mleng run slurm_job_diagnose --job-id 123456_7 --json          # one array task
    mleng run slurm_job_diagnose --job-id 123456 --log-paths logs/train-123456.out
"""

from __future__ import annotations

import getpass
import os
from pathlib import Path

from ..shared import slurm as _slurm
from .jobs import (
    SACCT_FIELDS,
    SACCT_FIELDS_MIN,
    JobStep,
    expand_log_pattern,
    find_logs,
    from_sacct,
    from_scontrol,
    log_paths_from_submit_line,
    parse_sacct,
    scan_slurm_lines,
    triage,
)
from ..engine.spec import Field, Params, Result, ToolFailure, ToolSpec
from .reports import find_report, report_findings
from ..shared.actions import ACTION_FIELD, Action, HealthFinding, worst_action


class SlurmJobDiagnoseParams(Params):
    job_id: str = Field(..., pattern=r"^\d+(_\d+)?$", max_length=40,
                        description="'123456' or an array task '123456_7'.")
    log_paths: list[str] = Field(default_factory=list, max_length=20,
                                 description=(
                                     "Extra logs (default: the job's stdout/stderr)."))
    search_dirs: list[str] = Field(default_factory=list, max_length=10,
                                   description=(
                                       "Where slurm-<id>.out may be (default: cwd)."))
    triage_logs: bool = Field(True, description="log_triage the job's logs.")


class SlurmJobDiagnoseResult(Result):
    job_id: str = Field("", description="The job (or array task) id diagnosed.")
    name: str | None = Field(None, description="Job name.")
    state: str | None = Field(None, description="Final (or current) job state, e.g. FAILED, TIMEOUT.")
    state_explained: str | None = Field(None, description="What the state means, in plain words.")
    reason: str | None = Field(None, description="SLURM's reason field (e.g. NonZeroExitCode, TimeLimit).")
    exit_code: int | None = Field(None, description="Exit code of the job script (0-255).")
    signal: int | None = Field(None, description="Signal that ended it, 0 if none.")
    elapsed_s: int | None = Field(None, description="Run time, seconds.")
    time_limit_s: int | None = Field(None, description="Time limit, seconds (None: unlimited).")
    partition: str | None = Field(None, description="Partition the job ran in.")
    nodes: str | None = Field(None, description="Nodes the job ran on.")
    failing_step: str | None = Field(None, description="First step that did not complete (from sacct).")
    failing_node: str | None = Field(None, description="Node of the failing step/task, when SLURM or srun named it.")
    steps: list[JobStep] = Field(default_factory=list, description="The job's steps, as accounting or scontrol knows them.")
    stdout_path: str | None = Field(None, description="The job's standard output file, when found.")
    stderr_path: str | None = Field(None, description="The job's standard error file, when found.")
    sources: list[str] = Field(default_factory=list, description="Where the facts came from.")
    not_seen: list[str] = Field(default_factory=list, description="What could not be checked, and why.")
    log_findings: list[str] = Field(default_factory=list, description="What log_triage found in the logs.")
    health: list[HealthFinding] = Field(default_factory=list, description=(
        "Hardware and node findings (a failed node, Xids, ECC, a lost GPU, IB errors), each with an action."))
    action: Action = Field("none", description="What to do with the failing node. " + ACTION_FIELD)


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


def gather_from_slurm(job_id: str, sources: list[str], not_seen: list[str]) -> tuple[dict, list[JobStep], bool]:
    """What slurmctld and accounting know: (info, steps, whether SLURM knew the job at all)."""
    info: dict = {"job_id": job_id, "user": os.environ.get("USER") or getpass.getuser()}
    live = from_scontrol(job_id)
    if live:
        info.update({k: v for k, v in live.items() if v not in (None, "")})
        sources.append("scontrol")
    else:
        not_seen.append("slurmctld no longer remembers the job (finished longer ago than MinJobAge) or never had it")
    acct, steps, acct_source = from_sacct(job_id, not_seen)
    if acct:
        sources.append(acct_source)
        for k, v in acct.items():
            if v not in (None, "") and (k not in info or not live):  # scontrol is fresher while it knows the job
                info[k] = v
        if live is None or (info.get("state") in ("RUNNING", "COMPLETING") and acct["state"] != "RUNNING"):
            info["state"] = acct["state"]
    if not live and not acct:
        info["state"] = None
    return info, steps, bool(live or acct)


def gather_logs(info: dict, params: SlurmJobDiagnoseParams, sources: list[str], not_seen: list[str]) -> list[Path]:
    """The job's own stdout/stderr (found from SLURM's records or default names) plus log_paths."""
    logs = find_logs(info, params.job_id, params.search_dirs)
    extra = [Path(p) for p in params.log_paths]
    missing = [str(p) for p in extra if not p.is_file()]
    if missing:
        not_seen.append(f"log files not found: {', '.join(missing)}")
    all_logs = logs + [p for p in extra if p.is_file() and p not in logs]
    if not all_logs:
        not_seen.append("the job's stdout/stderr files were not found (give log_paths or search_dirs)")
    else:
        sources.append("log files")
    return all_logs


@_slurm.failures_as_tool_failure
def run(params: SlurmJobDiagnoseParams, progress) -> SlurmJobDiagnoseResult:
    job_id, not_seen, sources = params.job_id, [], []
    progress(0.1, f"asking slurmctld and accounting about job {job_id}")
    info, steps, known = gather_from_slurm(job_id, sources, not_seen)
    progress(0.5, "looking for the job's log files")
    all_logs = gather_logs(info, params, sources, not_seen)
    if not known and not all_logs:
        raise ToolFailure(f"nothing is known about job {job_id}: slurmctld has forgotten it (or never had it), "
                          "sacct has no record, and no log file was found. Check the id, give log_paths to the "
                          "job's output, or search_dirs where slurm-<id>.out was written.")
    log_state, log_node, evidence = scan_slurm_lines(all_logs)
    progress(0.7, "triaging logs")
    log_verdict, log_findings, log_next, hits = (triage(all_logs) if params.triage_logs and all_logs
                                                 else ("info", [], [], []))

    verdict, findings, nxt, failing_step, failing_node = diagnose(info, steps, log_state, log_node, evidence)
    report = find_report(all_logs)
    if report and report.explains(info.get("exit_code")):
        # The job ran one of our tools to its answer: that answer is the diagnosis (its log is our report,
        # so log_triage's "no known signature" says nothing), then SLURM's facts of the run.
        verdict, said, nxt = report_findings(report, info)
        findings = said + [f for f in findings[1:] if not f.startswith("Its script exited with code")]
        log_findings, hits = [], []
    elif report:
        said = (f"Its output ends with a {report.tool} report, verdict {report.verdict}: "
                + (report.findings[0] if report.findings else "(no findings)"))
        findings.append(said + ("" if info.get("exit_code") is None else f" (the job's exit code {info['exit_code']} "
                                "is not that verdict's: something after the tool failed, or ended it)"))
    if not known:
        findings.insert(0, "Only the log files were available: the state comes from the lines SLURM wrote there"
                           + (" (none here: state unknown)." if not log_state else "."))
        if not log_state:  # nothing to judge from SLURM: the logs decide
            verdict = log_verdict if log_verdict in ("fail", "warn") else "info"
    if log_findings and not log_findings[0].startswith("log_triage is not usable"):
        findings.extend(f"Log: {f}" for f in log_findings[:5])
        # What the log points to, before the SLURM page; log_triage itself has run already.
        nxt = [n for n in dict.fromkeys(nxt[:-1] + log_next + nxt[-1:])
               if n not in ("log_triage", "slurm_job_diagnose")]
    if not_seen:
        findings.append("Could not see: " + "; ".join(not_seen) + ".")
    health = health_findings(info.get("state") or log_state, failing_node, hits)
    progress(1.0, "done")
    stdout = str(all_logs[0]) if all_logs else None
    stderr = info.get("stderr") if info.get("stderr") and Path(info["stderr"]).is_file() else stdout
    return SlurmJobDiagnoseResult(
        verdict=verdict, findings=findings, next=nxt, job_id=job_id, name=info.get("name"),
        state=info.get("state") or log_state, state_explained=_slurm.explain_state(info.get("state") or log_state or ""),
        reason=info.get("reason"), exit_code=info.get("exit_code"), signal=info.get("signal"),
        elapsed_s=info.get("elapsed_s"), time_limit_s=info.get("time_limit_s"), partition=info.get("partition"),
        nodes=info.get("nodes"), failing_step=failing_step, failing_node=failing_node, steps=steps,
        stdout_path=stdout, stderr_path=stderr, sources=sources, not_seen=not_seen, log_findings=log_findings,
        health=health, action=worst_action(f.action for f in health))


def health_findings(state: str | None, node: str | None, hits: list) -> list[HealthFinding]:
    """The node-level part of the diagnosis, each with its action: SLURM's own NODE_FAIL, then the log's
    hardware signatures (log_triage gives each its action; Xids per code from NVIDIA's catalog)."""
    subject = node or "the job's node"
    out = []
    if state == "NODE_FAIL":
        out.append(HealthFinding(text="SLURM reports the node failed under the job", action="drain_node",
                                 subject=subject, code="NODE_FAIL", source="slurm"))
    for h in hits:
        if h.action != "none":
            out.append(HealthFinding(text=f"{h.name}: {h.count} line(s), first at {h.first}", action=h.action,
                                     subject=subject, code=h.id, source=h.first))
    return out


SPEC = ToolSpec(
    name="slurm_job_diagnose",
    summary="Why a SLURM job failed: state, exit code/signal, time limit, OOM, node failure, failing step, log triage.",
    description=(
        "Why one SLURM job or array task failed: state (FAILED, TIMEOUT, OUT_OF_MEMORY, NODE_FAIL, PREEMPTED, "
        "CANCELLED), exit code and signal, elapsed vs limit, failing step and node, and the causes log_triage "
        "finds in its output files; what to do next. Works without accounting. Use for 'my job died', 'job "
        "killed', 'exit code 137', 'slurmstepd: error: Detected 1 oom-kill event' (host RAM, not GPU memory). "
        "A few seconds. Not for pending jobs (slurm_status) or hung ones (hang_stack_dump)."),
    Params=SlurmJobDiagnoseParams, Result=SlurmJobDiagnoseResult, run=run,
    runs="subprocess", read_only=True, destructive=False, idempotent=True, open_world=True,
    timeout_s=120, store=False,
    spans_nodes=True,  # reaches the cluster itself: the engine's node= option does not apply
)
