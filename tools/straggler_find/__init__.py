"""straggler_find — the rank that holds a RUNNING job back, its host and GPU, and why; the job untouched.

For 6 s (longer while a rank leads unclearly, up to window_s: look.py) every rank's main-thread Python
stack is sampled with py-spy (5 Hz, never stopping the rank), each
sample classed as waiting in a collective, loading data, copying to the device or computing; beside it
each rank's CPU time, run-queue wait and cpu-cgroup throttling, each node's steal, load, memory
pressure, TCP retransmits and shaped links, each GPU through NVML (clocks, power, heat, utilisation,
clock-event reasons, who holds it) and NCCL RAS where `ncclras` runs. In synchronous data parallel
every rank runs at the pace of the slowest: the straggler is the rank that waits least while the others
wait in collectives, or whose host starves it far more than its peers' (throttled, run-queue wait, steal,
memory pressure: host_causes.py) whatever its stacks say (the rules and margins: judge.py,
knowledge/data/straggler_rules.toml).
Bounds: window 5-120 s, at most 64 ranks per node and 64 nodes (SLURM or hosts), 64 pids.

By hand (as the job's user or root; needs py-spy):
    mleng run straggler_find --pids 4101 4102 4103 4104          # ranks on this node
    mleng run straggler_find --launcher-pid 4100                  # a torchrun: its workers
Under SLURM (this checkout on a filesystem every node sees):
    mleng run straggler_find --slurm-job-id 4242 --window-s 30    # every node, srun --overlap
Without SLURM (torchrun launched over ssh; mleng at the same path on every host):
    mleng run straggler_find --hosts 'gpu-[01-04]' --run-id job42  # each host over ssh (ssh_job.py)
"""

import os
import re
from typing import Annotated

from pydantic import model_validator

from .answer import findings, next_steps, next_tools
from .judge import Judgement, Rules
from .look import look
from .models import GpuSample, NodeReport, NodeSample, RankSample, Straggler
from .slurm_job import sample_job
from .ssh_job import sample_hosts
from .step import node_line
from .step_trend import StepTrend, sentence as trend_sentence, trend
from ..engine.printable import printable
from ..shared.culprit_kind import CULPRIT_KIND_FIELD, Culprit, CulpritKind
from ..engine.spec import SELF_EVIDENT, Field, Params, Result, ToolFailure, ToolSpec
from ..shared import slurm
from ..shared.logscan import capped_lines
from ..shared.safe_read import open_regular, read_tail
from ..shared.process_targets import ALLOW_OTHER_USERS_HELP, check_job_name, describe, is_python, running_job

MAX_PIDS = 64
# How much of a log's end is read for step times: 4 MiB is hours of a real job's step lines (one a second, ~150
# bytes), the span a "slower since yesterday" trend needs; 64 KiB held 20 s of the drills' 10 ms steps (model round
# 12). 32,768 Megatron-style lines read and judged in 0.66 s on the loaded 2-core machine (2026-12-05).
LOG_TAIL_BYTES = 4 << 20
TAIL_WORDS = "4 MiB"
# A step-time line: a step word, then a digit and a time or rate word. Separate searches from the step word's end,
# instead of one `.*\d.*` pattern (cubic in the line's length: 62 s on one 4 KB line of "step 1 ").
# The step counter of PyTorch's examples ("Epoch: [0][ 82/87866]\tTime 0.469") counts as a step word too.
STEP_WORD = re.compile(r"(?i)\b(?:step|iter(?:ation)?)\b|\]\[ {0,8}\d{1,12}/\d{1,12}\]")
DIGIT = re.compile(r"\d")
# A time word may end a field name ("step_ms 812", "iter_time=0.8"): "_" is a word character, so \b alone missed
# them, and our own drills' workload logged "step 12 rank 0 step_ms 812.4" unread (model round 10).
TIME_WORD = re.compile(r"(?i)(?:\b|_)(?:ms|s|sec|time|elapsed|it/s|s/it|tokens/s|tflops|mfu)\b")


