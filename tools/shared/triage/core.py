"""Log triage itself: scan files or text against the signature catalog and judge the first failure.

    from tools.shared.triage.core import triage_paths, triage_text
    result = triage_paths(["slurm-1234.out", "logs/"])     # -> LogTriageResult
    result = triage_text(pasted_log)
Both raise ToolFailure for unusable input (no such path, a binary file named explicitly). The
log_triage tool and slurm_job_diagnose both call these. The helpers beside this module do the
rest: ../logscan.py reads files and rank labels, signatures.py holds the catalog and what each
signature parses from its line, match.py matches blocks (in parallel for big files), findings.py
writes the per-signature and per-rank findings.
"""


import time


from .blame import IB_SIGNATURES, coincidence, culprit_of, ib_action, ib_sentence, tally_of, weigh, window_action
from .findings import on_rank, quiet_ranks, silent_ranks, special_findings
from ..log_hosts import device_phrase
from .match import Hit, ScanState, Tally, merge, new_state, scan_block, scan_file
from ..logscan import (
    CHUNK_BYTES,
    format_ranks,
    head_text,
    iter_text_chunks_of_string,
    rank_of_path,
    ranks_in_block,
    ranks_phrase,
    read_each,
    resolve_paths,
    srun_labelled,
)
from ...engine.spec import Field, Progress, Record, Result, ToolFailure
from ..actions import ACTION_FIELD, Action, worst_action
from ..culprit_kind import CULPRIT_KIND_FIELD, Culprit, CulpritKind, rank_culprit

# ---------------------------------------------------------------------------------------------------
# Result

class SignatureHit(Record):
    id: str = Field(description="Signature id from knowledge/data/log_signatures.toml.")
    name: str = Field(description="Short name.")
    category: str = Field(description="cuda, nccl, collective, numerics, slurm, storage, ...")
    severity: str = Field(description="error | warn")
    role: str = Field(description="cause (why a run fails) | cascade (usually a consequence of a failure elsewhere)")
    count: int = Field(0, description="Matching lines.")
    ranks: str = Field("", description="Ranks whose lines match, as ranges ('0-6,8'); empty when lines carry no rank.")
    first: str = Field("", description="First occurrence: 'file:line'.")
    details: dict[str, str] = Field(default_factory=dict, description="Values parsed from the first occurrence "
                                    "(op, seq, sizes in GiB, exit code, XID meaning ...).")
    evidence: list[str] = Field(default_factory=list, description="A few matching lines as 'file:line: text'.")
    meaning: str = Field("", description="What it means and what to check.")
    next: list[str] = Field(default_factory=list, description="Tools and knowledge pages to go to next.")
    action: Action = Field("none", description="What to do with the node (Xids: per code, from NVIDIA's catalog). "
                           + ACTION_FIELD)


class FirstFailure(Record):
    # The first finding quotes the line (with the values parsed from it) and says its name, rank and place.
    detail_fields = ("text", "details")

    signature: str = Field(description="Signature id.")
    name: str = Field(description="Signature name.")
    role: str = Field(description="cause, or cascade when no cause was found in the logs.")
    location: str = Field(description="'file:line'.")
    rank: int | None = Field(None, description="Rank of that line, when known.")
    host: str = Field("", description="Host that printed the line (syslog / NCCL prefix, or the file's name).")
    text: str = Field("", description="The line (cut at 400 characters).")
    details: dict[str, str] = Field(default_factory=dict, description="Values parsed from it.")
    action: Action = Field("none", description=ACTION_FIELD)


