"""nccl-tests output that a user already has: the text table and the `-J` JSON (with `-I` per-iteration data).

Text: the table rows after the '#  size  count  type  redop  root  time algbw busbw #wrong ...' header,
with or without `-I` columns (i_min i_max i_p99 i_cv%), with mpirun's '[1,0]<stdout>:' prefix, and the
older layout without redop/root and with an `error` column; device lines '#  Rank  0 Group 0 Pid 123 on
host device 0 [0x1b] NVIDIA H100 80GB HBM3'; the 'Out of bounds values' and 'Avg bus bandwidth' lines.
JSON: the schema nccl-tests' src/util.cu writes (version 3): results[] with out_of_place / in_place
{time, alg_bw, bus_bw, nwrong} and *_per_iter {times_us, per_process_max_times_us}.
Pure parsing: no file is executed, nothing in the text is acted on. The text may be anyone's: a figure
that is not a finite number (`inf`, `nan`, `-`, `1²`, 5,000 digits) or a JSON field of the wrong type
makes its row skipped and counted (`skipped_rows`), never a crash and never a judged figure.
"""

import json
import math
import re
import statistics

from ..engine.spec import Field, Record
from .logscan import MAX_MATCH_CHARS

PREFIX = re.compile(r"^\[\d+,\d+\]<std(?:out|err)>:")
DEVICE = re.compile(r"#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)\s+\[[^\]]*\]\s+(.*\S)")
OOB = re.compile(r"Out of bounds values\s*:\s*(\d+)\s+(OK|FAILED)")
DTYPE = re.compile(r"[a-z][a-z0-9_]*")
AVG = re.compile(r"Avg bus bandwidth\s*:\s*([0-9.eE+-]+)")


class NcclTestsRow(Record):
    size: int = Field(description="Message size, bytes.")
    placement: str = Field(description="out_of_place | in_place.")
    time_us: float = Field(description="Time per call, µs.")
    algbw_gbps: float = Field(description="algbw, GB/s.")
    busbw_gbps: float = Field(description="busbw, GB/s.")
    wrong: float | None = Field(None, description="#wrong elements (None: not checked, 'N/A').")


class NcclTestsRun(Record):
    fmt: str = Field(description="text | json.")
    op: str | None = Field(None, description="Collective, when the output names it.")
    rows: list[NcclTestsRow] = Field(default_factory=list)
    gpus: list[str] = Field(default_factory=list, description="GPU names from the device lines.")
    hosts: list[str] = Field(default_factory=list, description="Host names from the device lines.")
    ranks: int | None = Field(None, description="Ranks (device lines).")
    out_of_bounds: int | None = Field(None, description="'Out of bounds values' count.")
    avg_busbw_gbps: float | None = Field(None, description="'Avg bus bandwidth' line, GB/s.")
    process_times_us: dict[str, list[list[float]]] = Field(default_factory=dict, description=(
        "JSON -I: per size/placement key, per-process max times per iteration, µs."))
    skipped_rows: int = Field(0, description="Rows or entries skipped: a figure not a finite number, a field of the "
                              "wrong type.")


SIZE_TOKEN = re.compile(r"[0-9]{1,20}")   # ASCII digits only: str.isdigit() takes '²', which int() refuses


def _num(tok) -> float | None:
    """A finite number from a token or a JSON value; None for anything else (inf and nan included: a
    busbw of inf must never pass a threshold)."""
    if isinstance(tok, bool) or not isinstance(tok, (int, float, str)) or (isinstance(tok, str) and len(tok) > 40):
        return None
    try:
        value = float(tok)
    except (ValueError, OverflowError):
        return None
    return value if math.isfinite(value) else None


def _size(tok) -> int | None:
    if isinstance(tok, int) and not isinstance(tok, bool) and 0 <= tok < 1 << 64:
        return tok
    return int(tok) if isinstance(tok, str) and SIZE_TOKEN.fullmatch(tok) else None


def _header_layout(tokens: list[str]) -> tuple[int, int, bool] | None:
    """(index of the first placement's 'time' column, columns per placement, whether the fourth column
    counts wrong elements) from a header line. Layouts before the #wrong column printed a max `error`."""
    if "size" not in tokens or "busbw" not in tokens:
        return None
    lead = tokens.index("time") if "time" in tokens else tokens.index("cputime")
    second = [i for i, t in enumerate(tokens) if t in ("time", "cputime")]
    per = (second[1] - second[0]) if len(second) > 1 else len(tokens) - lead
    return lead, per, "#wrong" in tokens


def parse_text(text: str) -> NcclTestsRun | None:
    """The table of one nccl-tests run in `text`, or None when there is none."""
    run = NcclTestsRun(fmt="text")
    layout = None
    for raw in text.splitlines():
        line = PREFIX.sub("", raw[:MAX_MATCH_CHARS]).rstrip()
        if m := DEVICE.search(line):
            run.gpus.append(m.group(5)); run.hosts.append(m.group(3))
            continue
        if m := OOB.search(line):
            run.out_of_bounds = int(m.group(1)); continue
        if m := AVG.search(line):
            run.avg_busbw_gbps = _num(m.group(1)); continue
        body = line.strip()
        tokens = (body[1:] if body.startswith("#") else body).split()
        if body.startswith("#") or (tokens and not SIZE_TOKEN.fullmatch(tokens[0])):
            layout = _header_layout(tokens) or layout
            continue
        rows = _row(tokens, layout)
        run.rows += [r for r in rows if r is not None]
        run.skipped_rows += rows.count(None)
    run.ranks = len(run.gpus) or None
    run.hosts = list(dict.fromkeys(run.hosts))
    return run if run.rows or run.skipped_rows else None