class StragglerFindParams(Params):
    # The characters are a published guard; the form (N, or N_M for an array task) is checked in _one_target.
    slurm_job_id: str = Field("", max_length=32, pattern=r"^[0-9_]*$", description=(
        "A RUNNING job: every node sampled at once."))
    hosts: list[Annotated[str, Field(max_length=4096)]] = Field(default_factory=list, max_length=64, description=(
        "No SLURM: over ssh, with run_id or launcher_match."))
    run_id: str | None = Field(None, max_length=128, json_schema_extra=SELF_EVIDENT, description=(
        "torchrun's --rdzv-id (TORCHELASTIC_RUN_ID in its ranks): its ranks on hosts."))
    launcher_match: str | None = Field(None, max_length=200, json_schema_extra=SELF_EVIDENT, description=(
        "A literal piece of the launcher's command line: its ranks on hosts."))
    launcher_pid: int | None = Field(None, ge=1, description="A launcher pid here: its ranks.")
    pids: list[Annotated[int, Field(ge=1)]] = Field(default_factory=list, max_length=MAX_PIDS,
                                                    json_schema_extra=SELF_EVIDENT, description=(
        "Rank pids here."))
    window_s: float = Field(60.0, ge=5, le=120, description=(
        "Longest look (6 s when clear)."))
    rate_hz: int = Field(5, ge=5, le=100, json_schema_extra=SELF_EVIDENT, description="Per rank (~1 ms CPU each).")
    allow_other_users: bool = Field(False, description=ALLOW_OTHER_USERS_HELP)
    log_paths: list[Annotated[str, Field(max_length=4096)]] = Field(default_factory=list, max_length=8, description=(
        "Job logs: last step-time lines quoted."))

    @model_validator(mode="after")
    def _one_target(self):
        if (self.run_id or self.launcher_match) and not self.hosts:
            raise ValueError("run_id and launcher_match name a job on hosts reached over ssh: give hosts too (on this "
                             "node alone: launcher_pid or pids)")
        if self.slurm_job_id and not re.fullmatch(r"[0-9]+(_[0-9]+)?", self.slurm_job_id):
            raise ValueError(f"slurm_job_id {self.slurm_job_id!r} is not a SLURM job id: digits, or digits_digits for "
                             "an array task (4242, 4242_7)")
        given = [n for n, v in (("slurm_job_id", self.slurm_job_id), ("hosts", self.hosts),
                                ("launcher_pid", self.launcher_pid), ("pids", self.pids)) if v]
        if len(given) != 1:
            raise ValueError("give exactly one of slurm_job_id (a running SLURM job), hosts (with run_id or "
                             "launcher_match: a job launched over ssh), launcher_pid (torchrun's pid) or pids (ranks "
                             f"on this node); got {', '.join(given) or 'none'}")
        check_job_name(self, bool(self.hosts))
        return self


class StragglerFindResult(Result):
    stragglers: list[Straggler] = Field(default_factory=list, description=(
        "The ranks holding the others back: rank -> host -> GPU, how much, why, what next. Empty: none stands out."))
    ranks: list[RankSample] = Field(default_factory=list, description="Every rank's sampled shares and counters.")
    nodes: list[NodeSample] = Field(default_factory=list, description="Every node's CPU, memory and network signals.")
    gpus: list[GpuSample] = Field(default_factory=list, description="Every GPU seen through NVML, with serials.")
    spread_pct: float | None = Field(None, description=(
        "Relative spread of the healthy ranks' own-work shares (scaled MAD / median), %."))
    threshold_pct: float | None = Field(None, description="How far above the others' median a rank must be, %.")
    step_time_lines: list[str] = Field(default_factory=list, description=(
        "The first and last step-time lines of each log's tail: log_paths, or a SLURM job's own stdout when none "
        "are given."))
    step_time_trend: list[StepTrend] = Field(default_factory=list, description=(
        "Per log: step time over every step line of its tail, by thirds, and the step it shifted at."))
    window_s: float = Field(0.0, description="Seconds sampled (looks added up).")
    culprit_kind: CulpritKind | None = Field(None, description=CULPRIT_KIND_FIELD)
    culprit: Culprit | None = Field(None, description="What to act on for the first straggler (its `culprit`).")


def _local(spec: dict, progress) -> tuple[list[NodeReport], list[str]]:
    from .node import sample_node

    progress(0.05, f"sampling this node's ranks for {spec['window_s']:.0f} s")
    report = sample_node(spec)
    progress(0.9, f"{report.host}: {node_line(report)}")
    return [report], []


def _spec(params: StragglerFindParams, window_s: float, rate_hz: int) -> dict:
    return {"pids": params.pids, "launcher_pid": params.launcher_pid, "window_s": window_s,
            "rate_hz": rate_hz, "max_ranks": 64, "allow_other_users": params.allow_other_users,
            "run_id": params.run_id, "launcher_match": params.launcher_match}


