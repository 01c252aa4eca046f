"""Shared SLURM plumbing for mleng tools (private: no SPEC, not a tool).

What other tools use:

    from tools import _slurm
    if _slurm.in_allocation():                      # inside salloc / sbatch / srun
        nodes = _slurm.allocation_nodes()           # ['gpu-01', 'gpu-02'] (hostlist expanded)
        cmd = _slurm.srun_torchrun_command(
            ["tools.dist_smoke_test", "--json"], nnodes=len(nodes), nproc_per_node=8,
            rdzv_port=29500)
        proc = spawn_tree(cmd, ...)                 # tools.harness.spawn_tree

`srun_torchrun_command` starts ONE torchrun per node (srun task i on node i), all meeting at a c10d
rendezvous on the first node of the allocation; `$SLURM_PROCID` is expanded by each task's own shell,
so exactly the task with SLURM_PROCID 0 hosts the rendezvous store (`is_host`; node ranks themselves
are handed out by the c10d rendezvous); `--kill-on-bad-exit=1` ends every node as soon as one fails.
Each node's output is prefixed by srun (`--label`: "0: ", "1: "...), so a caller can split the
combined stdout per node with `split_labelled_output`. From outside an allocation, pass
`job_id=` to run on the nodes of another running job (`srun --jobid=ID --overlap`).

The rest: running SLURM commands with clear errors (`run_cmd`), reading `scontrol show ... -o`
lines (`parse_kv_line`), `--json` output (`json_or_none`), exit codes, durations, the plain-words
meaning of pending reasons and job states. Pure functions are unit-tested in tests/test_slurm_unit.py.
Written against SLURM 22.05 (Debian 12); `--json` exists for sinfo/squeue from 21.08, and its
filters (-j, -u, -p) are ignored in 22.05, so callers filter client-side.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess

from ..engine.placement import inside_allocation, inside_job
# srun's own words are read by the node transport; these names stay here for the tools that import them
from ..engine.srun import SrunTasks, SrunTransport, launch_failures, srun_tasks_line, unreachable_reason  # noqa: F401

__all__ = [
    "SlurmError", "failures_as_tool_failure", "in_allocation", "allocation_nodes", "allocation_head_address", "job_allocation_env", "expand_hostlist",
    "hostlist_size", "MAX_HOSTS", "SrunTasks", "srun_tasks_line",
    "srun_torchrun_command", "rdzv_is_host", "launch_failures", "scratch_cleanup_command", "remove_tagged_scratch", "split_labelled_output", "client_configured", "run_cmd", "json_or_none", "parse_kv_line",
    "parse_exit_code", "decode_wait_status", "parse_duration_s", "format_duration",
    "explain_pending_reason", "explain_state", "signal_name",
]


class SlurmError(RuntimeError):
    """A SLURM command is missing or failed; the message says what to do. Tools turn it into
    a ToolFailure (see `failures_as_tool_failure`)."""


def failures_as_tool_failure(run):
    """Decorator for a tool's run(): a SlurmError becomes a ToolFailure with the same message."""
    import functools

    @functools.wraps(run)
    def wrapper(params, progress):
        from ..engine.spec import ToolFailure

        try:
            return run(params, progress)
        except SlurmError as e:
            raise ToolFailure(str(e)) from None
    return wrapper


# ---------------------------------------------------------------------------------------------------
# The allocation we run in

