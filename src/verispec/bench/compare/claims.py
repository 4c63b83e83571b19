"""The claims table of ``verispec compare``: the papers' claims checked on the replayed recordings.

Rules are paired on the same trees where their schemes allow it, else on the same (prompt, seed);
intervals are over (prompt, seed) clusters (``cluster_mean_ci95``, ``cluster_bootstrap_ratio``),
since the rounds of one prompt are dependent. A claim holds only when its interval excludes 0 in
the claimed direction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from verispec.bench.compare.replaying import ReplayedRecording, by_point, find_point, paired_difference
from verispec.bench.replay import cluster_mean_ci95
from verispec.errors import ConfigError


HOLDS, FAILS, CANNOT_TELL = "holds", "does not hold", "cannot tell"


def cluster_bootstrap_ratio(numerator, denominator, clusters, resamples: int = 4000, seed: int = 0) -> tuple[float, float, float]:
    """(ratio, low, high): sum(numerator) / sum(denominator) - 1 over trees, with a 95% percentile
    interval from resampling whole clusters (scipy.stats.bootstrap over cluster indices)."""
    from scipy import stats

    numerator, denominator, clusters = np.asarray(numerator, float), np.asarray(denominator, float), np.asarray(clusters)
    labels, inverse = np.unique(clusters, return_inverse=True)
    num = np.bincount(inverse, weights=numerator)
    den = np.bincount(inverse, weights=denominator)
    point = num.sum() / den.sum() - 1.0
    if len(labels) < 2:
        return float(point), math.nan, math.nan
    result = stats.bootstrap(
        (np.arange(len(labels)),), lambda idx: num[idx.astype(int)].sum() / den[idx.astype(int)].sum() - 1.0,
        n_resamples=resamples, method="percentile", random_state=np.random.default_rng(seed), vectorized=False,
    )
    return float(point), float(result.confidence_interval.low), float(result.confidence_interval.high)


def verdict(low: float, high: float, direction: str) -> str:
    """'>': holds when the interval lies above 0; '<' below; 'equal': holds when it contains 0 and
    lies within the margin given as (low, high) already shifted (see ``ClaimRow``)."""
    if math.isnan(low) or math.isnan(high):
        return CANNOT_TELL
    if direction == ">":
        return HOLDS if low > 0 else FAILS if high < 0 else CANNOT_TELL
    if direction == "<":
        return HOLDS if high < 0 else FAILS if low > 0 else CANNOT_TELL
    raise ConfigError(f"unknown direction {direction!r}")


@dataclass
class ClaimRow:
    """One record of claims.json (the interface names: claim, paper_value, measured, ci_low,
    ci_high, verdict) with the setting, the statistic, how it was paired and the clusters."""

    claim: str
    paper_value: str
    setting: str
    statistic: str
    measured: float
    ci_low: float
    ci_high: float
    verdict: str
    pairing: str
    clusters: int
    note: str = ""


def _diff_row(claim, paper, setting, first: ReplayedRecording, a: str, b: str, pairing="same trees, CRN", note="") -> ClaimRow | None:
    if a not in first.values or b not in first.values:
        return None
    mean, half, count = cluster_mean_ci95(first.values[a] - first.values[b], first.clusters)
    return ClaimRow(claim, paper, setting, f"BE({a}) - BE({b})", mean, mean - half, mean + half,
                    verdict(mean - half, mean + half, ">"), pairing, count, note)


def _closed_form_gain_note(point: ReplayedRecording) -> str:
    """BV's expected gain over SD on the same chains from the on-path probabilities (sum_i w_i minus
    sum_i prod_j min(1, r_j), §2-§3): free of the acceptance draws, so it shows how large a difference
    the sampled comparison would have to resolve. It is >= 0 on every chain by construction (w_i >=
    prod_j min(1, r_j)), so it sizes the gain; it is not evidence for the claim."""
    if "bv" not in point.predicted or "sd" not in point.predicted:
        return ""
    mean, half, _ = cluster_mean_ci95(point.predicted["bv"] - point.predicted["sd"], point.clusters)
    return f"closed-form expected gain on these chains: {mean:+.4f} [{mean - half:+.4f}, {mean + half:+.4f}]"


def _most_common(values):
    """The most frequent value (ties: the smallest), None for none."""
    values = list(values)
    return max(sorted(set(values)), key=values.count) if values else None


def claims(replayed: list[ReplayedRecording]) -> list[ClaimRow]:
    """Every claim the recordings can speak to, at the settings they hold (the grid's centre is
    the most common K, L and T of the head's path points)."""
    points = by_point(replayed)
    rows: list[ClaimRow] = []
    family = [p for p in points.values() if p.meta["family"] == "paths"]
    k0, l0, t0 = (_most_common(p.meta[key] for p in family) for key in ("num_drafts", "draft_len", "temperature"))
    # 1. BV >= SD on the same chain (BV paper: BV is optimal among rules using on-path probabilities),
    # on the L and T sweeps around the grid's centre (chain rules read path 0)
    for point in sorted(family, key=lambda p: (p.meta["temperature"], p.meta["draft_len"])):
        meta = point.meta
        if meta["num_drafts"] == k0 and (meta["temperature"] == t0 or meta["draft_len"] == l0):
            row = _diff_row("BV >= SD (block efficiency, same chain)", "BV >= SD always (Sun et al., §3)",
                            f"head, path 0 of K = {k0} trees, L = {meta['draft_len']}, T = {meta['temperature']:g}",
                            point, "bv", "sd", note=_closed_form_gain_note(point))
            if row is not None:
                rows.append(row)
    # 2. GMPBV vs BV: relative gain on the same trees (BV reads path 0), along the K sweep
    for point in sorted(family, key=lambda p: p.meta["num_drafts"]):
        meta = point.meta
        if meta["num_drafts"] < 2 or meta["draft_len"] != l0 or meta["temperature"] != t0:
            continue
        if "gmpbv" not in point.values or "bv" not in point.values:
            continue
        ratio, low, high = cluster_bootstrap_ratio(point.values["gmpbv"], point.values["bv"], point.clusters)
        if math.isnan(high):
            where = "no interval"
        elif low <= 0.30 <= high:
            where = "30% is inside the interval"
        else:
            where = f"the measured gain is {'below' if high < 0.30 else 'above'} the paper's 30%"
        rows.append(ClaimRow("GMPBV improves block efficiency over BV", "over 30% (GMPBV paper)",
                             f"head, K = {meta['num_drafts']}, L = {l0}, T = {t0:g}", "BE(gmpbv) / BE(bv) - 1", ratio, low,
                             high, verdict(low, high, ">"), "same trees, CRN (BV on path 0); cluster bootstrap",
                             len(np.unique(point.clusters)), where))
    # 3. SpecTr-GBV★ vs SpecTr and GMPBV, growing with K (self-draft: ★ needs a token-determined q)
    star_diffs = {}
    stars = sorted((p for p in points.values() if p.meta["family"] == "star" and p.meta["live_method"] == "spectr-gbv-star"
                    and p.meta["num_drafts"] >= 2), key=lambda p: p.meta["num_drafts"])
    for point in stars:
        k = point.meta["num_drafts"]
        for other in ("spectr", "gmpbv"):
            row = _diff_row("SpecTr-GBV★ > " + ("SpecTr" if other == "spectr" else "GMPBV"),
                            "SpecTr-GBV: higher BE than SpecTr and GBV, growing with K (SpecTr-GBV paper; ★ = lossless repair)",
                            f"self-draft (T_d = {point.meta.get('draft_temperature')}), K = {k}, L = {point.meta['draft_len']}, "
                            f"T = {point.meta['temperature']:g}", point,
                            "spectr-gbv-star", other, note="★ replays its live windows; the other rule the model's rows")
            if row is not None:
                rows.append(row)
                star_diffs[(k, other)] = row
    if len(stars) >= 2:
        low_k, high_k = stars[0].meta["num_drafts"], stars[-1].meta["num_drafts"]
        for other in ("spectr", "gmpbv"):
            if (low_k, other) not in star_diffs or (high_k, other) not in star_diffs:
                continue
            two, four = star_diffs[(low_k, other)], star_diffs[(high_k, other)]
            growth = four.measured - two.measured
            half = math.hypot((four.ci_high - four.ci_low) / 2, (two.ci_high - two.ci_low) / 2)
            rows.append(ClaimRow(f"SpecTr-GBV★'s gain over {other} grows with K", "growing with K (SpecTr-GBV paper)",
                                 f"self-draft, K = {high_k} vs K = {low_k}", f"gain(K = {high_k}) - gain(K = {low_k})", growth,
                                 growth - half, growth + half, verdict(growth - half, growth + half, ">"),
                                 "independent recordings: normal combination of the two intervals", min(two.clusters, four.clusters)))
    depths = sorted({len(p.meta["tree"]) for p in points.values() if p.meta["family"] == "binary" and p.meta.get("tree")})
    # 4. SpecHub vs RRS / RRSw on binary trees at T = 1 (different sampling schemes: paired by prompt)
    for depth in depths:
        hub = find_point(points, family="binary", live_method="spechub", tree=(2,) * depth)
        for other, paper in (("rrs", "+0.05 to +0.27 tokens/step"), ("rrsw", "+0.02 to +0.16 tokens/step")):
            rec = find_point(points, family="binary", live_method=other, tree=(2,) * depth)
            if hub is None or rec is None or "spechub" not in hub.values or other not in rec.values:
                continue
            mean, half, count = paired_difference(hub, "spechub", rec, other)
            rows.append(ClaimRow(f"SpecHub > {other.upper()}", f"{paper} (SpecHub paper, binary trees 3-31 nodes, T = 1)",
                                 f"head, binary tree of {2 ** (depth + 1) - 1} nodes, T = 1", f"BE(spechub) - BE({other})",
                                 mean, mean - half, mean + half, verdict(mean - half, mean + half, ">"),
                                 "same (prompt, seed), each rule on trees of its own scheme", count))
    # 5. Traversal >= token-level tree rules on the same without-replacement trees
    for depth in depths:
        rec = find_point(points, family="binary", live_method="rrsw", tree=(2,) * depth)
        if rec is None:
            continue
        for other in ("nss", "rrsw"):
            same = "traversal" in rec.values and other in rec.values and np.array_equal(rec.values["traversal"], rec.values[other])
            row = _diff_row(f"Traversal >= {other.upper()}", "traversal >= token-level tree rules (Weng et al.)",
                            f"head, binary w/o-replacement tree of {2 ** (depth + 1) - 1} nodes, T = 1", rec, "traversal", other,
                            note="identical decisions on every tree (the two rules coincide here)" if same else "")
            if row is not None:
                rows.append(row)
    # 6. Closed forms: E[BE | chain] of SD and BV against the replayed BE on the same chains (L sweep)
    for point in sorted(family, key=lambda p: p.meta["draft_len"]):
        if point.meta["num_drafts"] != k0 or point.meta["temperature"] != t0:
            continue
        length = point.meta["draft_len"]
        for method in ("sd", "bv"):
            if method not in point.predicted or method not in point.values:
                continue
            mean, half, count = cluster_mean_ci95(point.values[method] - point.predicted[method], point.clusters)
            ok = not math.isnan(half) and mean - half <= 0 <= mean + half and max(abs(mean - half), abs(mean + half)) <= 0.05
            bad = not math.isnan(half) and (mean - half > 0 or mean + half < 0)
            rows.append(ClaimRow(f"Closed form predicts {method.upper()}'s block efficiency",
                                 "E[tau] from the on-path probabilities (§2, §3)", f"head, path 0 of K = {k0} trees, L = {length}, T = {t0:g}",
                                 "measured - predicted BE", mean, mean - half, mean + half,
                                 HOLDS if ok else FAILS if bad else CANNOT_TELL, "same chains", count,
                                 "holds: the interval contains 0 and lies within ±0.05"))
    return rows


def claims_markdown(rows: list[ClaimRow]) -> str:
    lines = ["| claim | paper | setting | statistic | verispec (95% CI) | verdict | pairing | clusters | note |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.claim} | {r.paper_value} | {r.setting} | {r.statistic} | {r.measured:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}] "
                     f"| **{r.verdict}** | {r.pairing} | {r.clusters} | {r.note} |")
    return "\n".join(lines) + "\n"
