"""One node's sampler: every rank's stacks, CPU and cgroup counters, the host's pressure, NVML, for a window.

Run by straggler_find in its own child (pids or a launcher on this node), or on every node of a SLURM
job through `srun --overlap` (on every host of a job launched over ssh: ssh_job.py) as `python -m <package>.straggler_find.node '<json>'`, which prints one
JSON line (a NodeReport). One `py-spy record` per rank samples its main thread at `rate_hz` for the
window; nothing else touches the ranks.

What the sampling costs, and why it is set so (figures: docs/benchmarks.md, straggler_find): a py-spy
sample of a torch rank costs ~1 ms of CPU, almost all of it per sample (starting py-spy is ~20 ms), and
in py-spy's default mode the rank is stopped for that millisecond. So samples are read with
`--nonblocking` (the rank is never stopped: a read that races the rank is dropped or, rarely, a torn
stack, noise far below the verdict's 30% margin), at 5 Hz by default (100 samples a rank in 20 s:
enough for shares judged at a 30% margin). py-spy is NOT niced: it shares the rank's CPU cgroup (the
job's, under srun), and at nice 10 inside a cgroup capped at 5% of a CPU it read a biased picture: the
starved rank was named for data loading instead of CPU (namespace cluster, 2026-12-01; at nice 0, CPU).
"""

import json
import os
import re
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from ..shared.cgroup_cpu import cpu_limit
from ..shared.process_origin import limit_words
from .probes import RunnableWatch, mem_available_fraction, psi_some_avg10, read, snapshot_node, snapshot_rank
from .classify import CLASSES, stack_class
from .flight import read_rank
from .gpus import GpuWatch
from .models import NodeReport, NodeSample, RankSample
from ..shared import nccl_ras
from ..shared.process_targets import TargetRequest, cpu_seconds, describe, roles, select
from ..shared.pyspy import explain_py_spy_error, library_file, py_spy_path

FRAME = re.compile(r"^(.*) \(([^()]*?)(?::(\d+))?\)$")   # no parens in the file part: linear on " ( ( (" lines
THREAD = re.compile(r"^thread \((\d+)\)")


def parse_raw(text: str, pid: int) -> Counter:
    """Counts of main-thread stacks from `py-spy record --format raw --threads` (root first in the file)."""
    stacks: Counter = Counter()
    for line in text.splitlines():
        body, _, count = line.rpartition(" ")
        parts = body.split(";")
        m = THREAD.match(parts[0]) if parts else None
        if not m or int(m.group(1)) != pid or not count.isdigit():
            continue
        frames = tuple(reversed(parts[1:]))                 # innermost first, as hang_stack_dump shows them
        stacks[frames] += int(count)
    return stacks


def _split(frame: str) -> tuple[str, str]:
    m = FRAME.match(frame)
    return (m.group(1), m.group(2)) if m else (frame, "")


def summarise(stacks: Counter) -> tuple[int, dict[str, float], dict[str, str]]:
    """(samples, share per class, the most common user frame per class)."""
    total = sum(stacks.values())
    per_class: Counter = Counter()
    where: dict[str, Counter] = {c: Counter() for c in CLASSES}
    for frames, n in stacks.items():
        split = [_split(f) for f in frames]
        cls = stack_class(split)
        per_class[cls] += n
        user = next((f for f, (_, path) in zip(frames, split) if path and not library_file(path)), frames[0] if frames else "")
        where[cls][user] += n
    fractions = {c: round(per_class[c] / total, 3) for c in CLASSES} if total else {}
    top = {c: w.most_common(1)[0][0] for c, w in where.items() if w}
    return total, fractions, top


PARTS = 3      # the window is sampled in consecutive thirds: a straggler must stand out in each (judge.py)


def record_part(pid: int, seconds: int, rate_hz: int, out: Path) -> tuple[Counter | None, str]:
    """One consecutive stretch of samples of one rank; (stacks, error)."""
    cmd = [py_spy_path(), "record", "--pid", str(pid), "--rate", str(rate_hz), "--duration", str(seconds),
        "--format", "raw", "--output", str(out), "--threads", "--idle", "--full-filenames", "--nonblocking"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 30,
                              env=dict(os.environ, RUST_BACKTRACE="0"))
    except subprocess.TimeoutExpired:
        return None, f"py-spy did not finish sampling pid {pid} within {seconds + 30} s"
    if proc.returncode != 0 or not out.exists():
        return None, explain_py_spy_error(pid, proc.stderr or proc.stdout, describe(pid)[0])
    return parse_raw(out.read_text(errors="replace"), pid), ""


