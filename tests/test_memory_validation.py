"""memory_estimate against published measured peaks and published estimators
(knowledge/data/memory_validation.toml): every modelled row within 0.8-1.25 of the published figure,
no wrong fit verdict, and every setup it cannot model refused with the reason instead of a number."""

import tomllib
from pathlib import Path

import pytest

from tools.memory_estimate import MemoryParams, run

ROWS = tomllib.loads((Path(__file__).resolve().parent.parent / "knowledge" / "data" /
                      "memory_validation.toml").read_text())["row"]
BAND = (0.8, 1.25)


def estimate(setup: dict):
    return run(MemoryParams(**setup), lambda f, m: None)


def estimated_figure(row: dict, r) -> float:
    """The estimate's counterpart of the published figure."""
    if row["kind"] == "peak_reserved":
        return r.torch_reserved_gib
    if row["kind"] == "peak_allocated":
        return r.torch_allocated_gib
    if row["kind"] == "model_states":
        return r.model_states_gib
    if row["kind"] == "host_ram":
        return r.host_ram_per_node_gib
    if row["kind"] == "kv_tokens":
        return row["kv_memory_gib"] * 2**30 / r.kv_cache_bytes_per_token
    raise AssertionError(f"unknown kind {row['kind']}")


@pytest.mark.parametrize("row", [r for r in ROWS if r["modelled"]], ids=lambda r: r["id"])
def test_estimate_within_band_of_published_figure(row):
    r = estimate(row["setup"])
    ratio = estimated_figure(row, r) / row["measured"]
    assert BAND[0] <= ratio <= BAND[1], (row["id"], round(ratio, 3), r.findings)


@pytest.mark.parametrize("row", [r for r in ROWS if r["modelled"] and r["kind"] == "peak_reserved"],
                         ids=lambda r: r["id"])
def test_no_wrong_fit_verdict(row):
    """Each of these runs ran: the estimate must say it fits on the GPU it ran on."""
    r = estimate(row["setup"])
    assert r.fits is True, (row["id"], r.total_gib, r.capacity_gib, r.findings)
    assert r.max_micro_batch >= row["setup"].get("micro_batch", 1)


@pytest.mark.parametrize("row", [r for r in ROWS if not r["modelled"]], ids=lambda r: r["id"])
def test_unmodelled_setup_is_said_not_estimated(row):
    r = estimate(row["setup"])
    assert r.total_gib is None and r.fits is None
    assert r.not_modelled and any("not modelled" in f.lower() for f in r.findings), r.findings


def test_table_has_enough_published_rows_with_sources():
    assert len([r for r in ROWS if r["modelled"]]) >= 12
    for row in ROWS:
        assert row["source"] and row["source_path"] and row["date_read"], row["id"]
