"""The plots of ``verispec compare``: block efficiency of every rule along each swept factor, and
the time per round of the live runs (matplotlib, written as PNG)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from verispec.bench.compare.recording import GridPoint
from verispec.bench.compare.replaying import LOSSY, ReplayedRecording, by_point
from verispec.bench.replay import cluster_mean_ci95


PLOT_NOTE = ("error bars: 95% CI of each rule's mean over (prompt, seed) clusters; differences between rules on "
             "the same trees are far tighter (paired, in the claims table)")


def _wrapped(title: str, note: str = PLOT_NOTE, width: int = 90) -> str:
    import textwrap

    return "\n".join([textwrap.fill(title, width), textwrap.fill(note, width)])


def _series(points: dict[str, ReplayedRecording], family: str, x_key: str, fixed: dict, methods):
    """{rule: [(x, mean, half)]} over the points of a family that match ``fixed``; each rule on
    every point it could verify (for the binary family: on the trees of its own scheme, and the
    scheme-free rules on the without-replacement trees)."""
    out: dict[str, list[tuple[float, float, float]]] = {}
    for point in points.values():
        meta = point.meta
        if meta.get("family") != family or any(meta.get(k) != v for k, v in fixed.items()):
            continue
        for method in methods:
            if method not in point.values:
                continue
            if family == "binary" and method not in (meta["live_method"],) and meta["live_method"] != "rrsw":
                continue  # scheme-free rules (nss, traversal, qfree) are drawn once, on the rrsw trees
            mean, half, _ = cluster_mean_ci95(point.values[method], point.clusters)
            x = point_x(meta, x_key)
            out.setdefault(method, []).append((x, mean, half))
    return {m: sorted(v) for m, v in out.items()}


def point_x(meta: dict, x_key: str) -> float:
    if x_key == "nodes":
        return GridPoint(meta["family"], meta["live_method"], meta["draft"], meta["num_drafts"], meta["draft_len"],
                         meta["temperature"], tuple(meta["tree"]) if meta.get("tree") else None).nodes
    return meta[x_key]


def plot_block_efficiency(points, family, x_key, fixed, methods, path: Path, title: str, xlabel: str, integer_x: bool) -> Path | None:
    """One line per rule with 95% CI error bars; drawn only when >= 2 x values were swept."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = _series(points, family, x_key, fixed, methods)
    xs = sorted({x for values in series.values() for x, _, _ in values})
    if len(xs) < 2:
        return None
    fig, ax = plt.subplots(figsize=(8, 5))
    for index, (method, values) in enumerate(sorted(series.items())):
        offset = (index - len(series) / 2) * 0.012 * (xs[-1] - xs[0])  # side by side, not on top of each other
        label = method + (" (lossy)" if method in LOSSY else "")
        ax.errorbar([x + offset for x, _, _ in values], [m for _, m, _ in values], yerr=[h for _, _, h in values],
                    marker="o", capsize=3, label=label)
    ax.set_xticks(xs)
    if integer_x:
        ax.set_xticklabels([str(int(x)) for x in xs])
    ax.set_xlabel(xlabel)
    ax.set_ylabel("block efficiency (tokens per target call)")
    ax.set_title(_wrapped(title), fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_live_breakdown(replayed: list[ReplayedRecording], path: Path, title: str) -> Path | None:
    """Stacked ms per round (draft / target / verify / other) of each live run (head draft)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = {}
    for rec in replayed:
        live = rec.meta.get("live") or []
        if rec.meta.get("draft") != "head" or not live:
            continue
        label = rec.label.rsplit("__s", 1)[0].replace("__head", "").replace("paths__", "").replace("binary__", "")
        calls = sum(r["target_calls"] for r in live)
        parts = {p: sum(r[f"{p}_seconds"] for r in live) * 1e3 / max(calls, 1) for p in ("draft", "target", "verify", "other")}
        previous = rows.get(label)
        rows[label] = parts if previous is None else {p: (previous[p] + parts[p]) / 2 for p in parts}
    if not rows:
        return None
    labels = sorted(rows)
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(labels) + 1.5))
    left = np.zeros(len(labels))
    for part in ("target", "draft", "verify", "other"):
        values = np.array([rows[label][part] for label in labels])
        ax.barh(labels, values, left=left, label=part)
        left += values
    ax.set_xlabel("ms per round (per target call), mean over prompts and seeds")
    ax.set_title(_wrapped(title, "live runs that recorded the trees (1 thread, with a second job on the 2-core CPU); "
                          "no error bars"), fontsize=9)
    ax.legend(fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


PATH_RULES = ["sd", "bv", "spectr", "gmpbv", "rrs", "rrsw", "nss", "traversal", "qfree"]
STAR_RULES = ["sd", "bv", "spectr", "gmpbv", "spectr-gbv-star", "rrsw", "traversal"]
BINARY_RULES = ["spechub", "rrs", "rrsw", "nss", "traversal", "qfree"]


def make_compare_plots(replayed: list[ReplayedRecording], out: Path, subtitle: str) -> dict[str, Path]:
    points = by_point(replayed)
    out.mkdir(parents=True, exist_ok=True)
    made = {
        "be_vs_K": plot_block_efficiency(points, "paths", "num_drafts", {"draft_len": 4, "temperature": 0.6}, PATH_RULES,
                                         out / "be_vs_K.png", f"Block efficiency vs K, head draft, L = 4, T = 0.6 ({subtitle})",
                                         "K (drafted paths; chain rules verify path 0)", True),
        "be_vs_K_star": plot_block_efficiency(points, "star", "num_drafts", {"live_method": "spectr-gbv-star"}, STAR_RULES,
                                              out / "be_vs_K_star.png",
                                              f"Block efficiency vs K, self-draft (T_d = 1.8), L = 4, T = 0.6 ({subtitle})",
                                              "K (drafted paths)", True),
        "be_vs_L": plot_block_efficiency(points, "paths", "draft_len", {"num_drafts": 2, "temperature": 0.6}, PATH_RULES,
                                         out / "be_vs_L.png", f"Block efficiency vs L, head draft, K = 2, T = 0.6 ({subtitle})",
                                         "L (draft length, tokens)", True),
        "be_vs_T": plot_block_efficiency(points, "paths", "temperature", {"num_drafts": 2, "draft_len": 4}, PATH_RULES,
                                         out / "be_vs_T.png", f"Block efficiency vs temperature, head draft, K = 2, L = 4 ({subtitle})",
                                         "temperature (target and draft)", False),
        "be_vs_nodes": plot_block_efficiency(points, "binary", "nodes", {}, BINARY_RULES, out / "be_vs_nodes.png",
                                             f"Block efficiency vs tree size, binary trees, head draft, T = 1 ({subtitle})",
                                             "tree nodes incl. root (binary trees of depth 1-4)", True),
        "live_breakdown": plot_live_breakdown(replayed, out / "live_breakdown.png", f"Time per round of the live runs ({subtitle})"),
    }
    return {k: v for k, v in made.items() if v is not None}
