"""The results store: every tool result, with where and on what it was measured.

One SQLite file, `$MLENG_HOME/results.sqlite3` (default: the user's data directory,
~/.local/share/mleng on Linux; folder and file made and checked by home.py). SQLite because it is
embedded, safe across the server and CLI processes at once (WAL), and queryable by anyone with the
sqlite3 shell.

Provenance is collected where it is cheapest: the host, the GPUs and the driver through NVML in the
parent; torch / CUDA / NCCL versions in the child that imported torch (a parent never imports torch).
"""

import json
import os
import platform
import socket
import sqlite3
import sys
from importlib import metadata
from pathlib import Path

from .bounds import MAX_RESULT_CHARS, bound_data
from .home import mleng_home, private_dir, private_file  # noqa: F401  (mleng_home: callers' old import path)
from .redact import redact_data

SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    tool          TEXT NOT NULL,
    verdict       TEXT,
    host          TEXT,
    gpu_names     TEXT,   -- JSON list, one per GPU the run could see
    gpu_uuids     TEXT,   -- JSON list
    gpu_serials   TEXT,   -- JSON list
    driver        TEXT,
    torch         TEXT,
    cuda          TEXT,
    nccl          TEXT,
    python        TEXT,
    params        TEXT,   -- JSON of the validated Params
    params_key    TEXT,   -- canonical JSON of params without volatile fields: groups comparable runs
    result        TEXT,   -- JSON of the Result
    metric_name   TEXT,
    metric_value  REAL,
    started       REAL,   -- unix seconds
    ended         REAL,
    job_id        TEXT    -- the background job (engine/jobs.py handle) that ran it, if any
);
CREATE INDEX IF NOT EXISTS results_tool ON results(tool, params_key, started);
"""

# What a row may hold, whoever wrote it (the runner, a fleet node's event): the result as answered, the
# params far less (a 45 MB pasted log was stored whole, three times: 550 MB of database).
MAX_STORED_PARAMS_CHARS = 20_000
MAX_STORED_TEXT = 255      # host, verdict and other short columns
LATEST_TIME = 4_102_444_800.0  # 2100-01-01: a start time past it (1e18) would sort first forever

# Params that change how long or how verbosely a run goes, not what it measures.
VOLATILE_PARAMS = {"detail", "wait_s", "timeout_s", "time_budget_s", "json"}


def connect() -> sqlite3.Connection:
    home = private_dir()
    db = private_file(home / "results.sqlite3")
    for side in ("-wal", "-shm"):          # left by an older version with the umask's mode
        private_file(Path(f"{db}{side}"), create=False)   # absent, or removed as another connection closed
    conn = sqlite3.connect(db, timeout=30)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(SCHEMA)
    if conn.execute("PRAGMA user_version").fetchone()[0] < CAPPED_VERSION:
        _cap_old_rows(conn)
    return conn


CAPPED_VERSION = 1   # PRAGMA user_version from which every row is within the caps below


def _cap_old_rows(conn: sqlite3.Connection) -> None:
    """Once per database: rows stored before the caps (a 45 MB pasted log in params) are cut to them.
    Reading any column after a big one walks its overflow pages, so one such row slowed every query."""
    conn.execute("BEGIN IMMEDIATE")       # one connection caps; the others wait, then find it done
    if conn.execute("PRAGMA user_version").fetchone()[0] >= CAPPED_VERSION:
        conn.rollback()
        return
    big = [r[0] for r in conn.execute(
        "SELECT id FROM results WHERE length(params) > ? OR length(params_key) > ? OR length(result) > ?",
        (MAX_STORED_PARAMS_CHARS + 3000, MAX_STORED_PARAMS_CHARS + 3000, MAX_RESULT_CHARS + 3000))]
    for row_id in big:
        params, result = conn.execute("SELECT params, result FROM results WHERE id = ?", (row_id,)).fetchone()
        params, result = (redact_data(_bounded(_loads(text), limit, is_params)) for text, limit, is_params in
                          ((params, MAX_STORED_PARAMS_CHARS, True), (result, MAX_RESULT_CHARS, False)))
        conn.execute("UPDATE results SET params = ?, params_key = ?, result = ? WHERE id = ?",
                     (json.dumps(params, default=str), params_key(params), json.dumps(result, default=str), row_id))
    conn.execute(f"PRAGMA user_version = {CAPPED_VERSION}")
    conn.commit()


def _loads(text) -> dict:
    value = _parsed(text)
    return value if isinstance(value, dict) else {"unreadable": str(text)[:1000]}


def _parsed(text):
    """JSON text as stored, or None where it is not JSON (a row written by hand or cut by an old bug)."""
    try:
        return json.loads(text) if isinstance(text, str) else None
    except (ValueError, RecursionError):
        return None


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def host_provenance() -> dict:
    """Host, python, torch (by package metadata: no import), GPUs and driver through NVML."""
    prov = {"host": socket.gethostname(), "python": platform.python_version(),
            "torch": _version("torch"), "gpu_names": [], "gpu_uuids": [], "gpu_serials": [],
            "driver": None}
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return prov
    try:
        prov["driver"] = _str(pynvml.nvmlSystemGetDriverVersion())
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            prov["gpu_names"].append(_str(pynvml.nvmlDeviceGetName(h)))
            prov["gpu_uuids"].append(_str(pynvml.nvmlDeviceGetUUID(h)))
            try:
                prov["gpu_serials"].append(_str(pynvml.nvmlDeviceGetSerial(h)))
            except pynvml.NVMLError:  # consumer cards have no serial
                prov["gpu_serials"].append(None)
    except Exception:
        pass
    finally:
        pynvml.nvmlShutdown()
    return prov


def torch_provenance() -> dict:
    """torch / CUDA / NCCL versions, only if this process already imported torch (children do)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    prov = {"torch": torch.__version__, "cuda": torch.version.cuda or getattr(torch.version, "hip", None)}
    try:
        if torch.cuda.is_available():
            v = torch.cuda.nccl.version()
            prov["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception:
        pass
    return prov


def _str(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def params_key(params: dict) -> str:
    return json.dumps({k: v for k, v in params.items() if k not in VOLATILE_PARAMS}, sort_keys=True)


def save(tool: str, params: dict, result: dict, *, started: float, ended: float, provenance: dict,
         metric_name: str | None = None, job_id: str | None = None) -> int:
    """Insert one result, its secrets redacted here for every writer (the runner, fleet_sweep's node rows);
    returns its row id."""
    metric_value = result.get(metric_name) if metric_name else None
    if not isinstance(metric_value, (int, float)) or isinstance(metric_value, bool):
        metric_value = None
    params, result = _bounded(params, MAX_STORED_PARAMS_CHARS, True), _bounded(result, MAX_RESULT_CHARS, False)
    params, result = redact_data(params), redact_data(result)   # after the cap: a 45 MB paste is not scanned whole
    with connect() as conn:
        cur = conn.execute(
            "INSERT INTO results (tool, verdict, host, gpu_names, gpu_uuids, gpu_serials, driver, torch,"
            " cuda, nccl, python, params, params_key, result, metric_name, metric_value, started, ended,"
            " job_id) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (_short(tool), _short(result.get("verdict")), _short(provenance.get("host")),
             *(json.dumps(_names(provenance.get(k))) for k in ("gpu_names", "gpu_uuids", "gpu_serials")),
             *(_short(provenance.get(k)) for k in ("driver", "torch", "cuda", "nccl", "python")),
             json.dumps(params, default=str), params_key(params), json.dumps(result, default=str, separators=(",", ":")),
             _short(metric_name), metric_value, _unix_time(started), _unix_time(ended), _short(job_id)))
        return cur.lastrowid


def _bounded(data, limit: int, is_params: bool) -> dict:
    """The row's JSON object within `limit` characters, with a note on what was cut: under `_cut` for
    params (a field of their own would change what they mean), as a finding for a result."""
    data = data if isinstance(data, dict) else {"unreadable": str(data)[:1000]}
    data, note = bound_data(data, limit, "Stored params" if is_params else "Stored result")
    if note is None:
        return data
    findings = data.get("findings") if isinstance(data.get("findings"), list) else []
    return {**data, "_cut": note} if is_params else {**data, "findings": [*findings[:50], note]}


def _names(value) -> list:
    """A GPU list as stored: at most 64 short strings (a node's event could send anything)."""
    return [_short(v) for v in value[:64]] if isinstance(value, list) else []


def _short(value) -> str | None:
    return None if value is None else str(value)[:MAX_STORED_TEXT]


def _unix_time(value) -> float | None:
    """Unix seconds, or None for anything that is not a time between 1970 and 2100."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if 0 <= value <= LATEST_TIME else None


_GOOD_TIME = f"typeof(started) IN ('integer', 'real') AND started BETWEEN 0 AND {LATEST_TIME}"

# results_history's columns, each bounded in SQL so that a row written before the caps (or by hand)
# costs its reader no more than a new one: params only for the one field it groups by.
_HISTORY_COLUMNS = ("id, substr(tool, 1, 255) AS tool, substr(host, 1, 255) AS host, started, "
                    "substr(verdict, 1, 32) AS verdict, substr(metric_name, 1, 255) AS metric_name, "
                    "CASE WHEN typeof(metric_value) IN ('integer', 'real') THEN metric_value END AS metric_value, "
                    "substr(params_key, 1, 20000) AS params_key, "
                    "CASE WHEN length(params) <= 100000 AND json_valid(params) THEN json_extract(params, '$.device') "
                    "END AS device, CASE WHEN length(gpu_names) <= 65536 THEN gpu_names END AS gpu_names, "
                    "CASE WHEN length(gpu_uuids) <= 65536 THEN gpu_uuids END AS gpu_uuids")


def history(tool: str | None = None, host: str | None = None, gpu: str | None = None, since: float = 0.0,
            limit: int = 200, offset: int = 0) -> list[dict]:
    """Rows for results_history, newest first, with bounded columns and no result: memory per row is
    a few KB whatever was stored. Rows whose start time is not a time are left out (count_bad_times)."""
    clause, args = _filters(tool, host, gpu, since)
    sql = f"SELECT {_HISTORY_COLUMNS} FROM results{clause} ORDER BY started DESC, id DESC LIMIT ? OFFSET ?"
    with connect() as conn:
        rows = [dict(r) for r in conn.execute(sql, [*args, limit, offset])]
    for r in rows:
        r["params"] = {"device": r.pop("device")}
        for k in ("gpu_names", "gpu_uuids"):
            r[k] = _json_list(r[k])
    return rows


def count_bad_times(tool: str | None = None, host: str | None = None, gpu: str | None = None) -> int:
    """Rows matching the filters whose start time is not a unix time up to 2100 (history skips them)."""
    clause, args = _filters(tool, host, gpu, None)
    clause = f"{clause} AND" if clause else " WHERE"
    with connect() as conn:
        return conn.execute(f"SELECT count(*) FROM results{clause} NOT ({_GOOD_TIME})", args).fetchone()[0]


def _json_list(text) -> list:
    value = _parsed(text)
    return value if isinstance(value, list) else []


def _filters(tool: str | None, host: str | None, gpu: str | None, since: float | None) -> tuple[str, list]:
    """WHERE clause (with its arguments) shared by query() and count()."""
    where, args = [], []
    if tool:
        where.append("tool = ?"); args.append(tool)
    if host:
        where.append("host = ?"); args.append(host)
    if gpu:
        where.append("(lower(gpu_names) LIKE ? OR lower(gpu_uuids) LIKE ? OR lower(gpu_serials) LIKE ?)")
        args += [f"%{gpu.lower()}%"] * 3
    if since is not None:    # a time stored as text or in the far future passed every filter and sorted first
        where.append(f"{_GOOD_TIME} AND started >= ?"); args.append(since)
    return (" WHERE " + " AND ".join(where) if where else ""), args


def count(tool: str | None = None, host: str | None = None, gpu: str | None = None,
          since: float | None = None) -> int:
    """How many rows match (no limit)."""
    clause, args = _filters(tool, host, gpu, since)
    with connect() as conn:
        return conn.execute("SELECT count(*) FROM results" + clause, args).fetchone()[0]


def query(tool: str | None = None, host: str | None = None, gpu: str | None = None,
          since: float | None = None, limit: int = 200) -> list[dict]:
    """Rows, newest first. `gpu` matches a substring of any GPU name, UUID or serial (case-insensitive)."""
    clause, args = _filters(tool, host, gpu, since)
    sql = "SELECT * FROM results" + clause + " ORDER BY started DESC, id DESC LIMIT ?"
    args.append(limit)
    with connect() as conn:
        rows = [dict(r) for r in conn.execute(sql, args)]
    for r in rows:
        for k in ("gpu_names", "gpu_uuids", "gpu_serials", "params", "result"):
            r[k] = json.loads(r[k]) if r[k] else None
    return rows


HEADLINE_CHARS = 300   # a listed row's first finding, cut: a listing of 500 rows stays small


def headlines(ids: list[int]) -> dict[int, str]:
    """The first finding of each stored result, at most HEADLINE_CHARS characters (bounded in SQL, so a
    big result is never read whole for a listing); ids without one are left out."""
    if not ids:
        return {}
    marks = ",".join("?" * len(ids))
    sql = (f"SELECT id, substr(json_extract(result, '$.findings[0]'), 1, {HEADLINE_CHARS}) FROM results "
           f"WHERE id IN ({marks}) AND json_valid(result)")
    with connect() as conn:
        return {row[0]: row[1] for row in conn.execute(sql, ids) if isinstance(row[1], str)}


def stored_result(result_id: int) -> dict | None:
    """One stored row with its params and result parsed (rows are bounded when saved); None without one."""
    with connect() as conn:
        row = conn.execute("SELECT * FROM results WHERE id = ?", (result_id,)).fetchone()
    if row is None:
        return None
    out = dict(row)
    for k in ("gpu_names", "gpu_uuids", "gpu_serials"):
        out[k] = _json_list(out[k])
    out["params"], out["result"] = _loads(out["params"]), _loads(out["result"])
    return out