def _sampler(params: StragglerFindParams, progress):
    """One look of `seconds` at `rate` samples/s at the target: (node reports, problems)."""
    if params.slurm_job_id:
        return lambda seconds, rate: sample_job(params.slurm_job_id, _spec(params, seconds, rate), progress)
    if params.hosts:
        return lambda seconds, rate: sample_hosts(params.hosts, _spec(params, seconds, rate), progress)
    return lambda seconds, rate: _local(_spec(params, seconds, rate), progress)


def is_step_line(line: str) -> bool:
    """Whether the line reports a step's time or rate (`step 120 | 850 ms`, `iteration 7/100 ... elapsed`,
    `Epoch: [0][82/87866]  Time 0.469`): after a step word, a digit and a time word, in either order."""
    word = STEP_WORD.search(line)
    if not word:
        return False
    digit = DIGIT.search(line, word.end())
    time_word = TIME_WORD.search(line, word.end())
    return bool(digit and time_word)


def _picked(name: str, tail: bytes) -> tuple[list[str], StepTrend | None]:
    """The first and the last three step-time lines of a log's tail (the first beside the last shows a creep the last
    three alone hide: model round 10), and the trend of all of them (step_trend.py: when it shifted, round 11)."""
    lines = [ln for ln in capped_lines(tail.decode(errors="replace"), last=True) if is_step_line(ln)]
    picked = lines[-3:] if len(lines) <= 4 else [lines[0]] + lines[-3:]
    return [f"{name}: {ln.strip()[:200]}" for ln in picked], trend(printable(name[-120:], newlines=False), lines)


def _step_lines(paths: list[str]) -> tuple[list[str], list[StepTrend]]:
    """Step-time lines (_picked) and trends of each log's tail (TAIL_WORDS), read through safe_read (a FIFO or /proc
    file is refused)."""
    lines, trends = [], []
    for raw in paths:
        path = os.path.abspath(os.path.expanduser(raw))
        try:
            tail = read_tail(path, LOG_TAIL_BYTES, field="log_paths")
        except OSError as e:
            raise ToolFailure(f"log_paths: cannot read {raw!r}: {e.strerror or e}") from None
        picked, found = _picked(os.path.basename(path), tail)
        lines += picked
        trends += [found] if found else []
    return lines, trends


def _check_inputs(params: StragglerFindParams) -> None:
    import psutil

    for pid in params.pids + ([params.launcher_pid] if params.launcher_pid else []):
        if not psutil.pid_exists(pid):
            raise ToolFailure(f"pid {pid} does not exist on this node (the job ended, or it runs elsewhere: for a "
                              "SLURM job give slurm_job_id).")
    for pid in params.pids:
        if not is_python(pid):
            command = printable(describe(pid)[0][:80], newlines=False)    # the process chose its own name
            raise ToolFailure(f"pids: {pid} ({command}) is not a Python process: py-spy reads Python ranks only; "
                              "give the training processes (`pgrep -af train.py`).")


def _job_stdout(job_id: str) -> str | None:
    """The job's stdout file as SLURM records it (`scontrol show job`'s StdOut, an absolute path once the job runs);
    None when SLURM gives none. From the launcher's records, not from anything the job printed."""
    try:
        out = slurm.run_cmd(["scontrol", "show", "job", "-o", job_id], timeout_s=20)
    except slurm.SlurmError:
        return None
    path = next((slurm.parse_kv_line(line).get("StdOut", "") for line in out.splitlines() if line.startswith("JobId=")), "")
    return path if os.path.isabs(path) else None


def _job_log_lines(job_id: str) -> tuple[list[str], list[StepTrend], str | None]:
    """(step-time lines, their trend, a sentence on where they came from) from a SLURM job's own stdout, for a caller
    who gave no log_paths: in model round 10 the agent ran slurm_job_diagnose only to learn that path. Read only when
    the file is the job's user's (SLURM's record of the job, and the descriptor read): run as root, a link the user
    put in its place must not have root quote another file. A file not readable here is said, never an error."""
    path = _job_stdout(job_id)
    if path is None:
        return [], [], None
    shown = printable(path[-200:], newlines=False)
    try:
        uid = running_job(job_id).uid
        with open_regular(path, field="the job's stdout") as f:
            st = os.fstat(f.fileno())
            if st.st_uid != uid:
                return [], [], (f"The job's stdout ({shown}) is owned by uid {st.st_uid}, not the job's user "
                                f"(uid {uid}): not read.")
            f.seek(max(0, st.st_size - LOG_TAIL_BYTES))
            lines, found = _picked(os.path.basename(path), f.read(LOG_TAIL_BYTES))
    except (OSError, ToolFailure) as e:
        return [], [], f"The job's stdout ({shown}, as SLURM records it) could not be read here: {str(e)[-200:]}"
    if not lines:
        return [], [], f"No step-time line in the last {TAIL_WORDS} of the job's stdout ({shown})."
    said = [ln.partition(": ")[2] for ln in lines]
    span = f"first in its last {TAIL_WORDS} '{said[0]}', last '{said[-1]}'" if len(said) > 1 else f"'{said[0]}'"
    return lines, [found] if found else [], f"Step times from the job's stdout ({shown}): {span}."


