"""fleet_sweep's PNG: per check figure, every node's (or GPU's) value against the fleet median, with
the threshold of the one rule (and the expected figure, where one exists) drawn and the outliers in red.
matplotlib is imported only here."""

from __future__ import annotations

from pathlib import Path


def draw(figures: list[dict], stats: dict[tuple[str, str], dict], outliers: list[dict], path: Path,
         title: str, overwrite: bool = False) -> str | None:
    """One panel per figure and group; returns the path, or None when there is nothing to draw."""
    panels = list(stats.items())   # busy-only groups too: their bars (gray) are the evidence
    if not panels:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bad = {(o["node"], o.get("gpu"), o["key"]) for o in outliers if o["status"] == "confirmed"}
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.6 * len(panels)), dpi=100, squeeze=False)
    for ax, ((key, group), s) in zip(axes[:, 0], panels):
        mine = [f for f in figures if f"{f['check']}.{f['name']}" == key and (f.get("group") or "") == group]
        labels = [f["node"] + (f":{f['gpu']}" if f.get("gpu") is not None else "") for f in mine]
        colors = ["tab:red" if (f["node"], f.get("gpu"), key) in bad else "tab:gray" if f["busy"] else "tab:blue"
                  for f in mine]
        ax.bar(range(len(mine)), [f["value"] for f in mine], color=colors)
        sign = -1 if s["better"] == "higher" else 1
        if s["median"] is not None:
            ax.axhline(s["median"], color="black", lw=1, label=f"fleet median {s['median']:.4g}")
            ax.axhline(s["median"] * (1 + sign * s["threshold"]), color="black", lw=1, ls="--",
                       label=f"threshold ({s['threshold']:.1%} from the median)")
        if s["expected"]:
            ax.axhline(s["expected"], color="tab:green", lw=1, ls=":", label=f"expected {s['expected']:.4g}")
        ax.set_ylabel(s["unit"])
        ax.set_title(key + (f" [{group}]" if group else "") + ("  (gray: busy, not judged)" if s["busy_excluded"] else ""),
                     fontsize=9)
        ax.set_xticks(range(len(mine)), labels, rotation=90 if len(mine) > 16 else 0, fontsize=7)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    from ..shared.safe_write import write_figure

    return write_figure(fig, path, overwrite=overwrite)