class LogTriageResult(Result):
    # Each signature has its finding (name, lines, ranks, first place), and so has the first error per rank; the scan's
    # own figures are in the last finding. The stored record keeps them (results_history result_id=N).
    detail_fields = ("signatures", "signatures_omitted", "by_rank", "files_scanned", "lines_scanned", "bytes_scanned",
                     "seconds")

    first_failure: FirstFailure | None = Field(None, description=(
        "The chronologically first cause (time stamps where lines have them, otherwise order of appearance); "
        "the first cascade line when no cause is present."))
    signatures: list[SignatureHit] = Field(default_factory=list, description="Signatures found, first failure first, "
                                           "then by first occurrence.")
    signatures_omitted: int = Field(0, description="Distinct signatures found but left out (max_signatures).")
    suspect_ranks: list[int] = Field(default_factory=list, description=(
        "Ranks that report no error while others timed out waiting for them in a collective (first 64)."))
    by_rank: dict[str, str] = Field(default_factory=dict, description=(
        "Ranks (as ranges) -> the signature of their first error line, e.g. {'3': 'cuda_oom', '0-2': "
        "'nccl_remote_error'}; at most 20 groups."))
    files_scanned: list[str] = Field(default_factory=list, description="Files read (at most 50 listed).")
    files_skipped: list[str] = Field(default_factory=list, description="Files not read, with the reason.")
    lines_scanned: int = Field(0, description="Lines read.")
    bytes_scanned: int = Field(0, description="Bytes read (uncompressed size for .gz).")
    ranks_seen: str = Field("", description="Ranks that appear in rank labels, as ranges.")
    seconds: float = Field(0.0, description="Wall time of the scan (s).")
    action: Action = Field("none", description="The strongest action any signature calls for. " + ACTION_FIELD)
    culprit_kind: CulpritKind | None = Field(None, description=CULPRIT_KIND_FIELD)
    culprit: Culprit | None = Field(None, description="The culprit the first failure names, and how to name it.")
    action_on: list[str] = Field(default_factory=list, description=(
        "Hosts the strongest action applies to (the hosts of the lines that call for it), when the logs name them."))


# ---------------------------------------------------------------------------------------------------
# Summary: first failure, findings, verdict

def _chronological(hits: list[Hit]) -> list[Hit]:
    """By time stamp when every hit has one (logs from several files), else by order of appearance."""
    if hits and all(h.ts is not None for h in hits):
        return sorted(hits, key=lambda h: (h.ts, h.order))
    return sorted(hits, key=lambda h: h.order)


def _pick_first_failure(tallies: list[Tally]) -> Hit | None:
    errors = [t for t in tallies if t.sig.severity == "error"]
    causes = [t.first_cause for t in errors if t.first_cause]
    if causes:
        ordered = _chronological(causes)
        weak = {t.first_cause.order for t in errors if t.first_cause and t.sig.weak}
        first = ordered[0]
        # a generic line (a bare exception, "terminate called ...") followed within 3 lines by a specific
        # cause: the specific one says what happened
        for later in ordered[1:]:
            if first.order in weak and later.file == first.file and 0 < later.line_no - first.line_no <= 3:
                return later
        return first
    # a generic echo (SIGABRT after the watchdog) says less than the timeout it echoes
    cascades = [t.first for t in errors if t.first and not t.sig.weak] or [t.first for t in errors if t.first]
    return _chronological(cascades)[0] if cascades else None


def _where(hit: Hit) -> str:
    return f"{hit.file}:{hit.line_no}"


def _summarise(state: ScanState, scanned: list[str], skipped: list[str], max_signatures: int,
               seconds: float) -> LogTriageResult:
    tallies = list(state.tallies.values())
    first, crash = weigh(tallies, _pick_first_failure(tallies))
    first_tally = tally_of(tallies, first) if first else None
    culprit = culprit_of(state, first_tally, first) if first else None
    if first is not None and first.role == "cascade" and culprit is None:
        silent, _ = silent_ranks(state, None)      # only echoes in the log: the rank that said nothing is the answer
        culprit = rank_culprit(silent[0], state.rank_devices.get(silent[0], ("",))[0] or None) if len(silent) == 1 else None
    first_action = window_action(tallies, first_tally, first, crash) if first else "none"
    if first is not None and first_tally.sig.id in IB_SIGNATURES:
        first_action = ib_action(state, first_action)
    ordered = sorted(tallies, key=lambda t: (t is not first_tally, t.sig.severity != "error", t.first.order))
    shown = ordered[:max_signatures]
    by_rank = _by_rank(state)
    findings, suspects, quiet = _findings(state, first, first_tally, shown, by_rank, culprit, first_action)
    if first is not None and crash is not None and first.ts is not None and first_tally.sig.category == "gpu_hardware":
        findings.insert(1, coincidence(first, crash))
    findings.append(f"Read {len(scanned)} file(s), {state.bytes / (1 << 20):.1f} MiB, {state.lines} lines in "
                    f"{seconds:.1f} s.")
    if not tallies:
        findings.insert(0, "The log is empty." if state.lines == 0 else
                        f"No known failure signature in {state.lines} lines: nothing here says the run failed (no "
                        "error, crash, timeout, kill or hardware event). Only if a job is hanging right now: dump "
                        "the stacks of its live ranks (hang_stack_dump).")
    severities = {t.sig.severity for t in tallies}
    worst = worst_action([_tally_action(t) for t in tallies] + [first_action])
    verdict = "fail" if "error" in severities else "warn" if severities or quiet else (
        "info" if state.lines == 0 else "ok")
    stacks = state.pyspy_threads and "error" not in severities
    if stacks:
        findings.insert(0, f"These are saved py-spy dumps ({state.pyspy_threads} thread stacks), not a log: "
                           "hang_stack_dump reads them (dump_paths / dump_text), groups identical stacks and names "
                           "the odd ranks.")
        verdict = "info"
    hits = [_hit_model(t) for t in shown]
    return LogTriageResult(
        verdict=verdict, findings=findings,
        next=["hang_stack_dump"] if stacks else _next_steps(first_tally, shown)[:6],
        first_failure=FirstFailure(signature=first_tally.sig.id, name=first_tally.sig.name, role=first.role,
                                   location=_where(first), rank=first.rank, host=first.host or "", text=first.text,
                                   details={k: str(v) for k, v in first.details.items()},
                                   action=first_action) if first else None,
        culprit=culprit, culprit_kind=culprit.kind if culprit else None,
        signatures=hits, signatures_omitted=len(ordered) - len(shown),
        action=worst, action_on=sorted(set(_action_hosts(tallies, worst)) | (
            {culprit.node} if culprit and culprit.node and first_action == worst != "none" else set())),
        files_scanned=scanned[:50], files_skipped=skipped[:50], lines_scanned=state.lines,
        bytes_scanned=state.bytes, ranks_seen=format_ranks(state.ranks_seen), seconds=round(seconds, 3),
        by_rank=by_rank, suspect_ranks=suspects[:64])