def record(pid: int, window_s: float, rate_hz: int, tmp: str) -> tuple[list[Counter] | None, str, list[float]]:
    """Sample one rank's stacks for the window, in PARTS consecutive stretches; (stacks per part, error, CPU
    seconds it used per second in each part)."""
    seconds = max(1, round(window_s / PARTS))
    parts, cpu = [], []
    for i in range(PARTS):
        t0, cpu0 = time.monotonic(), cpu_seconds(pid)
        stacks, error = record_part(pid, seconds, rate_hz, Path(tmp) / f"{pid}.{i}.raw")
        if stacks is None:       # a rank that ended mid-window keeps what it gave
            return (parts or None), error if not parts else "", cpu
        parts.append(stacks)
        cpu1 = cpu_seconds(pid)
        if cpu0 is not None and cpu1 is not None:
            cpu.append(round((cpu1 - cpu0) / max(time.monotonic() - t0, 1e-3), 3))
    return parts, "", cpu if len(cpu) == len(parts) else []


def find_ranks(spec: dict) -> tuple[list[int], list[str]]:
    """The job's rank processes on this node (not their launchers or dataloader workers), and the processes
    left out with why (a claim the kernel does not back, another user's process)."""
    targets = select(TargetRequest(pids=list(spec.get("pids") or []), launcher_pid=spec.get("launcher_pid"),
                                   job_id=str(spec.get("job_id") or ""), job_uid=spec.get("job_uid"),
                                   run_id=str(spec.get("run_id") or ""),
                                   launcher_match=str(spec.get("launcher_match") or ""),
                                   allow_other_users=bool(spec.get("allow_other_users"))))
    info = {p: describe(p) for p in targets.pids}
    role = roles(info, {p: i[1] for p, i in info.items()}, {p: i[2] for p, i in info.items()})
    ranks = [p for p in targets.pids if role[p] in ("rank", "other")]
    return ranks[: int(spec.get("max_ranks", 64))], targets.refused


def _fraction(after, before, window_s: float) -> float | None:
    return round((after - before) / window_s, 3) if after is not None and before is not None else None


def _rank_sample(pid: int, host: str, before: dict, after: dict, window_s: float, stacks, error: str,
                 part_cpu: list[float] = ()) -> RankSample:
    _, _, rank, local_rank = describe(pid)
    row = RankSample(rank=rank, local_rank=local_rank, host=host, pid=pid, error=error, cgroup=after["cgroup"])
    row.cpu_fraction = _fraction(after["cpu_s"], before["cpu_s"], window_s)
    row.runqueue_wait_fraction = _fraction(after["runq_s"], before["runq_s"], window_s)
    if before["throttle"] and after["throttle"]:
        periods = after["throttle"][0] - before["throttle"][0]
        if periods > 0:
            row.cgroup_throttled_fraction = round((after["throttle"][1] - before["throttle"][1]) / periods, 3)
    if stacks is not None:
        row.samples, row.fractions, row.top_frames = summarise(sum(stacks, Counter()))
        row.part_fractions = [summarise(part)[1] for part in stacks]
        row.part_samples = [sum(part.values()) for part in stacks]
        row.part_cpu = list(part_cpu)
        if not row.samples:
            row.error = f"py-spy read no sample of pid {pid}'s main thread (it exited, or it is not a Python rank)"
    return row