def run(params: StragglerFindParams, progress) -> StragglerFindResult:
    _check_inputs(params)
    lines, trends = _step_lines(params.log_paths)
    result = StragglerFindResult(step_time_lines=lines, step_time_trend=trends)
    looked = look(_sampler(params, progress), params.window_s, params.rate_hz, Rules.load(), progress)
    log_note = None
    if params.slurm_job_id and not params.log_paths:          # after the look: the job is one the caller may read
        result.step_time_lines, result.step_time_trend, log_note = _job_log_lines(params.slurm_job_id)
    reports, problems = looked.reports, looked.problems
    result.window_s = sum(looked.looks_s)
    result.ranks = sorted((r for rep in reports for r in rep.ranks),
                          key=lambda r: (r.rank if r.rank is not None else 1 << 30, r.host, r.pid))
    result.nodes = [rep.node for rep in reports]
    result.gpus = [g for rep in reports for g in rep.gpus]
    if not result.ranks:
        raise ToolFailure("no rank process found to sample: " + "; ".join(
            [e for n in result.nodes for e in n.errors] + problems)[:1200])
    _fill(result, looked.verdict, problems + [looked.sentence(params.window_s)] + ([log_note] if log_note else [])
          + [trend_sentence(t) for t in result.step_time_trend])
    progress(1.0, "done")
    return result


def _fill(result: StragglerFindResult, v: Judgement, problems: list[str]) -> None:

    result.stragglers = v.stragglers
    if v.stragglers:
        result.culprit, result.culprit_kind = v.stragglers[0].culprit, v.stragglers[0].culprit_kind
    for s in v.stragglers:
        s.next_steps = next_steps(s)
    if v.spread is not None:
        result.spread_pct = round(100 * v.spread, 1)
        result.threshold_pct = round(100 * (v.threshold or 0), 1)
    result.findings = findings(result, v) + problems
    refused = [line for n in result.nodes for line in n.refused]
    if refused:
        result.findings.append(f"{len(refused)} process(es) left out, not sampled; first: {refused[0]}")
    unsampled = [r for r in result.ranks if r.error]
    if unsampled:
        result.findings.append(f"{len(unsampled)} rank(s) not sampled; first: rank {unsampled[0].rank} on "
                               f"{unsampled[0].host}: {unsampled[0].error}")
    unsure = v.inconclusive or v.unsettled or v.spread is None or unsampled      # unsettled: a lead short of the margin
    result.verdict = "warn" if v.stragglers else ("info" if unsure else "ok")
    result.next = sorted({n for s in v.stragglers for n in next_tools(s)}) + [
        "knowledge://debugging/stragglers.md"]


SPEC = ToolSpec(
    name="straggler_find",
    summary="Names the rank that slows a RUNNING job (rank -> host -> GPU serial), how much and why, from live samples.",
    description=(
        "For a job that is running but slow ('the job got slower', 'one rank is slow', 'MFU dropped mid-run', "
        "one GPU at 0% while the others are at 100%): "
        "samples every rank's stack (py-spy, 6-60 s) and each node's CPU, cgroup, memory, network and NVML, "
        "without touching the job. The rank that waits least while the others wait in collectives, or whose "
        "host starves it, is the straggler: rank, host, GPU serial, how much the others wait on it, the reason "
        "(cpu, memory, data_loading, h2d, compute, gpu, network) with evidence, next step; or 'no straggler' with the "
        "spread. Targets: a SLURM job, hosts over ssh, a torchrun pid, pids. Needs ptrace. Not for a job that "
        "is stuck (hang_stack_dump) or dead (log_triage)."),
    Params=StragglerFindParams, Result=StragglerFindResult, run=run, runs="subprocess",
    read_only=True, destructive=False, idempotent=True, open_world=True, timeout_s=300,
)