def _headline(first: Hit, first_tally: Tally, culprit: Culprit | None, action: str, state: ScanState) -> str:
    """The answer first: what failed, the culprit by kind and name, and the action on what."""
    where = f" on {first.host}" if first.host and not culprit else ""
    device = (device_phrase(state.rank_devices, culprit.rank, host_said=bool(culprit.node))
              if culprit and culprit.kind == "rank" else "")
    blame = f" Culprit ({culprit.kind}): {culprit.name}{device}." if culprit else ""
    target = (culprit.name if culprit.kind == "gpu" else culprit.node or culprit.name) if culprit else ""
    act = f" Action: {action} on {target}." if action != "none" and culprit else (
        f" Action: {action}." if action != "none" else "")
    ib = f" {ib_sentence(state)}" if first_tally.sig.id in ("nccl_ib_completion_error", "nccl_ib_async_event") else ""
    return (f"First failure: {first_tally.sig.name}{on_rank(first.rank)}{where} at {_where(first)}: "
            f"{first.text[:240].rstrip('.')}.{blame}{act}{ib}")


def _findings(state: ScanState, first: Hit | None, first_tally: Tally | None, shown: list[Tally],
              by_rank: dict[str, str], culprit: Culprit | None = None,
              action: str = "none") -> tuple[list[str], list[int], list[int]]:
    """The first failure and what it means, then per-signature and per-rank findings, then the other
    signatures. Returns (findings, suspect ranks, ranks that went quiet)."""
    findings: list[str] = []
    if first:
        sig = first_tally.sig
        findings.append(_headline(first, first_tally, culprit, action, state))
        if first.role == "cascade":
            findings.append("No root cause line in these logs, only consequences: add the logs of every rank "
                            "(and the kernel log for XIDs / OOM kills) or dump stacks of a live job.")
        findings.append(sig.meaning)
    for tally in shown:
        findings.extend(special_findings(tally))
    cause = first if first is not None and first.role == "cause" else None
    suspects, silent_findings = silent_ranks(state, cause)
    if first is not None and first.role == "cascade" and silent_findings:
        # The first line is an echo (a rank that waited); the rank that never said anything leads the answer.
        findings.insert(0, f"Suspect{'s' if len(suspects) > 1 else ''}: {ranks_phrase(suspects)}. "
                           + silent_findings[0])
        findings[1] = findings[1].replace("First failure:", "First failure (a consequence, on a waiting rank):", 1)
    else:
        findings.extend(silent_findings)
    quiet, quiet_findings = quiet_ranks(state, cause)
    findings.extend(quiet_findings)
    if len(state.rank_first) > 1 and len(by_rank) > 1:
        names = {t.sig.id: t.sig.name for t in state.tallies.values()}
        findings.append("By rank, first error: " + "; ".join(
            f"{ranks_phrase(_parse_ranges(r))}: {names[sig]}" for r, sig in list(by_rank.items())[:6]) + ".")
    for tally in shown:
        if tally is first_tally:
            continue
        ranks = f" on {ranks_phrase(tally.ranks)}" if tally.ranks else ""
        findings.append(f"{tally.sig.name}: {tally.count} line(s){ranks}, first at {_where(tally.first)}.")
    return findings, sorted(set(suspects) | set(quiet)), quiet


