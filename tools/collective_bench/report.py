"""collective_bench reporting helpers: the verdict against the expected busbw (tools/shared/expected_busbw.py), the
human table and the PNG plot. Pure apart from reading knowledge data and writing the plot file.
"""

from ..shared.safe_write import write_figure
from .models import BenchRow, OpSummary


def point_at(record: dict, size: int) -> dict | None:
    return next((p for p in record.get("points", []) if p["bytes"] == size), None)


def gbps(value: float | None) -> str:
    """A bandwidth with 3 significant digits: 0.0235 and 0.0023 GB/s must not both print as 0.0."""
    if value is None:
        return "?"
    return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def judge(summary: OpSummary, record: dict | None, big_enough: bool) -> tuple[str, str | None]:
    """(verdict, sentence) for one op's peak busbw against its expected figure."""
    if summary.expected_busbw_gbps is None or summary.ratio is None:
        return "info", None
    if not big_enough:
        return "info", (f"{summary.op}: largest size {summary.peak_bytes / 2**20:.0f} MiB is too small to judge "
                        f"peak busbw (expected {summary.expected_busbw_gbps:.0f} GB/s at >= 1 GiB); "
                        "raise max_bytes.")
    verdict = "ok" if summary.ratio >= 0.85 else "warn" if summary.ratio >= 0.6 else "fail"
    text = (f"{summary.op}: {gbps(summary.peak_busbw_gbps)} GB/s busbw at {human_size(summary.peak_bytes)} is "
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


def draw_plot(rows: list[BenchRow], expected: dict[str, float], path, title: str, overwrite: bool = False) -> str:
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
    return write_figure(fig, path, overwrite=overwrite)
