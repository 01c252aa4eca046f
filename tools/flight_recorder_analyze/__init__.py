"""flight_recorder_analyze — PyTorch flight-recorder dumps → the first collective ranks disagree on.

When a NCCL watchdog times out, every rank can write its flight recorder (the last N collectives it
issued, with sequence numbers, op, sizes, dtypes, state and the Python stack that called them). This
tool reads one dump per rank, lines the ranks up per process group by collective sequence number and
names the first place they part ways: ranks that never issued a collective the others wait in, a
different op, size or dtype, a rank still inside an earlier collective, or a rank that left no dump.

Turn dumps on before the job (either env var generation works; TORCH_NCCL_DUMP_ON_TIMEOUT is read by both):
    TORCH_FR_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1 TORCH_FR_DUMP_TEMP_FILE=/shared/fr/rank_
    (older torch: TORCH_NCCL_TRACE_BUFFER_SIZE=2000 and TORCH_NCCL_DEBUG_INFO_TEMP_FILE=/shared/fr/rank_)
Then, on any machine (no GPU, torch not needed):
    mleng run flight_recorder_analyze --path /shared/fr            # a directory, walked recursively
    mleng run flight_recorder_analyze --path /shared/fr --prefix rank_ --json
Under SLURM the dumps land on each node's local disk unless the prefix points at a shared filesystem:
gather them into one directory first (e.g. `srun --ntasks-per-node=1 cp /tmp/nccl_trace_rank_* /shared/fr/`).

Reads pickle dumps (with stacks) and JSON dumps (`TORCH_FR_DUMP_JSON`-style, no stacks) of any torch
version: the fields are looked up by every name they have had. Pickles are read with a loader that
refuses anything but plain data, so a hostile file cannot run code.
"""

import os
from collections import Counter, defaultdict


from .dumps import (
    DEFAULT_PREFIX_ENV,
    TORCH_DEFAULT_PREFIX,
    Op,
    RankDump,
    configured_ranks,
    find_dump_files,
    read_dumps,
)
from .torch_trace import torch_analyser
from ..engine.spec import SELF_EVIDENT, Field, Params, Record, Result, ToolSpec
from ..shared.culprits import rank_list

NEXT_ON_CULPRIT = ["hang_stack_dump", "log_triage", "knowledge://debugging/hangs.md"]
NEXT_ON_STUCK = ["nccl_log_analyze", "collective_bench", "gpu_health", "knowledge://network/nccl-debugging.md"]


class FlightRecorderParams(Params):
    path: str = Field("", max_length=4096, description=(
        "Dump directory or file. Empty: $TORCH_FR_DUMP_TEMP_FILE's, else /tmp/nccl_trace_rank_<rank>."))
    prefix: str = Field("", max_length=256, description=(
        "Only file names starting with this."))
    max_groups: int = Field(20, ge=1, le=1000,
            json_schema_extra=SELF_EVIDENT, description="Process groups reported, at most.")
    detail: bool = Field(False, description="Also each rank's last collectives per group.")
    torch_analyser: bool = Field(False, description=(
        "Also PyTorch's fr_trace (needs torch; 2-10 s)."))


class GroupReport(Record):
    # Every rank's last sequence number and recent collectives: `expected`, `found` and the two rank lists say who
    # differs and how; a 1,000-rank job's map of them is for the store.
    detail_fields = ("last_seq", "recent")

    name: str = Field("", description="Process group name as recorded ('0' is the default group).")
    desc: str = Field("", description="Group description (default_pg, or the group_desc given to new_group).")
    ranks: list[int] = Field(default_factory=list, description="Global ranks seen in (or configured for) this group.")
    problem: str = Field("none", description=(
        "none | missing_ranks | op_mismatch | size_mismatch | dtype_mismatch | no_dump | stuck"))
    seq: int | None = Field(None, description="Collective sequence number of the first disagreement.")
    culprit_ranks: list[int] = Field(default_factory=list, description="Ranks that differ from the rest.")
    waiting_ranks: list[int] = Field(default_factory=list, description="Ranks that wait for the culprits.")
    expected: str = Field("", description="What the waiting ranks issued at that sequence number.")
    found: dict[str, str] = Field(default_factory=dict, description="Per culprit rank: what it issued there instead.")
    last_seq: dict[str, int] = Field(default_factory=dict, description="Per rank: last collective sequence number recorded.")
    recent: dict[str, list[str]] = Field(default_factory=dict, description="Per rank, last collectives (detail only).")