def in_allocation(env: dict | None = None) -> bool:
    """True inside a SLURM job (salloc shell, sbatch script, srun task): SLURM_JOB_ID is set."""
    env = os.environ if env is None else env
    return bool(env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID"))


MAX_HOSTS = 100_000   # names one host list may expand to (the largest fleets are ~10^4-10^5 nodes)


def _items(hostlist: str) -> list[tuple[str, list[tuple[int, int, int]], str] | str]:
    """Each comma-separated item: a plain name, or (prefix, [(lo, hi, width)...], suffix)."""
    out = []
    for item in re.findall(r"[^,\[]+(?:\[[^\]\[]*\][^,\[]*)*", hostlist):
        item = item.strip()
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", item)
        if not m:
            if item:
                out.append(item)
            continue
        prefix, ranges, suffix = m.groups()
        spans = []
        for part in ranges.split(","):
            lo, _, hi = part.strip().partition("-")
            if not lo.isdigit() or not (hi or lo).isdigit() or int(hi or lo) < int(lo):
                raise ValueError(f"bad range {part!r} in {item[:80]!r}: give lo-hi with lo <= hi, e.g. gpu-[01-16]")
            spans.append((int(lo), int(hi or lo), len(lo)))
        out.append((prefix, spans, suffix))
    return out


def hostlist_size(hostlist: str) -> int:
    """How many names `hostlist` expands to, counted without expanding it."""
    total = 0
    for item in _items(hostlist):
        if isinstance(item, str):
            total += 1
            continue
        prefix, spans, suffix = item
        tails = hostlist_size(suffix) if "[" in suffix else 1
        total += sum(hi - lo + 1 for lo, hi, _ in spans) * tails
    return total


def expand_hostlist(hostlist: str, limit: int = MAX_HOSTS) -> list[str]:
    """'gpu-[01-03,07],login1' -> ['gpu-01', 'gpu-02', 'gpu-03', 'gpu-07', 'login1'].

    Pure Python, same result as `scontrol show hostnames` for the forms SLURM prints (one bracket
    group per name, zero-padded ranges kept padded). The size is counted before anything is expanded:
    more than `limit` names, or a malformed range, raises ValueError saying so (the 14 characters
    'n[0-99999999]' once grew a sweep to 4 GB)."""
    size = hostlist_size(hostlist)
    if size > limit:
        raise ValueError(f"{hostlist[:80]!r} expands to {size} names; at most {limit} are accepted")
    names: list[str] = []
    for item in _items(hostlist):
        if isinstance(item, str):
            names.append(item)
            continue
        prefix, spans, suffix = item
        tails = expand_hostlist(suffix, limit) if "[" in suffix else [suffix]
        for lo, hi, width in spans:
            for i in range(lo, hi + 1):
                names.extend(f"{prefix}{i:0{width}d}{t}" for t in tails)
    return names


def allocation_nodes(env: dict | None = None) -> list[str]:
    """Node names of the current allocation (SLURM_JOB_NODELIST expanded), [] outside one."""
    env = os.environ if env is None else env
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    return expand_hostlist(nodelist) if nodelist else []


def job_allocation_env(job_id: str) -> dict:
    """For running inside ANOTHER job's allocation (e.g. a training job's nodes, from a login node):
    {"SLURM_JOB_ID": id, "SLURM_JOB_NODELIST": its nodes}, to pass as `env=` to the helpers here.
    srun then needs `--jobid=ID --overlap` (srun_torchrun_command adds them when given job_id)."""
    fields = parse_kv_line(run_cmd(["scontrol", "show", "job", "-o", job_id], timeout_s=10).splitlines()[0])
    if fields.get("JobState") != "RUNNING" or not fields.get("NodeList") or fields["NodeList"] == "(null)":
        raise SlurmError(f"job {job_id} is {fields.get('JobState', 'unknown')}, not RUNNING: only a running "
                         "job's nodes can be reached through srun --jobid")
    return {"SLURM_JOB_ID": job_id, "SLURM_JOB_NODELIST": fields["NodeList"]}


def allocation_head_address(env: dict | None = None) -> str:
    """Address other nodes use to reach the first node: its NodeAddr from scontrol when SLURM
    answers (node names need not resolve, e.g. several slurmd on one host), else the name."""
    nodes = allocation_nodes(env)
    if not nodes:
        raise SlurmError("not inside a SLURM allocation (SLURM_JOB_NODELIST is unset): run under "
                         "salloc/sbatch, or use launch_script to write an sbatch script")
    try:
        fields = parse_kv_line(run_cmd(["scontrol", "show", "node", "-o", nodes[0]], timeout_s=10))
        return fields.get("NodeAddr") or nodes[0]
    except SlurmError:
        return nodes[0]


# torchrun option, expanded by each node's own shell: the task with SLURM_PROCID 0 hosts the c10d store
# (without it torchrun guesses from the hostname, which is ambiguous with several nodes on one host).
RDZV_IS_HOST = "--rdzv-conf=is_host=$(( SLURM_PROCID == 0 ))"


def rdzv_is_host(node: str) -> str:
    """torchrun option, expanded by each task's shell: the task on `node` (the node whose address every
    task dials) hosts the c10d store. Not SLURM_PROCID 0: SLURM starts task 0 on the first node in ITS
    order, which for a --nodelist step need not be the node we chose (a bisect group [mln8, mln3] put
    the store on mln3 while everyone dialled mln8, hung, and a healthy node was named)."""
    if not re.fullmatch(r"[A-Za-z0-9_.\-]+", node):
        raise ValueError(f"rdzv node: {node!r} is not a SLURM node name (letters, digits, '_', '.', '-')")
    # SLURMD_NODENAME is set in every task's environment (srun(1), OUTPUT ENVIRONMENT VARIABLES)
    return f'--rdzv-conf=is_host=$([ "${{SLURMD_NODENAME:-}}" = {node} ] && echo 1 || echo 0)'


# Each task's torchrun gets a private TMPDIR, removed when the task ends (normally or on srun's SIGTERM):
# torchelastic writes a torchelastic_* folder there per run and never removes it (56 per 8-node pairwise
# run were left in the nodes' /tmp). A SIGKILLed task still leaves it (a step srun aborts, one killed after
# SLURM's KillWait): its name carries the run's tag (SCRATCH_TAG_ENV, exported by srun to the tasks) so
# one `scratch_cleanup_command` step at the end of a run removes what is left on every node. A run killed
# before that step (the server itself SIGKILLed) leaves them too: as in shared/scratch.py, the task holds an
# flock on its folder while it lives (fd 9, inherited by torchrun) and first removes this user's folders
# that nobody holds and are over a minute old (flock(1) is util-linux; without it the sweep does nothing).
SCRATCH_TAG_ENV = "MLENG_SCRATCH_TAG"
_SCRATCH = ('b="${TMPDIR:-/tmp}"; for o in "$b"/mleng-ranks-*; do '
            '[ -d "$o" ] && [ ! -L "$o" ] && [ -O "$o" ] && [ -n "$(find "$o" -maxdepth 0 -mmin +1)" ] '
            '&& flock -n "$o" rm -rf "$o" 2>/dev/null; done; '
            'd=$(mktemp -d "$b/mleng-ranks-${MLENG_SCRATCH_TAG:-run}-XXXXXX") || exit 1; '
            'exec 9<"$d"; flock 9 2>/dev/null; '
            'trap \'rm -rf "$d"\' EXIT; trap \'exit 143\' TERM INT HUP; export TMPDIR="$d"; ')


def srun_torchrun_command(module_args: list[str], nnodes: int, nproc_per_node: int,
                          rdzv_port: int = 29500, *, rdzv_host: str | None = None,
                          python: str | None = None, extra_srun: list[str] | None = None,
                          env: dict | None = None, job_id: str | None = None,
                          rdzv_node: str | None = None) -> list[str]:
    """argv for srun that starts one torchrun per node running `python -m <module_args...>`.

    `module_args` is ["tools.dist_smoke_test", "--json", ...] (module first). The rendezvous is c10d
    at `rdzv_host` (default: the first allocation node's address) : `rdzv_port`, id = the job id.
    `rdzv_node`: the SLURM name of the node at `rdzv_host`; its task hosts the store (default: the
    task with SLURM_PROCID 0, which is the first allocation node when the step spans the allocation).
    The per-node part runs under `bash -c` so `$SLURM_PROCID` expands in each task, not here, inside
    a scratch TMPDIR of its own that is removed when the task ends.
    `job_id`: run inside that (running) job's allocation instead of our own (`srun --jobid --overlap`,
    so it shares the nodes with the job's own steps).
    """
    from ..engine.processes import torchrun_command

    if not module_args:
        raise ValueError("module_args needs at least the module name")
    if nnodes < 1 or nproc_per_node < 1:
        raise ValueError("nnodes and nproc_per_node must be >= 1")
    if job_id:
        env = job_allocation_env(job_id)
        extra_srun = [f"--jobid={job_id}", "--overlap", *(extra_srun or [])]
    env = os.environ if env is None else env
    host = rdzv_host or allocation_head_address(env)
    job_id = env.get("SLURM_JOB_ID") or "mleng"
    cmd = torchrun_command(module_args[0], nproc_per_node, list(module_args[1:]), nnodes=nnodes,
                           rdzv_endpoint=f"{host}:{rdzv_port}", rdzv_id=str(job_id))
    if python:
        cmd[0] = python
    split = cmd.index("-m", 3)  # the tool's "-m module" (the first -m is torch.distributed.run)
    is_host = rdzv_is_host(rdzv_node) if rdzv_node else RDZV_IS_HOST
    per_node = _SCRATCH + shlex.join(cmd[:split]) + f" {is_host} " + shlex.join(cmd[split:])
    return SrunTransport(extra_srun or (), kill_on_bad_exit=True).argv(["bash", "-c", per_node], count=nnodes,
                                                                       label=True)


def scratch_cleanup_command(nodes: list[str], tag: str, job_id: str | None = None) -> list[str]:
    """One srun step, one task per node, that removes the scratch folders the run tagged `tag` left behind."""
    if not re.fullmatch(r"[A-Za-z0-9]{4,64}", tag):
        raise ValueError(f"tag: {tag!r} is not 4-64 letters and digits")
    placement = inside_job(job_id).srun_args if job_id else inside_allocation().srun_args
    return SrunTransport(placement, kill_on_bad_exit=None).argv(
        ["bash", "-c", f'rm -rf "${{TMPDIR:-/tmp}}"/mleng-ranks-{tag}-*'], nodes=nodes)


def remove_tagged_scratch(nodes: list[str], tag: str, *, timeout_s: float, env: dict | None = None) -> None:
    """Best effort: run scratch_cleanup_command on `nodes`. A node that does not answer within timeout_s
    keeps its own (a frozen slurmd never starts the task); no answer depends on it."""
    try:
        subprocess.run(scratch_cleanup_command(nodes, tag), capture_output=True, env=env, timeout=timeout_s,
                       check=False)
    except (OSError, subprocess.TimeoutExpired):
        pass


def split_labelled_output(text: str) -> dict[int, str]:
    """srun --label output ("0: line", " 1: line") -> {task id: its lines joined}."""
    per_task: dict[int, list[str]] = {}
    for line in text.splitlines():
        m = re.match(r"\s*(\d+): ?(.*)$", line)
        if m:
            per_task.setdefault(int(m.group(1)), []).append(m.group(2))
    return {k: "\n".join(v) for k, v in sorted(per_task.items())}


# ---------------------------------------------------------------------------------------------------
# Running SLURM commands

CONF_PLACES = ("/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf", "/usr/local/etc/slurm.conf",
               "/run/slurm/conf/slurm.conf", "/var/spool/slurmd/conf-cache/slurm.conf")


def client_configured(env: dict | None = None) -> bool:
    """SLURM client commands are here and can find a slurm.conf (SLURM_CONF, the usual paths, or the
    configless cache slurmd keeps). Cheap: no command is run. Clusters that resolve their controller
    only through DNS SRV records are missed; tools still work there when called directly."""
    env = os.environ if env is None else env
    if shutil.which("sinfo") is None:
        return False
    conf = env.get("SLURM_CONF")
    return os.path.isfile(conf) if conf else any(os.path.isfile(p) for p in CONF_PLACES)

def run_cmd(argv: list[str], timeout_s: float = 30, check: bool = True) -> str:
    """Run a SLURM client command and return stdout. Raises SlurmError with advice when the command
    is missing, cannot reach slurmctld, or (with check) exits non-zero."""
    if shutil.which(argv[0]) is None:
        raise SlurmError(f"`{argv[0]}` is not on PATH: this machine has no SLURM client. Run on a "
                         "login node of the cluster, or install slurm-client and point SLURM_CONF "
                         "at the cluster's slurm.conf")
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"`{shlex.join(argv)}` gave no answer in {timeout_s:.0f} s: slurmctld may be "
                         "overloaded or unreachable; try again, or ask the admins") from None
    if check and proc.returncode != 0:
        err = (proc.stderr or proc.stdout).strip()[-600:]
        hint = ""
        if "configuration source" in err or "slurm.conf" in err:
            hint = " (no slurm.conf found: set SLURM_CONF to the cluster's slurm.conf)"
        elif "Unable to contact slurm controller" in err or "Connection refused" in err:
            hint = " (slurmctld is not answering: is the controller up? `scontrol ping`)"
        raise SlurmError(f"`{shlex.join(argv)}` failed with exit {proc.returncode}: {err}{hint}")
    return proc.stdout


