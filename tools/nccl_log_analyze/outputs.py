"""nccl_log_analyze's reading of nccl-tests output and NCCL RAS reports found in the input: busbw against the
expected figure for the hardware, wrong elements, per-process stragglers, and who RAS says is missing or behind.
"""

from collections.abc import Iterable

from ..engine.spec import worst
from ..shared import nccl_ras, nccl_tests
from ..shared.accelerators import match_accelerator
from ..shared.expected_busbw import expected_busbw

BIG_BYTES = 1 << 30          # peak busbw is judged at >= 1 GiB, where the figures in interconnects.toml apply
STRAGGLER_SHARE = 0.10       # a process whose mean iteration time is 10% off the median


def find_run(text: str) -> nccl_tests.NcclTestsRun | None:
    return nccl_tests.parse_json(text) if text.lstrip().startswith("{") else nccl_tests.parse_text(text)


def judge_run(run: nccl_tests.NcclTestsRun, op: str = "all_reduce") -> tuple[str, list[str], list[str]]:
    """(verdict, findings, problem ids) for one nccl-tests run."""
    findings, verdict, problems = [], "info", []
    wrong = [r for r in run.rows if r.wrong]
    if wrong or (run.out_of_bounds or 0) > 0:
        sizes = sorted({r.size for r in wrong})
        what = (f"{int(sum(r.wrong for r in wrong))} wrong element(s) at {len(sizes)} size(s) (first {sizes[0]} B)"
                if wrong else f"'Out of bounds values : {run.out_of_bounds} FAILED'")
        findings.append(f"nccl-tests: {what}: the data arrived corrupted; do not trust this set of GPUs until "
                        "gpu_health (ECC, NVLink/PCIe errors) and a rerun are clean.")
        verdict = "fail"
        problems.append("nccl_tests_wrong")
    if run.skipped_rows:
        findings.append(f"nccl-tests: {run.skipped_rows} row(s) skipped: a figure that is not a finite number "
                        "(inf, nan, '-') or an entry of the wrong shape; judged on the rows that are numbers.")
    peak = max((r for r in run.rows), key=lambda r: r.busbw_gbps, default=None)
    if peak is None:
        return verdict, findings, problems
    if run.ranks == 1:
        return verdict, findings + ["nccl-tests ran on one rank: busbw is 0 by definition (nothing crosses a "
                                    "link); run it on every GPU (-g 8, or one process per GPU)."], problems
    record, why = _expected(run, op)
    text = f"nccl-tests peak busbw {peak.busbw_gbps:.1f} GB/s at {peak.size} B ({peak.placement})"
    if record and peak.size >= BIG_BYTES:
        ratio = peak.busbw_gbps / record["busbw_gbps"]
        v = "ok" if ratio >= 0.85 else "warn" if ratio >= 0.6 else "fail"
        verdict = worst([verdict, v])
        problems += ["nccl_tests_low_busbw"] if v != "ok" else []
        findings.append(f"{text}: {ratio:.0%} of the {record['busbw_gbps']:g} GB/s a healthy {record['id']} reaches.")
    elif record:
        findings.append(f"{text}: the largest size is below 1 GiB, too small to judge against the "
                        f"{record['busbw_gbps']:g} GB/s expected ({record['id']}); rerun with -e 8G.")
    else:
        findings.append(f"{text}; no expected figure: {why}.")
    if run.avg_busbw_gbps is not None and peak.busbw_gbps > 2 * max(run.avg_busbw_gbps, 1e-9):
        findings.append(f"'Avg bus bandwidth {run.avg_busbw_gbps:g}' averages every size, small ones included: "
                        "compare the large-size busbw, not the average.")
    slow = _straggler_findings(run)
    if slow:
        verdict, problems = worst([verdict, "warn"]), problems + ["nccl_tests_straggler"]
    return verdict, findings + slow, problems


def _expected(run: nccl_tests.NcclTestsRun, op: str) -> tuple[dict | None, str]:
    if not run.gpus or not run.ranks:
        return None, "no device lines (the '#  Rank  0 Group  0 Pid ...' header), so the hardware is unknown"
    acc = match_accelerator(run.gpus[0])
    if acc is None:
        return None, f"{run.gpus[0]!r} is not in the accelerator table"
    hosts = max(len(run.hosts), 1)
    return expected_busbw(acc["id"], run.ranks // hosts, hosts, run.op or op)


def _straggler_findings(run: nccl_tests.NcclTestsRun) -> list[str]:
    out = []
    for key, times in run.process_times_us.items():
        slow = nccl_tests.stragglers(times, STRAGGLER_SHARE)
        if slow:
            size, placement = key.split(":")
            parts = ", ".join(f"process {p} {m:.0f} µs" for p, m, _ in slow)
            out.append(f"Per-iteration times at {size} B ({placement}): {parts} vs a median of {slow[0][2]:.0f} µs over "
                       f"{len(times)} processes: look at that process's node (gpu_health, its NICs).")
            break
    return out


def ras_findings(texts: list[str]) -> tuple[str, list[str], list[str]]:
    """(verdict, findings, problem ids) for the NCCL RAS reports in the input."""
    verdict, out, problems = "info", [], []
    for text in texts:
        if not nccl_ras.looks_like_ras(text):
            continue
        rep = nccl_ras.parse(text)
        bad = [g for g in rep.groups if g.errors != "OK"]
        if not bad:
            out.append(f"NCCL RAS ({rep.version or '?'}): every communicator RUNNING/OK. RAS sees NCCL's own state: "
                       "a rank stuck outside NCCL (data loading, a Python hang) still looks OK here; dump stacks.")
            verdict = worst([verdict, "ok"])
            continue
        verdict = "fail"
        problems += sorted({f"ras_{e.lower()}" for g in bad for e in g.errors.split(",")})
        out += [f"NCCL RAS: {p}." for p in rep.problems]
        if rep.named:
            out.append("RAS names " + "; ".join(rep.named[:8]) + ".")
    return verdict, out, problems


# What a crafted or foreign file can make a reader raise: that input becomes a note, the analysis goes on.
UNREADABLE = (ValueError, TypeError, AttributeError, KeyError, IndexError, OverflowError, RecursionError)


def read_all(texts: Iterable[str]) -> tuple[str, list[str], list[str], int]:
    """(verdict, findings, problem ids, nccl-tests runs found) for every nccl-tests output and RAS report.
    Texts are read one at a time (a generator keeps one file in memory)."""
    verdict, findings, problems, runs, unreadable = "info", [], [], 0, []
    for n, text in enumerate(texts, 1):
        try:
            run = find_run(text)
            v, f, p = judge_run(run) if run else ("info", [], [])
            rv, rf, rp = ras_findings([text])
        except UNREADABLE as exc:
            unreadable.append(f"input {n} ({type(exc).__name__})")
            continue
        runs += run is not None
        verdict, findings, problems = worst([verdict, v, rv]), findings + f + rf, problems + p + rp
    if unreadable:
        findings.append(f"Could not read {len(unreadable)} input(s) as nccl-tests output or a RAS report, skipped: "
                        + ", ".join(unreadable[:5]) + ".")
    return verdict, findings, list(dict.fromkeys(problems)), runs