def _row(tokens: list[str], layout: tuple[int, int, bool] | None) -> list[NcclTestsRow | None]:
    """The row's placements; None for a placement whose figures are not finite numbers."""
    # a data row: size, count, then a datatype name (float, half, bfloat16, int8 ...)
    if (len(tokens) < 6 or not SIZE_TOKEN.fullmatch(tokens[0]) or not SIZE_TOKEN.fullmatch(tokens[1])
            or not DTYPE.fullmatch(tokens[2])):
        return []
    start, per, counts_wrong = layout or (_guess_start(tokens), 4, True)
    out = []
    for placement, at in (("out_of_place", start), ("in_place", start + per)):
        vals = tokens[at:at + 4]
        nums = [_num(v) for v in vals[:3]]
        if len(vals) < 3:
            continue
        if None in nums:
            out.append(None)
            continue
        wrong = _num(vals[3]) if len(vals) > 3 and counts_wrong else None
        out.append(NcclTestsRow(size=int(tokens[0]), placement=placement, time_us=nums[0], algbw_gbps=nums[1],
                                busbw_gbps=nums[2], wrong=wrong))
    return out


def _guess_start(tokens: list[str]) -> int:
    """Rows without a header in view: the first numeric column after the type (and redop/root) columns."""
    i = 2
    while i < len(tokens) and _num(tokens[i]) is None:
        i += 1
    if i == 4 and re.fullmatch(r"-?\d+", tokens[i]):
        i += 1   # after type and redop comes the integer root column
    return i


def parse_json(text: str) -> NcclTestsRun | None:
    """A `-J` file; None when `text` is not nccl-tests JSON (another tool's results.json included)."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list) or not isinstance(doc.get("config"), dict):
        return None
    run = NcclTestsRun(fmt="json")
    devices = _dicts(doc["config"].get("devices"))
    run.gpus = [str(d.get("device_info", ""))[:200] for d in devices]
    run.hosts = list(dict.fromkeys(str(d.get("hostname", ""))[:200] for d in devices))
    run.ranks = len(devices) or None
    for r in doc["results"]:
        if not isinstance(r, dict):
            run.skipped_rows += 1
            continue
        name = r.get("experiment_name")
        run.op = run.op or (_snake(name) if isinstance(name, str) else None)
        for placement in ("out_of_place", "in_place"):
            _json_placement(run, r, placement)
    oob, avg = doc.get("out_of_bounds"), doc.get("average_bus_bandwidth")
    count = _num(oob.get("count")) if isinstance(oob, dict) else None
    run.out_of_bounds = int(count) if count is not None else None
    run.avg_busbw_gbps = _num(avg.get("bandwidth")) if isinstance(avg, dict) else None
    return run


def _json_placement(run: NcclTestsRun, r: dict, placement: str) -> None:
    m, size = r.get(placement), _size(r.get("size"))
    if isinstance(m, dict) and m.get("bus_bw") is not None:
        figures = [_num(m.get("time", 0)), _num(m.get("alg_bw")), _num(m.get("bus_bw"))]
        if size is None or None in figures:
            run.skipped_rows += 1
        else:   # nwrong not a number: not checked, as 'N/A' in the text table
            run.rows.append(NcclTestsRow(size=size, placement=placement, time_us=figures[0], algbw_gbps=figures[1],
                                         busbw_gbps=figures[2], wrong=_num(m.get("nwrong"))))
    per = r.get(f"{placement}_per_iter")
    times = per.get("per_process_max_times_us") if isinstance(per, dict) else None
    if times and size is not None:
        clean = _times(times)
        if clean is None:
            run.skipped_rows += 1
        else:
            run.process_times_us[f"{size}:{placement}"] = clean


def _times(value) -> list[list[float]] | None:
    """Per-process lists of finite numbers, or None when the value has any other shape."""
    if not isinstance(value, list) or not all(isinstance(t, list) for t in value):
        return None
    out = [[_num(x) for x in t] for t in value]
    return None if any(x is None for t in out for x in t) else out


def _dicts(value) -> list[dict]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _snake(name: str) -> str | None:
    """'AllReduce' -> 'all_reduce' (nccl-tests' experiment names against the op names the tables use)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower() or None


def stragglers(times: list[list[float]], threshold: float = 0.10) -> list[tuple[int, float, float]]:
    """(process, its mean time, the median of all processes' means) for processes off the median by more
    than `threshold` (fraction). In a collective every process waits for the slowest, so a process whose
    GPU or link is slow shows longer times, and one that enqueues late can show shorter ones."""
    means = [statistics.fmean(t) for t in times if t]
    if len(means) < 2:
        return []
    mid = statistics.median(means)
    return [(i, m, mid) for i, m in enumerate(means) if mid > 0 and abs(m - mid) / mid > threshold]
