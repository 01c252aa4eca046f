"""fleet_sweep's PNG: per check figure, every node's (or GPU's) value against the fleet median, with
the outlier threshold (and the expected figure, where one exists) drawn and the outliers in red.
matplotlib is imported only here."""

from __future__ import annotations

from pathlib import Path


def draw(figures: list[dict], medians: dict[str, dict], outliers: list[dict], margin_pct: float, path: Path,
         title: str, overwrite: bool = False) -> str | None:
    """One panel per figure key; returns the path, or None when there is nothing to draw."""
    keys = [k for k in medians if any(f"{f['check']}.{f['name']}" == k and f.get("value") is not None
                                      for f in figures)]
    if not keys:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bad = {(o["node"], o.get("gpu"), o["key"]) for o in outliers}
    fig, axes = plt.subplots(len(keys), 1, figsize=(9, 2.6 * len(keys)), dpi=100, squeeze=False)
    for ax, key in zip(axes[:, 0], keys):
        mine = [f for f in figures if f"{f['check']}.{f['name']}" == key and f.get("value") is not None]
        labels = [f["node"] + (f":{f['gpu']}" if f.get("gpu") is not None else "") for f in mine]
        colors = ["tab:red" if (f["node"], f.get("gpu"), key) in bad else "tab:blue" for f in mine]
        ax.bar(range(len(mine)), [f["value"] for f in mine], color=colors)
        stats = medians[key]
        sign = -1 if stats["higher_is_better"] else 1
        ax.axhline(stats["median"], color="black", lw=1, label=f"fleet median {stats['median']:.4g}")
        ax.axhline(stats["median"] * (1 + sign * margin_pct / 100), color="black", lw=1, ls="--",
                   label=f"outlier threshold ({margin_pct:g}% from the median)")
        expected = next((f["expected"] for f in mine if f.get("expected")), None)
        if expected:
            ax.axhline(expected, color="tab:green", lw=1, ls=":", label=f"expected {expected:.4g}")
        ax.set_ylabel(stats["unit"])
        ax.set_title(key, fontsize=9)
        ax.set_xticks(range(len(mine)), labels, rotation=90 if len(mine) > 16 else 0, fontsize=7)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    from ..shared.safe_write import write_figure

    return write_figure(fig, path, overwrite=overwrite)
