"""The report of ``verispec compare``: OUT/claims.md, OUT/claims.json, OUT/compare.csv and the
plots, from the replayed recordings."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from verispec.bench.compare.claims import claims, claims_markdown
from verispec.bench.compare.plots import make_compare_plots, point_x
from verispec.bench.compare.recording import SELF_DRAFT_TEMPERATURE
from verispec.bench.compare.replaying import (
    LOSSY, REPLAY_METHODS, ReplayedRecording, by_point, find_point, paired_difference,
)
from verispec.bench.replay import cluster_mean_ci95, compare_live_and_replay, live_vs_replay_markdown
from verispec.verify.registry import METHODS


def block_efficiency_table(replayed: list[ReplayedRecording]) -> str:
    """Every point: live BE and every replayed rule's BE (95% CI over clusters)."""
    points = by_point(replayed)
    methods = [m for m in REPLAY_METHODS if any(m in p.values for p in points.values())]
    lines = ["| point | trees | clusters | live (rule) | " + " | ".join(m + (" (lossy)" if m in LOSSY else "") for m in methods) + " |",
             "|---|---|---|---|" + "---|" * len(methods)]
    for label, point in sorted(points.items()):
        live, live_half, count = cluster_mean_ci95(point.live_be, point.clusters)
        cells = []
        for m in methods:
            if m in point.values:
                mean, half, _ = cluster_mean_ci95(point.values[m], point.clusters)
                cells.append(f"{mean:.3f} ± {half:.3f}")
            else:
                cells.append("–")
        lines.append(f"| {label} | {len(point.live_be)} | {count} | {live:.3f} ± {live_half:.3f} ({point.meta['live_method']}) | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def live_vs_replay_table(replayed: list[ReplayedRecording]) -> str:
    """The live rule's replayed BE against the live BE of the same rounds, per point (all seeds)."""
    rows = [compare_live_and_replay(label, point.meta["live_method"], point.live_be, point.values[point.meta["live_method"]],
                                    point.clusters)
            for label, point in sorted(by_point(replayed).items()) if point.meta["live_method"] in point.values]
    return live_vs_replay_markdown(rows)


def compare_rows(replayed: list[ReplayedRecording]) -> list[dict]:
    """compare.csv: one row per rule x grid point (K, L, T, tree), BE with its 95% interval over
    (prompt, seed) clusters."""
    rows = []
    for label, point in sorted(by_point(replayed).items()):
        meta = point.meta
        for method in REPLAY_METHODS:
            if method not in point.values:
                continue
            mean, half, count = cluster_mean_ci95(point.values[method], point.clusters)
            rows.append({
                "rule": method, "K": meta["num_drafts"], "L": meta["draft_len"], "temperature": meta["temperature"],
                "block_efficiency": mean, "ci_low": mean - half, "ci_high": mean + half,
                "tree": "-".join(map(str, meta["tree"])) if meta.get("tree") else "", "nodes": point_x(meta, "nodes"),
                "family": meta["family"], "draft": meta.get("draft_source", meta["draft"]), "live_rule": meta["live_method"],
                "lossless": method not in LOSSY, "trees": len(point.values[method]), "clusters": count,
                "view": "path 0" if METHODS[method].draft == "chain" and meta["num_drafts"] > 1 else "",
            })
    return rows


def published_spectr_gbv_markdown(replayed: list[ReplayedRecording]) -> str:
    """The published (lossy) SpecTr-GBV's live-run BE beside ★'s at the same K: not a claim (its
    gain is not a lossless gain), reported so a reader sees what the lossy rule would promise."""
    points = by_point(replayed)
    lines = []
    for point in points.values():
        if point.meta.get("live_method") != "spectr-gbv" or "spectr-gbv" not in point.values:
            continue
        star = find_point(points, family="star", live_method="spectr-gbv-star", num_drafts=point.meta["num_drafts"])
        if star is None or "spectr-gbv-star" not in star.values:
            continue
        mean, half, count = paired_difference(point, "spectr-gbv", star, "spectr-gbv-star")
        lossy, lossy_half, _ = cluster_mean_ci95(point.values["spectr-gbv"], point.clusters)
        exact, exact_half, _ = cluster_mean_ci95(star.values["spectr-gbv-star"], star.clusters)
        lines.append(f"Published SpecTr-GBV (NOT lossless for K >= 2: output law off by TV 4-14% per block on "
                     f"ALGORITHMS.md §6.2's fixtures), K = {point.meta['num_drafts']}: BE {lossy:.3f} ± {lossy_half:.3f} "
                     f"vs SpecTr-GBV★ {exact:.3f} ± {exact_half:.3f}; difference {mean:+.3f} ± {half:.3f} "
                     f"({count} (prompt, seed) clusters, different trees).")
    return "\n".join(lines) + ("\n" if lines else "")


def write_compare_report(out: str | Path, replayed: list[ReplayedRecording], command: str = "") -> dict[str, Path]:
    """OUT/claims.json (a list of claim records), OUT/compare.csv, OUT/claims.md, OUT/plots/*.png."""
    import csv

    out = Path(out)
    rows = claims(replayed)
    seeds = sorted({str(r.meta["seed"]) for r in replayed})
    prompts = sorted({p for r in replayed for p in r.prompt_ids})
    datasets = sorted({str(r.meta.get("dataset", "humaneval")) for r in replayed})
    subtitle = f"SmolLM2-135M-Instruct, {len(prompts)} prompts ({', '.join(datasets)}), seeds {','.join(seeds)}"
    plots = make_compare_plots(replayed, out / "plots", subtitle)
    table = compare_rows(replayed)
    text = [
        "# verispec compare: the papers' claims on recorded draft trees", "",
        f"Drafts: the shipped EAGLE-3 head, and a self-draft (the target at draft temperature "
        f"{SELF_DRAFT_TEMPERATURE}) for the rules that modify later target rows. Prompts: {', '.join(prompts[:3])}"
        f"{' ...' if len(prompts) > 3 else ''} ({len(prompts)}, held out); seeds {', '.join(seeds)}. "
        "Every rule re-verifies the recorded trees with common random numbers; intervals are 95% over (prompt, seed) "
        "clusters (Student t on the cluster means; GMPBV/BV ratio: cluster bootstrap). A claim 'holds' only when the "
        "interval excludes 0 in the claimed direction.", "",
        f"Command: `{command}`" if command else "", "",
        "## Claims", "", claims_markdown(rows), "", published_spectr_gbv_markdown(replayed), "",
        "## Live vs replayed block efficiency", "",
        "A rule replayed on its own live recording (modification windows as the live run applied them) estimates its "
        "live block efficiency without bias: the intervals should overlap.", "", live_vs_replay_table(replayed), "",
        "## Block efficiency of every rule at every point", "", block_efficiency_table(replayed), "",
        "## Plots", "", *[f"![{name}](plots/{path.name})" for name, path in plots.items()], "",
    ]
    paths = {"md": out / "claims.md", "json": out / "claims.json", "csv": out / "compare.csv"}
    paths["md"].write_text("\n".join(text))
    paths["json"].write_text(json.dumps([asdict(r) for r in rows], indent=1, default=float))
    with paths["csv"].open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(table[0]) if table else ["rule"])
        writer.writeheader()
        writer.writerows(table)
    return {**paths, **plots}
