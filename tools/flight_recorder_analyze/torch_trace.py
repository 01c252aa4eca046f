"""PyTorch's own flight-recorder analyser as a second opinion (private to flight_recorder_analyze).

fr_trace cannot read the dumps gloo writes (their pg_config has a single '' key), so it is fed
pickled copies with the process groups we reconstructed.
"""

import importlib.util
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

from .dumps import RankDump
from ..shared.flight_recorder import load_dump


def _pg_config_usable(raw: dict) -> bool:
    cfg = raw.get("pg_config") or {}
    return bool(cfg) and "" not in cfg and all(
        isinstance(v, dict) and str(v.get("ranks", "")) not in ("", "[]") for v in cfg.values())


def torch_analyser(dumps: dict[int, RankDump], groups: list, timeout_s: float = 120) -> list[str]:
    """Run torch.distributed.flight_recorder.fr_trace on pickled copies of the dumps; its findings as lines.
    `groups` are GroupReports (name, desc, ranks) from the analysis."""
    if importlib.util.find_spec("torch") is None:
        return ["PyTorch's analyser was not run: torch is not installed in this Python."]
    config = {g.name: {"name": g.name, "desc": g.desc, "ranks": str(sorted(g.ranks))} for g in groups}
    with tempfile.TemporaryDirectory(prefix="mleng-fr-") as tmp:
        for rank, d in dumps.items():
            raw = load_dump(Path(d.path))
            if not _pg_config_usable(raw):
                raw["pg_config"] = config       # gloo writes one '' key, which fr_trace cannot read
            raw.setdefault("entries", [])
            for e in raw["entries"]:
                e["process_group"] = tuple(e.get("process_group") or ())
                e.setdefault("frames", [])
            (Path(tmp) / f"fr_{rank}").write_bytes(pickle.dumps(raw))
        cmd = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", tmp, "-p", "fr_",
               "--allow-incomplete-ranks"]
        try:
            proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return [f"PyTorch's analyser gave no answer in {timeout_s:.0f} s."]
    lines = [ln.rstrip() for ln in (proc.stdout + "\n" + proc.stderr).splitlines()
             if ln.strip() and "tabulate is not installed" not in ln]
    if proc.returncode != 0:
        return [f"PyTorch's analyser failed (exit {proc.returncode}):"] + lines[-15:]
    return lines[:40] or ["PyTorch's analyser printed no error for these dumps."]
