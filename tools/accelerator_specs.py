"""accelerator_specs — datasheet figures for GPUs and other accelerators, side by side.

The figures live in knowledge/data/accelerators.toml (one source of truth, each record with its
sources); this tool only lays them out; name matching is tools/shared/accelerators.py, which other tools use too.

By hand:
    mleng run accelerator_specs --names h100 mi300x b200
    mleng run accelerator_specs                # the GPUs of this machine (NVML)
    mleng run accelerator_specs --list-all
"""

from .shared.accelerators import accelerators, match_accelerator
from .engine.spec import Field, Params, Record, Result, ToolFailure, ToolSpec

DTYPES = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "fp4")


class AcceleratorSpecsParams(Params):
    names: list[str] = Field(
        default_factory=list, max_length=12,
        description=("e.g. 'h100', 'mi300x'; empty: this machine's GPUs."))
    list_all: bool = Field(False, description="List every accelerator (id and name).")


class AcceleratorRow(Record):
    id: str = Field(description="Stable id in knowledge/data/accelerators.toml.")
    name: str = Field(description="Full product name.")
    vendor: str = Field(description="nvidia | amd | intel")
    memory_gb: float | None = Field(None, description="Memory, GB (decimal, as on the datasheet).")
    memory_bandwidth_tbps: float | None = Field(None, description="Memory bandwidth, TB/s (decimal).")
    dense_tflops: dict[str, float] = Field(default_factory=dict,
                                           description="Dense (no sparsity) TFLOPS (1e12 FLOP/s) per dtype.")
    mamf_bf16_tflops: float | None = Field(None, description="Published measured max achievable bf16 matmul TFLOPS.")
    interconnect: str | None = Field(None, description="GPU-to-GPU interconnect.")
    interconnect_gbps: float | None = Field(None, description="Interconnect bandwidth per GPU and per direction, GB/s "
                                             "(datasheets print both directions added: twice this).")
    tdp_w: float | None = Field(None, description="Board power, W.")
    sources: list[str] = Field(default_factory=list, description="Where the figures come from.")
    notes: str | None = Field(None, description="Caveats (e.g. sparsity-doubled datasheet figures).")


class AcceleratorSpecsResult(Result):
    accelerators: list[AcceleratorRow] = Field(default_factory=list, description="One row per matched accelerator.")
    unmatched: list[str] = Field(default_factory=list, description="Names that matched no record.")
    ratios_vs_first: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="For each other accelerator: its figure / the first one's, per metric.")
    available: list[str] = Field(default_factory=list, description="With list_all: 'id — name' of every record.")


def _row(rec: dict) -> AcceleratorRow:
    keys = set(AcceleratorRow.model_fields)
    return AcceleratorRow(**{k: v for k, v in rec.items() if k in keys})


def _ratios(first: AcceleratorRow, other: AcceleratorRow) -> dict[str, float]:
    out = {}
    for dt in DTYPES:
        a, b = first.dense_tflops.get(dt), other.dense_tflops.get(dt)
        if a and b:
            out[f"{dt}_tflops"] = round(b / a, 2)
    for key in ("memory_gb", "memory_bandwidth_tbps", "interconnect_gbps"):
        a, b = getattr(first, key), getattr(other, key)
        if a and b:
            out[key] = round(b / a, 2)
    return out


def run(params: AcceleratorSpecsParams, progress) -> AcceleratorSpecsResult:
    records = accelerators()
    if not records:
        raise ToolFailure("knowledge/data/accelerators.toml has no [[accelerator]] records")
    if params.list_all:
        return AcceleratorSpecsResult(available=[f"{r['id']} — {r['name']}" for r in records],
                                      findings=[f"{len(records)} accelerators in the table."])
    names = params.names
    if not names:
        from .engine.store import host_provenance

        names = sorted(set(host_provenance()["gpu_names"]))
        if not names:
            return AcceleratorSpecsResult(
                findings=["No NVIDIA GPU visible through NVML on this machine; pass names=[...] to look one up."],
                next=["env_report"])
    rows, unmatched = [], []
    for name in names:
        rec = match_accelerator(name)
        if rec is None:
            unmatched.append(name)
        elif rec["id"] not in {r.id for r in rows}:
            rows.append(_row(rec))
    findings = []
    for r in rows:
        bf16 = r.dense_tflops.get("bf16")
        mamf = f", measured MAMF {r.mamf_bf16_tflops:g} ({r.mamf_bf16_tflops / bf16:.0%})" if (r.mamf_bf16_tflops and bf16) else ""
        findings.append(f"{r.name}: bf16 {bf16 or '?'} TFLOPS dense{mamf}, {r.memory_gb or '?'} GB at "
                        f"{r.memory_bandwidth_tbps or '?'} TB/s, {r.interconnect or 'no GPU interconnect'}"
                        + (f" ({r.interconnect_gbps:g} GB/s per GPU per direction, {2 * r.interconnect_gbps:g} both ways "
                           "added as datasheets print it)" if r.interconnect_gbps else "") + ".")
    if unmatched:
        findings.append(f"No record for: {', '.join(unmatched)}. Use list_all=true to see the ids.")
    ratios = {r.id: _ratios(rows[0], r) for r in rows[1:]}
    return AcceleratorSpecsResult(
        verdict="info" if rows else "warn", accelerators=rows, unmatched=unmatched, ratios_vs_first=ratios,
        findings=findings, next=["matmul_bench", "knowledge://compute/accelerators.md",
                                 "knowledge://compute/theoretical-vs-achievable.md"])


SPEC = ToolSpec(
    name="accelerator_specs",
    summary="Datasheet TFLOPS per dtype, memory, bandwidth and interconnect of accelerators; compare them.",
    description=(
        "Datasheet figures of GPUs and accelerators: dense TFLOPS per dtype (fp64 to fp4), memory size and "
        "bandwidth, interconnect (NVLink), published max achievable matmul TFLOPS; several side by side with "
        "ratios ('H100 vs H200 vs MI300X', 'how many TFLOPS does a B200 have'). No names: this machine's "
        "GPUs. Instant. Divide by the dense peak (H100 bf16 989), not the sparse one. Not a measurement "
        "(matmul_bench) nor cost (upgrade_roi)."),
    Params=AcceleratorSpecsParams, Result=AcceleratorSpecsResult, run=run, store=False,
    doctor=lambda ctx: {} if ctx["gpu_count"] else None, doctor_order=20,
)

if __name__ == "__main__":
    from .engine.cli import tool_main

    tool_main(SPEC)
