"""collective_bench reporting helpers: the expected busbw for the detected hardware, the verdict, the
human table and the PNG plot. Pure apart from reading knowledge data and writing the plot file.
"""

from ..engine.data import load_data
from .models import BenchRow, OpSummary


def nic_link(rate_gbits: float | None, link_layer: str | None) -> str | None:
    """interconnects.toml link id for an RDMA port's rate and link layer."""
    if not rate_gbits:
        return None
    ethernet = (link_layer or "").lower() == "ethernet"
    if rate_gbits >= 800:
        return "ib-xdr"
    if rate_gbits >= 400:
        return "roce-400" if ethernet else "ib-ndr"
    return "ib-hdr" if rate_gbits >= 200 and not ethernet else None


def expected_across_nodes(ports: list[dict], nccl_env: dict) -> tuple[dict | None, str]:
    """Per-NIC expected busbw x the active RDMA ports of the first node (Ring across nodes)."""
    active = [p for p in ports if p.get("active")]
    kinds = {nic_link(p.get("rate_gbits"), p.get("link_layer")) for p in active}
    if not active or len(kinds) != 1 or None in kinds:
        return None, ("no expected figure across nodes: no single kind of active InfiniBand/RoCE port found "
                      "on the first node (gpu_topology lists the NICs)")
    link = kinds.pop()
    rec = next((r for r in load_data("interconnects").get("expected_busbw", [])
                if r.get("link") == link and r.get("gpus") == 0), None)
    if not rec:
        return None, f"no per-NIC figure for {link}"
    note = "" if nccl_env.get("NCCL_ALGO", "").lower() == "ring" else \
        "2-node runs with Tree or NVLS can read above the fabric; set NCCL_ALGO=RING to measure the network"
    return ({"id": f"{rec['id']} x {len(active)}", "busbw_gbps": rec["busbw_gbps"] * len(active), "algo": "ring"},
            note)


def expected_busbw(accelerator_id: str | None, gpus_per_node: int, nnodes: int, op: str,
                   nccl_env: dict | None = None, rdma: list[dict] | None = None) -> tuple[dict | None, str]:
    """(interconnects.toml expected_busbw record, note) for this hardware, or (None, why not)."""
    if accelerator_id == "cpu":
        return None, "CPU ranks (gloo): no expected figure"
    if not accelerator_id:
        return None, "GPU not recognised, so no expected figure"
    env = nccl_env or {}
    if nnodes > 1:
        return expected_across_nodes(rdma or [], env)
    nvls_off = env.get("NCCL_NVLS_ENABLE") == "0" or env.get("NCCL_ALGO", "").lower() in ("ring", "tree")
    records = [r for r in load_data("interconnects").get("expected_busbw", [])
               if accelerator_id in r.get("accelerators", []) and r.get("gpus", 0) > 0]
    want_algo = "nvls" if op == "all_reduce" and not nvls_off else "ring"
    for algo in dict.fromkeys([want_algo, "ring"]):
        exact = [r for r in records if r["gpus"] == gpus_per_node and r["algo"] == algo]
        if exact:
            return exact[0], "" if algo == want_algo else "NVLS figure missing, Ring used"
    ring = sorted((r for r in records if r["algo"] == "ring"), key=lambda r: abs(r["gpus"] - gpus_per_node))
    if ring:
        return ring[0], f"approximate: figure for {ring[0]['gpus']} GPUs, ran on {gpus_per_node}"
    return None, f"no expected figure for {gpus_per_node}x {accelerator_id}"


def point_at(record: dict, size: int) -> dict | None:
    return next((p for p in record.get("points", []) if p["bytes"] == size), None)


def judge(summary: OpSummary, record: dict | None, big_enough: bool) -> tuple[str, str | None]:
    """(verdict, sentence) for one op's peak busbw against its expected figure."""
    if summary.expected_busbw_gbps is None or summary.ratio is None:
        return "info", None
    if not big_enough:
        return "info", (f"{summary.op}: largest size {summary.peak_bytes / 2**20:.0f} MiB is too small to judge "
                        f"peak busbw (expected {summary.expected_busbw_gbps:.0f} GB/s at >= 1 GiB); "
                        "raise max_bytes.")
    verdict = "ok" if summary.ratio >= 0.85 else "warn" if summary.ratio >= 0.6 else "fail"
    text = (f"{summary.op}: {summary.peak_busbw_gbps:.1f} GB/s busbw at {human_size(summary.peak_bytes)} is "
            f"{summary.ratio:.0%} of the expected {summary.expected_busbw_gbps:.0f} GB/s ({record['id']}).")
    return verdict, text


def format_table(rows: list[BenchRow]) -> str:
    head = f"{'op':<15}{'size(B)':>13}{'count':>12}{'type':>9}{'time(us)':>11}{'algbw':>9}{'busbw':>9}{'#wrong':>8}"
    lines = [head, f"{'':<15}{'':>13}{'(elements)':>12}{'':>9}{'':>11}{'(GB/s)':>9}{'(GB/s)':>9}{'':>8}"]
    lines += [f"{r.op:<15}{r.bytes:>13}{r.count:>12}{r.dtype:>9}{r.time_us:>11.1f}{r.algbw_gbps:>9.2f}"
              f"{r.busbw_gbps:>9.2f}{r.wrong:>8}" for r in rows]
    return "\n".join(lines)


def human_size(size: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= div:
            return f"{size / div:g} {unit}"
    return f"{size} B"


def draw_plot(rows: list[BenchRow], expected: dict[str, float], path: str, title: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    for op in dict.fromkeys(r.op for r in rows):
        mine = [r for r in rows if r.op == op]
        line, = ax.plot([r.bytes for r in mine], [r.busbw_gbps for r in mine], marker="o", ms=3, label=op)
        if expected.get(op):
            ax.axhline(expected[op], ls="--", lw=1, color=line.get_color(), label=f"{op} expected")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    from pathlib import Path
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