def json_or_none(argv: list[str], timeout_s: float = 30) -> dict | None:
    """Output of a `--json` SLURM command, or None when this SLURM build does not support it
    (then callers fall back to format strings)."""
    try:
        out = run_cmd([*argv, "--json"], timeout_s=timeout_s)
    except SlurmError as e:
        if "unrecognized option" in str(e) or "invalid option" in str(e) or "not configured" in str(e):
            return None
        raise
    try:
        return json.loads(out)
    except json.JSONDecodeError:
        return None


_KV_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_/:.]*)=")


def parse_kv_line(line: str) -> dict[str, str]:
    """One `scontrol show job|node|partition -o` line -> {key: value}. Values may contain spaces
    (Reason=..., OS=...): a value runs until the next ` Key=`."""
    line = line.strip()
    keys = list(_KV_KEY.finditer(line))
    fields: dict[str, str] = {}
    for i, m in enumerate(keys):
        end = keys[i + 1].start() if i + 1 < len(keys) else len(line)
        fields[m.group(1)] = line[m.end():end].strip()
    return fields


# ---------------------------------------------------------------------------------------------------
# Numbers SLURM prints

def parse_exit_code(text: str) -> tuple[int, int]:
    """'3:0' (exit code : signal) -> (3, 0)."""
    code, _, sig = (text or "0:0").partition(":")
    try:
        return int(code), int(sig or 0)
    except ValueError:
        return 0, 0