class FlightRecorderResult(Result):
    dump_version: str = Field("", description="Flight-recorder format version in the dumps (e.g. '2.10').")
    backend: str = Field("", description="Communication backend the entries name (nccl, gloo, ...).")
    ranks_found: list[int] = Field(default_factory=list, description="Ranks with a readable dump.")
    ranks_without_dump: list[int] = Field(default_factory=list, description=(
        "Ranks the process groups list but no readable dump was found for: crashed, killed, or dumped elsewhere."))
    unreadable_files: list[str] = Field(default_factory=list, description="Files that could not be read, with why.")
    culprit_ranks: list[int] = Field(default_factory=list, description="Ranks named as the cause, all groups together.")
    p2p_ops: int = Field(0, description="Point-to-point entries (send/recv) in the dumps; these are not compared.")
    groups: list[GroupReport] = Field(default_factory=list, description="One report per process group.")
    torch_analyser_output: list[str] = Field(default_factory=list, description=(
        "PyTorch's fr_trace findings (first 40 lines), when torch_analyser was asked for."))


# ---------------------------------------------------------------------------------------------------
# Lining ranks up

def _plural(ranks) -> str:
    return f"rank{'s' if len(set(ranks)) > 1 else ''} {rank_list(ranks)}"




def _fingerprint(ops: list[Op]) -> tuple:
    return tuple((o.op, str(o.in_sizes), str(o.in_dtypes)) for o in ops)


def _mismatch_kind(a: list[Op], b: list[Op]) -> str:
    if [o.op for o in a] != [o.op for o in b]:
        return "op_mismatch"
    if [o.in_sizes for o in a] != [o.in_sizes for o in b]:
        return "size_mismatch" if [o.in_dtypes for o in a] == [o.in_dtypes for o in b] else "dtype_mismatch"
    return "dtype_mismatch"


def _last_state(ops: list[Op]) -> str:
    if not ops:
        return "issued no collective in this group"
    last = ops[-1]
    return f"last issued {last.describe()}, {'completed' if last.done else 'NOT completed (still inside it)'}"


def _report_mismatch(report: GroupReport, seq: int, have: dict[int, list[Op]], fingerprints: list[list[int]]) -> None:
    """Ranks issued different collectives at `seq`: the minority is the culprit; a tie names nobody."""
    ranked = sorted(fingerprints, key=len, reverse=True)
    majority = ranked[0] if len(ranked[0]) > len(ranked[1]) else None
    ref = majority or sorted(have)[:1]
    report.problem = _mismatch_kind(have[ref[0]], have[next(r for r in have if r not in ref)])
    report.seq = seq
    report.expected = have[ref[0]][-1].describe()
    if majority:
        report.culprit_ranks = sorted(r for r in have if r not in majority)
        report.waiting_ranks = sorted(majority)
    else:   # a tie (two ranks): say so instead of guessing
        report.culprit_ranks = sorted(have)
    report.found = {str(r): have[r][-1].describe() for r in sorted(have) if r not in ref}
    if not majority:
        report.found = {str(ref[0]): report.expected, **report.found}
        report.expected = ""


def _first_disagreement(report: GroupReport, by_seq: dict, last: dict[int, int],
                        ops_by_rank: dict[int, list[Op]]) -> bool:
    """Walk the sequence numbers every rank still holds; fill `report` at the first that ranks disagree on."""
    started = [min(s) for s in by_seq.values() if s]
    for seq in range(max(started), max(last.values()) + 1):     # ring buffers may have lost early ones
        have = {r: by_seq[r][seq] for r in by_seq if by_seq[r].get(seq)}
        if not have:
            continue                       # a number nobody recorded (a gap in the ring buffers)
        behind = sorted(r for r in by_seq if last[r] < seq)
        fingerprints = defaultdict(list)
        for r, ops in have.items():
            fingerprints[_fingerprint(ops)].append(r)
        if len(fingerprints) > 1:
            _report_mismatch(report, seq, have, list(fingerprints.values()))
            return True
        if behind:
            report.problem, report.seq = "missing_ranks", seq
            report.culprit_ranks, report.waiting_ranks = behind, sorted(have)
            report.expected = next(iter(have.values()))[-1].describe()
            report.found = {str(r): _last_state(ops_by_rank[r]) for r in behind}
            return True
    return False