def _next_steps(first_tally: Tally | None, shown: list[Tally]) -> list[str]:
    if not shown:
        return ["hang_stack_dump", "knowledge://debugging/logs.md"]
    steps = [step for tally in ([first_tally] if first_tally else []) + shown for step in tally.sig.next]
    return list(dict.fromkeys(steps))


def _by_rank(state: ScanState) -> dict[str, str]:
    """Group ranks by the signature of their first error line; groups in order of their lowest rank."""
    groups: dict[str, list[int]] = {}
    for rank, sig_id in state.rank_first.items():
        groups.setdefault(sig_id, []).append(rank)
    ordered = sorted(groups.items(), key=lambda kv: min(kv[1]))[:20]
    return {format_ranks(ranks): sig_id for sig_id, ranks in ordered}


def _parse_ranges(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _action_hosts(tallies: list[Tally], action: str) -> list[str]:
    """The hosts whose lines call for `action` (an Xid on node7 drains node7, not the job)."""
    if action == "none":
        return []
    hosts = {h.host for t in tallies for h in (t.first, *t.evidence, *t.timed)
             if h is not None and h.host and h.details.get("action", _tally_action(t)) == action}
    return sorted(hosts)[:64]


def _tally_action(t: Tally) -> str:
    return t.extra.get("worst_action", t.sig.action) if isinstance(t.extra, dict) else t.sig.action


def _hit_model(t: Tally) -> SignatureHit:
    return SignatureHit(action=_tally_action(t),
        id=t.sig.id, name=t.sig.name, category=t.sig.category, severity=t.sig.severity, role=t.sig.role,
        count=t.count, ranks=format_ranks(t.ranks), first=_where(t.first),
        details={k: str(v) for k, v in t.first.details.items()},
        evidence=[f"{_where(e)}: {e.text}" for e in t.evidence], meaning=t.sig.meaning, next=list(t.sig.next))


# ---------------------------------------------------------------------------------------------------
# Entry points

def triage_paths(paths: list[str], *, max_files: int = 2000, max_signatures: int = 12, evidence_lines: int = 3,
                 progress: Progress | None = None, workers: int | None = None) -> LogTriageResult:
    """Triage log files / directories / globs. Stable API (slurm_job_diagnose uses it).

    workers: processes per big file (None: automatic, plain files over 96 MiB use up to 8 CPUs; 1: never split).
    """
    files, skipped = resolve_paths([str(p) for p in paths], max_files)
    state = new_state(evidence_lines)
    t0 = time.monotonic()

    def scan(path):
        label, file_rank = str(path), rank_of_path(str(path))
        head = head_text(path)
        srun = srun_labelled(head)
        if file_rank is not None and ranks_in_block(head, srun):
            file_rank = None  # a multi-rank log whose name happens to say "rank3"
        offset = 0
        for part in scan_file(path, label, file_rank, srun, evidence_lines, workers):
            merge(state, part, offset)
            offset += part.lines

    # a single binary file named on its own is a mistake worth an error, not a skipped entry
    refuse = ("log_triage reads text logs (plain or .gz); for flight-recorder dumps use flight_recorder_analyze"
              if len(paths) == 1 and len(files) == 1 else None)
    scanned = read_each(files, skipped, scan, progress, refuse)
    return _summarise(state, scanned, skipped, max_signatures, time.monotonic() - t0)


def triage_text(text: str, *, max_signatures: int = 12, evidence_lines: int = 3) -> LogTriageResult:
    """Triage pasted log text. Stable API."""
    if "\x00" in text[:65536] and text[:65536].count("\x00") > len(text[:65536]) // 100:
        raise ToolFailure("the text holds binary data (NUL bytes), not a log; paste the text output of the job")
    state = new_state(evidence_lines)
    t0 = time.monotonic()
    line_no, srun = 1, srun_labelled(text[:CHUNK_BYTES])
    for block in iter_text_chunks_of_string(text):
        state.bytes += len(block.encode("utf-8", errors="replace"))
        line_no += scan_block(block, line_no, "<text>", None, state, srun)
    state.lines = line_no - 1
    return _summarise(state, ["<text>"], [], max_signatures, time.monotonic() - t0)