def decode_wait_status(status: int) -> tuple[int, int]:
    """squeue --json exit_code is a raw wait status: 768 -> (3, 0); 15 -> (0, 15)."""
    return (status >> 8) & 0xFF, status & 0x7F


def parse_duration_s(text: str | None) -> int | None:
    """SLURM durations -> seconds. Forms: 'M', 'M:S', 'H:M:S', 'D-H', 'D-H:M', 'D-H:M:S' (as in
    --time and in what sacct/scontrol print). UNLIMITED / Partition_Limit / N/A / '' -> None."""
    m = re.fullmatch(r"\s*(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?(?:\.\d+)?\s*", text or "")
    if not m:
        return None
    days, a, b, c = (int(x) if x else None for x in m.groups())
    if days is not None:       # D-H[:M[:S]]
        return days * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)
    if c is not None:          # H:M:S
        return a * 3600 + b * 60 + c
    if b is not None:          # M:S
        return a * 60 + b
    return a * 60              # M


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "unlimited"
    seconds = int(seconds)
    d, rest = divmod(seconds, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    return (f"{d}-" if d else "") + f"{h:02d}:{m:02d}:{s:02d}"


_SIGNALS = {1: "SIGHUP", 2: "SIGINT", 6: "SIGABRT", 7: "SIGBUS", 9: "SIGKILL", 11: "SIGSEGV",
            15: "SIGTERM", 10: "SIGUSR1", 12: "SIGUSR2"}


def signal_name(sig: int) -> str:
    return _SIGNALS.get(sig, f"signal {sig}")


# ---------------------------------------------------------------------------------------------------
# Plain words (source: https://slurm.schedmd.com/job_reason_codes.html,
# https://slurm.schedmd.com/squeue.html#SECTION_JOB-STATE-CODES)

_PENDING = {
    "Priority": "other jobs have higher priority; it starts when they have gone (check `sprio -j ID`)",
    "Resources": "it is next in line but the nodes/GPUs it asked for are busy; it starts when they free up",
    "Dependency": "it waits for another job (its --dependency) to reach the required state",
    "DependencyNeverSatisfied": "its dependency can never be met (the job it waits on failed or was "
                                "cancelled): cancel it and resubmit",
    "ReqNodeNotAvail": "a node it needs is down, drained or reserved; it waits until that node returns "
                       "(or ask for other nodes / fewer nodes)",
    "PartitionNodeLimit": "it asks for more nodes than the partition allows (or than exist): it will "
                          "never start as is; lower --nodes or pick another partition",
    "PartitionTimeLimit": "its --time is above the partition's MaxTime: lower --time",
    "PartitionDown": "the partition is down: ask the admins",
    "PartitionInactive": "the partition is inactive: ask the admins",
    "JobHeldUser": "you held it: `scontrol release ID`",
    "JobHeldAdmin": "an admin held it: ask them",
    "BeginTime": "its --begin time has not come yet",
    "Reservation": "it waits for its reservation to start",
    "Licenses": "it waits for licenses it requested",
    "BadConstraints": "its constraints (features, memory, GPU count) cannot be met by any node: fix the request",
    "InvalidQOS": "its QOS is not valid for your account: pick another --qos",
    "InvalidAccount": "its account is not valid: pick another --account",
    "NodeDown": "a node it needs is down",
    "launch_failed_requeued_held": "its launch failed, it was requeued and held: check the node, then `scontrol release ID`",
    "AssociationJobLimit": "your account has reached its job count limit",
    "AssociationResourceLimit": "your account has reached a resource limit",
    "AssociationTimeLimit": "your account's time limit is exceeded",
    "QOSJobLimit": "the QOS has reached its job count limit",
    "QOSResourceLimit": "the QOS has reached a resource limit",
    "QOSTimeLimit": "the QOS time limit is exceeded",
}


def explain_pending_reason(reason: str) -> str:
    """A pending reason code -> what it means for the user, in plain words."""
    reason = (reason or "").strip()
    if reason in _PENDING:
        return _PENDING[reason]
    low = reason.lower().replace("_", " ")
    if "required for job are down" in low or "reqnodenotavail" in low:
        return _PENDING["ReqNodeNotAvail"]
    if reason.startswith(("QOS", "Assoc")) and ("Limit" in reason or "GRES" in reason or "Max" in reason):
        who = "your QOS" if reason.startswith("QOS") else "your account (association)"
        what = "a per-user" if "PerUser" in reason else ("a group-wide" if "Grp" in reason else "a")
        return (f"{who} has reached {what} limit ({reason}); it starts when your other jobs finish, "
                "or ask for less / another QOS (`sacctmgr show qos` shows the limits)")
    if reason in ("None", ""):
        return "no reason given yet (just submitted, or the scheduler has not looked at it)"
    return f"SLURM reason code {reason} (see https://slurm.schedmd.com/job_reason_codes.html)"


_STATES = {
    "COMPLETED": "finished with exit code 0",
    "FAILED": "ended with a non-zero exit code",
    "TIMEOUT": "killed at its time limit",
    "CANCELLED": "cancelled (by a user or an admin)",
    "OUT_OF_MEMORY": "killed for using more memory than it asked for",
    "NODE_FAIL": "a node it ran on failed",
    "PREEMPTED": "preempted by a higher-priority job",
    "BOOT_FAIL": "its node failed to boot",
    "DEADLINE": "missed its --deadline",
    "PENDING": "waiting to start",
    "RUNNING": "running",
    "COMPLETING": "finishing (processes being cleaned up)",
    "SUSPENDED": "suspended",
    "REQUEUED": "requeued",
}


def explain_state(state: str) -> str:
    return _STATES.get(state.split()[0] if state else "", state or "unknown")