def analyse_group(name: str, desc: str, ops_by_rank: dict[int, list[Op]], members: set[int],
                  no_dump: set[int], detail: bool = False) -> GroupReport:
    by_seq = {r: defaultdict(list) for r in ops_by_rank}
    for r, ops in ops_by_rank.items():
        for o in ops:
            by_seq[r][o.seq].append(o)
    last = {r: max(s) if s else 0 for r, s in by_seq.items()}
    report = GroupReport(name=name, desc=desc, ranks=sorted(members | set(ops_by_rank)),
                         last_seq={str(r): v for r, v in sorted(last.items())})
    if detail:
        report.recent = {str(r): [o.describe() + ("" if o.done else " [not completed]") for o in ops[-5:]]
                         for r, ops in sorted(ops_by_rank.items())}
    if not any(by_seq.values()) or _first_disagreement(report, by_seq, last, ops_by_rank):
        return report
    # Every rank agrees: if the last collective has not completed, say who waits and for whom.
    final = max(last.values())
    waiting = sorted(r for r in by_seq if by_seq[r].get(final) and not by_seq[r][final][-1].done)
    if waiting and no_dump & members:
        report.problem, report.seq = "no_dump", final
        report.culprit_ranks, report.waiting_ranks = sorted(no_dump & members), waiting
        report.expected = by_seq[waiting[0]][final][-1].describe()
    elif waiting:
        report.problem, report.seq, report.waiting_ranks = "stuck", final, waiting
        report.expected = by_seq[waiting[0]][final][-1].describe()
    return report


def _group_finding(g: GroupReport) -> str:
    where = f"process group {g.name!r}" + (f" ({g.desc})" if g.desc else "")
    if g.problem == "missing_ranks":
        why = "; ".join(f"rank {r} {s}" for r, s in g.found.items())
        return (f"In {where}, {_plural(g.waiting_ranks)} entered {g.expected} and "
                f"wait{'s' if len(g.waiting_ranks) == 1 else ''} for "
                f"{_plural(g.culprit_ranks)}, which never issued it: {why}.")
    if g.problem in ("op_mismatch", "size_mismatch", "dtype_mismatch"):
        what = "an op mismatch" if g.problem == "op_mismatch" else "a " + g.problem.replace("_", " ")
        if not g.waiting_ranks:
            sides = "; ".join(f"rank {r}: {s}" for r, s in g.found.items())
            return (f"In {where}, collective #{g.seq} is {what} with no majority to tell who is wrong: "
                    f"{sides}. Compare the call sites.")
        found = "; ".join(f"rank {r} issued {s}" for r, s in g.found.items())
        return (f"In {where}, collective #{g.seq} is {what}: {_plural(g.waiting_ranks)} issued "
                f"{g.expected}, but {found}. Culprit: {_plural(g.culprit_ranks)}.")
    if g.problem == "no_dump":
        return (f"In {where}, {_plural(g.waiting_ranks)} wait{'s' if len(g.waiting_ranks) == 1 else ''} in "
                f"{g.expected} and every dump agrees up to "
                f"there; {_plural(g.culprit_ranks)} left no dump: it most likely crashed, was killed, or is "
                "stuck where it cannot dump (in a CUDA kernel, or the host died) — look at its log first.")
    if g.problem == "stuck":
        return (f"In {where}, every rank issued {g.expected} with matching op, sizes and dtypes, and it has not "
                f"completed on {_plural(g.waiting_ranks)}: no mismatch; the collective itself is stuck "
                "(network, NCCL, or a GPU) — or the dump was taken the instant it was issued.")
    return f"In {where}, {_plural(g.ranks)} agree on every recorded collective (up to #{max(g.last_seq.values(), default=0)})."


def analyse(dumps: dict[int, RankDump], detail: bool = False, max_groups: int = 20) -> FlightRecorderResult:
    configured = configured_ranks(dumps)
    found = set(dumps)
    expected = set().union(found, *configured.values()) | set(range(max(found) + 1))
    no_dump = expected - found
    per_group: dict[tuple, dict[int, list[Op]]] = defaultdict(dict)
    for r, d in dumps.items():
        for key, ops in d.groups.items():
            per_group[key][r] = sorted(ops, key=lambda o: o.seq)
    versions = Counter(d.version for d in dumps.values())
    backends = Counter(d.backend for d in dumps.values() if d.backend)
    result = FlightRecorderResult(dump_version=versions.most_common(1)[0][0],
                                  backend=backends.most_common(1)[0][0] if backends else "",
                                  ranks_found=sorted(found), ranks_without_dump=sorted(no_dump))
    reports = []
    for (name, desc), ops_by_rank in sorted(per_group.items(), key=lambda kv: (len(kv[0][0]), kv[0])):
        is_default = desc == "default_pg" or name == "0"
        members = set(configured.get(name, ())) or (expected if is_default else set(ops_by_rank))
        for r in members & found:           # a member with a dump but no entry in this group
            ops_by_rank.setdefault(r, [])
        reports.append(analyse_group(name, desc, ops_by_rank, members, no_dump, detail))
    # Groups with a problem first, so that max_groups never hides one.
    result.groups = sorted(reports, key=lambda g: g.problem == "none")[:max_groups]
    result.p2p_ops = sum(d.p2p_ops for d in dumps.values())
    return result


