"""Accelerator records from knowledge/data/accelerators.toml, found by the names people and NVML use.

Used by accelerator_specs and by every tool that judges a measurement against a datasheet figure.
"""

import re

from ..engine.data import load_data

def _norm(name: str) -> str:
    """Lowercase, vendor words dropped, separators unified: 'NVIDIA H100-SXM5-80GB' -> 'h100 sxm5 80gb'."""
    s = name.lower()
    s = re.sub(r"\b(nvidia|amd|instinct|intel|habana|geforce|tesla)\b", " ", s)
    s = re.sub(r"[^a-z0-9.]+", " ", s)
    return " ".join(s.split())


def accelerators() -> list[dict]:
    return load_data("accelerators").get("accelerator", [])


def match_accelerator(name: str) -> dict | None:
    """The record for a name as people or NVML write it ('h100', 'NVIDIA H100 80GB HBM3'), else None.

    Exact id/alias first, then the longest alias contained in the name as whole words (so
    'H100-SXM5-80GB' finds the SXM record, not PCIe), then a unique record whose id's tokens all appear.
    """
    want = _norm(name)
    if not want:
        return None
    records = accelerators()
    for rec in records:
        if want in {_norm(rec["id"]), _norm(rec["name"]), *(_norm(a) for a in rec.get("aliases", []))}:
            return rec
    best, best_len = None, 0
    padded = f" {want} "
    for rec in records:
        for alias in [rec["id"], rec["name"], *rec.get("aliases", [])]:
            a = _norm(alias)
            if a and f" {a} " in padded and len(a) > best_len:
                best, best_len = rec, len(a)
    if best:
        return best
    tokens = set(want.split())
    hits = [r for r in records if set(_norm(r["id"]).split()) <= tokens]
    return hits[0] if len(hits) == 1 else None
