"""knowledge/data/accelerators.toml: schema, sane ranges, and spot checks against datasheets."""
import math
import re
import tomllib
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[1] / "knowledge" / "data" / "accelerators.toml"
REQUIRED = {
    "id": str, "name": str, "vendor": str, "arch": str, "form_factor": str, "aliases": list,
    "memory_gb": (int, float), "memory_bandwidth_tbps": (int, float), "dense_tflops": dict,
    "interconnect": str, "interconnect_gbps": (int, float), "pcie": str, "tdp_w": (int, float),
    "sources": list, "notes": str,
}
DTYPES = {"fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "fp4"}
MUST_HAVE_IDS = {
    "a100-sxm", "a100-pcie", "h100-sxm", "h100-pcie", "h100-nvl", "h200", "h200-nvl", "gh200",
    "b200", "gb200", "b300", "l40s", "l4", "rtx-4090", "mi250x", "mi300x", "mi325x", "mi355x",
    "gaudi2", "gaudi3",
}
# What NVML, torch.cuda.get_device_name, rocm-smi and users type -> the record it must find.
NAMES = {
    "NVIDIA H100 80GB HBM3": "h100-sxm", "NVIDIA H200": "h200", "NVIDIA A100-SXM4-80GB": "a100-sxm",
    "NVIDIA H100 PCIe": "h100-pcie", "NVIDIA GH200 480GB": "gh200", "NVIDIA B200": "b200",
    "NVIDIA L40S": "l40s", "NVIDIA GeForce RTX 4090": "rtx-4090", "AMD Instinct MI300X": "mi300x",
    "h100": "h100-sxm", "mi300x": "mi300x", "gaudi2": "gaudi2", "NVIDIA A100 80GB PCIe": "a100-pcie",
    "NVIDIA H100 NVL": "h100-nvl", "NVIDIA H200 NVL": "h200-nvl", "NVIDIA L4": "l4",
}


@pytest.fixture(scope="module")
def records():
    with DATA.open("rb") as f:
        return tomllib.load(f)["accelerator"]


def test_required_keys_and_types(records):
    for rec in records:
        for key, typ in REQUIRED.items():
            assert key in rec, f"{rec.get('id')}: missing {key}"
            assert isinstance(rec[key], typ), f"{rec['id']}: {key} has type {type(rec[key]).__name__}"
        assert rec["vendor"] in {"nvidia", "amd", "intel"}, rec["id"]
        assert set(rec["dense_tflops"]) <= DTYPES, f"{rec['id']}: unknown dtype keys"
        assert "bf16" in rec["dense_tflops"], rec["id"]
        assert ("mamf_bf16_tflops" in rec) == ("mamf_source" in rec), rec["id"]


def test_all_required_accelerators_present(records):
    assert MUST_HAVE_IDS <= {r["id"] for r in records}


def test_ids_and_aliases_unique_and_lowercase(records):
    seen: dict[str, str] = {}
    for rec in records:
        assert re.fullmatch(r"[a-z0-9][a-z0-9-]*", rec["id"]), rec["id"]
        for key in [rec["id"], *rec["aliases"]]:
            assert key == key.lower().strip(), f"{rec['id']}: alias {key!r} not lowercase"
            assert key not in seen or seen[key] == rec["id"], f"{key!r} in {seen.get(key)} and {rec['id']}"
            seen[key] = rec["id"]


def test_ranges_are_sane(records):
    for rec in records:
        t = rec["dense_tflops"]
        assert all(v > 0 and math.isfinite(v) for v in t.values()), rec["id"]
        # lower precision never has a lower peak than higher precision
        assert t.get("fp8", t["bf16"]) >= t["bf16"] >= t.get("fp32", 0), rec["id"]
        assert t.get("fp4", t.get("fp8", 0)) >= t.get("fp8", 0), rec["id"]
        assert t["bf16"] == t.get("fp16", t["bf16"]), rec["id"]
        assert 10 <= rec["memory_gb"] <= 400, rec["id"]
        assert 0.1 <= rec["memory_bandwidth_tbps"] <= 12, rec["id"]
        assert 50 <= rec["tdp_w"] <= 1500, rec["id"]
        assert 10 <= rec["interconnect_gbps"] <= 1000, rec["id"]
        if "mamf_bf16_tflops" in rec:
            # achievable is below theory, and above half of it for every published figure
            assert 0.45 * t["bf16"] < rec["mamf_bf16_tflops"] < t["bf16"], rec["id"]


def test_sources_are_urls(records):
    for rec in records:
        assert rec["sources"], rec["id"]
        for url in rec["sources"] + ([rec["mamf_source"]] if "mamf_source" in rec else []):
            assert re.fullmatch(r"https://[^\s]+", url), f"{rec['id']}: {url!r}"


def _match(records, name: str):
    key = name.lower().strip()
    hits = [r for r in records if key == r["id"] or key in r["aliases"]]
    return hits[0]["id"] if len(hits) == 1 else None


@pytest.mark.parametrize("name,expected", sorted(NAMES.items()))
def test_reported_names_resolve(records, name, expected):
    assert _match(records, name) == expected


def test_spot_checks(records):
    by_id = {r["id"]: r for r in records}
    assert by_id["h100-sxm"]["dense_tflops"]["bf16"] == pytest.approx(989.4, abs=1)
    assert by_id["h100-sxm"]["dense_tflops"]["fp8"] == pytest.approx(1978.9, abs=1)
    assert by_id["h200"]["memory_gb"] == 141 and by_id["h200"]["memory_bandwidth_tbps"] == 4.8
    assert by_id["h200"]["interconnect_gbps"] == 450
    assert by_id["a100-sxm"]["dense_tflops"]["bf16"] == 312 and "fp8" not in by_id["a100-sxm"]["dense_tflops"]
    assert by_id["b200"]["dense_tflops"]["bf16"] == 2250 and by_id["gb200"]["dense_tflops"]["bf16"] == 2500
    assert by_id["mi300x"]["dense_tflops"]["bf16"] == pytest.approx(1307.4)
    assert by_id["mi300x"]["memory_gb"] == 192
    assert by_id["h100-sxm"]["mamf_bf16_tflops"] == 794.5


@pytest.mark.parametrize("name,expected", sorted(NAMES.items()))
def test_match_accelerator_finds_reported_names(name, expected):
    from tools.shared.accelerators import match_accelerator

    assert match_accelerator(name)["id"] == expected