# ---------------------------------------------------------------------------------------------------
# The tool

def _findings(result: FlightRecorderResult, bad: list[GroupReport], dumps: dict[int, RankDump],
              unreadable: list[str]) -> list[str]:
    """Culprits first, then what limits the answer (missing dumps, unread files, p2p, mixed builds)."""
    findings = [_group_finding(g) for g in bad]
    if result.ranks_without_dump and not any(g.problem == "no_dump" for g in bad):
        findings.append(f"No dump from {_plural(result.ranks_without_dump)}: crashed, killed before "
                        "dumping, or their files are on another node — collect them if they exist.")
    findings += [_group_finding(g) for g in result.groups if g.problem == "stuck"]
    if unreadable:
        findings.append(f"{len(unreadable)} file(s) could not be read: {unreadable[0]}"
                        + (" (and more, see unreadable_files)" if len(unreadable) > 1 else ""))
    if result.p2p_ops:
        findings.append(f"{result.p2p_ops} point-to-point entries (send/recv, e.g. pipeline stages) were not "
                        "compared: a hang between pipeline stages can hide there; see hang_stack_dump.")
    versions = sorted({d.version for d in dumps.values()})
    if len(versions) > 1:
        findings.append(f"Ranks wrote different dump format versions {versions}: mixed torch builds in "
                        "one job cause hangs of their own (see env_report).")
    if not findings:
        findings = [_group_finding(g) for g in result.groups[:3]]
        findings.append("No rank disagrees in the recorded window: if the job hung, the cause is outside "
                        "collectives (a rank stuck in compute, I/O or the dataloader).")
    findings.insert(0, f"Read {len(dumps)} dumps (ranks {rank_list(dumps)}; format {result.dump_version}, "
                       f"backend {result.backend or '?'}) covering {len(result.groups)} process group(s).")
    return findings


def _user_name(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return "no such user"


def run(params: FlightRecorderParams, progress) -> FlightRecorderResult:
    progress(0.1, "reading dumps")
    dumps, unreadable, foreign = read_dumps(params.path, params.prefix)
    progress(0.6, f"lining up {len(dumps)} ranks")
    result = analyse(dumps, params.detail, params.max_groups)
    result.unreadable_files = unreadable[:50]
    bad = [g for g in result.groups if g.problem not in ("none", "stuck")]
    result.culprit_ranks = sorted({r for g in bad for r in g.culprit_ranks})
    result.findings = _findings(result, bad, dumps, unreadable)
    if foreign:    # said first: whoever can write these files chose the culprit this answer names
        owners = ", ".join(f"{n} by uid {uid} ({_user_name(uid)})" for uid, n in sorted(foreign.items()))
        result.findings.insert(0, f"Another user's files: {owners}, not yours (uid {os.geteuid()}). What follows rests "
                                  "on them: check who wrote the dumps before acting on a culprit they name.")
    if bad:
        result.verdict = "fail"
        result.next = NEXT_ON_CULPRIT
    elif result.ranks_without_dump or unreadable or any(g.problem == "stuck" for g in result.groups):
        result.verdict = "warn"
        result.next = NEXT_ON_STUCK + ["log_triage"]
    else:
        result.verdict = "ok"
        result.next = ["hang_stack_dump", "knowledge://debugging/hangs.md"]
    if params.torch_analyser:
        progress(0.8, "running PyTorch's fr_trace for a second opinion")
        result.torch_analyser_output = torch_analyser(dumps, result.groups)
    progress(1.0, "done")
    return result


SPEC = ToolSpec(
    name="flight_recorder_analyze",
    summary="PyTorch flight-recorder dumps → the first mismatched or missing collective per process group, culprit ranks.",
    description=(
        "Reads PyTorch flight-recorder dumps written at an NCCL watchdog timeout (pickle or JSON, any torch) "
        "and names, per process group, the first collective where ranks disagree: ranks that never issued it "
        "('ranks 0-6 wait in all_reduce #812; rank 7 last issued #811'), a different op, size or dtype, ranks "
        "with no dump. After 'Watchdog caught collective operation timeout' (logs: log_triage first) or a "
        "desync: "
        "no path first (torch's default dump location), else path= the dump directory. Seconds, no GPU. Still "
        "hanging with no dumps: hang_stack_dump."),
    Params=FlightRecorderParams, Result=FlightRecorderResult, run=run, runs="subprocess",
)