def _node_sample(host: str, before: dict, after: dict, window_s: float, node: NodeSample) -> NodeSample:
    node.host, node.cpus = host, os.cpu_count() or 0
    if before["cpu"] and after["cpu"]:
        delta = [a - b for a, b in zip(after["cpu"], before["cpu"])]
        total = sum(delta[:8]) or 1
        node.steal_fraction = round(delta[7] / total, 3) if len(delta) > 7 else None
    load = (read("/proc/loadavg") or "").split()
    node.load_per_cpu = round(float(load[0]) / max(1, node.cpus), 2) if load else None
    node.psi_cpu_some_pct = psi_some_avg10("cpu")
    node.psi_memory_some_pct = psi_some_avg10("memory")
    node.mem_available_fraction = mem_available_fraction()
    if before["retrans"] is not None and after["retrans"] is not None:
        node.tcp_retrans_per_s = round((after["retrans"] - before["retrans"]) / window_s, 2)
    if before["tx"] is not None and after["tx"] is not None:
        node.tx_mb_s = round((after["tx"] - before["tx"]) / window_s / 1e6, 3)
    for key, (kind, drops, over) in after["qdisc"].items():
        d0, o0 = before["qdisc"].get(key, (kind, 0, 0))[1:]
        if over - o0 or drops - d0:
            node.shaped_links.append(f"{key.split(':')[0]}: {kind}, {over - o0} overlimits, {drops - d0} drops in "
                                     f"{window_s:.0f} s")
    return node


def _ncclras() -> list[str]:
    """What NCCL's RAS client says on this node, when NCCL runs here with RAS on (NCCL >= 2.24)."""
    import shutil

    exe = shutil.which("ncclras")
    if not exe:
        return []
    try:
        text = subprocess.run([exe], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ["ncclras gave no answer in 10 s"]
    if not nccl_ras.looks_like_ras(text):
        return []
    report = nccl_ras.parse(text)
    return (report.problems + [f"RAS names {n}" for n in report.named])[:20] or ["NCCL RAS: every communicator OK"]


def _sampler_cpu_s() -> float:
    """CPU seconds this process and its finished children (py-spy) used so far."""
    used = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in used)


def sample_node(spec: dict, progress=None) -> NodeReport:
    """Sample this node's ranks for spec['window_s'] seconds."""
    host = socket.gethostname()
    window_s, rate_hz = float(spec.get("window_s", 20)), int(spec.get("rate_hz", 5))
    pids, refused = find_ranks(spec)
    report = NodeReport(host=host)
    cpu_before = _sampler_cpu_s()
    report.node.refused = refused[:20]
    node_before = snapshot_node()
    rank_before = {p: snapshot_rank(p) for p in pids}
    results: dict[int, tuple] = {}
    with (tempfile.TemporaryDirectory(prefix="mleng-straggler-") as tmp, GpuWatch(host, interval_s=0.5) as gpus,
          RunnableWatch(pids, interval_s=max(2.0, window_s / 6)) as runnable):
        threads = [threading.Thread(target=lambda p=p: results.__setitem__(p, record(p, window_s, rate_hz, tmp)))
                   for p in pids]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = max(time.monotonic() - t0, 1e-3)
    node_after = snapshot_node()
    for p in pids:
        after = snapshot_rank(p)
        stacks, error, part_cpu = results.get(p, (None, "not sampled", []))
        row = _rank_sample(p, host, rank_before[p], after, min(elapsed, window_s + 5), stacks, error, part_cpu)
        row.cpus, row.others_runnable = runnable.cpus(p), runnable.others_runnable(p)
        row.competitors, row.job_runnable = runnable.competitors(p), runnable.job_runnable(p)
        limit = cpu_limit(p)
        row.cpu_limit_cpus, row.cpu_limit_at = (limit.cpus, limit_words(limit)) if limit else (None, "")
        report.ranks.append(row)
    report.node = _node_sample(host, node_before, node_after, elapsed, report.node)
    report.flight = [f for f in (read_rank(r.pid, r.rank, host) for r in report.ranks) if f]
    report.node.nccl_ras = _ncclras()
    report.node.sampler_cpu_s = round(_sampler_cpu_s() - cpu_before, 2)
    report.gpus = gpus.summary({r.pid: r for r in report.ranks})
    if not pids:
        report.node.errors.append("no process of the job found on this node" + (
            " (a process in another network namespace than this host's, as in a container with a network of its "
            "own, is not counted as this host's)" if spec.get("run_id") or spec.get("launcher_match") else ""))
    return report


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    try:
        report = sample_node(spec)
    except Exception as e:                                  # one node's failure is a row, not a lost report
        report = NodeReport(host=socket.gethostname(), node=NodeSample(host=socket.gethostname(), errors=[str(e)[:400]]))
    sys.stdout.write(report.model_dump_json() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
