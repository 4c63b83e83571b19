"""``verispec compare``: every lossless rule on the same recorded draft trees, and the papers'
claims checked with paired intervals (issue 15).

Stage 1, ``record``: for every point of a grid (draft, live rule, K, L, tree shape, temperature) and
every seed, the live engine decodes held-out HumanEval prompts and ``bench.replay.TreeRecorder``
keeps every verified tree (target rows as verified and the model's own rows, draft rows, raw paths)
plus the live run's timings, one ``.npz`` per (point, seed) under ``OUT/trees``.

Stage 2, ``report``: every lossless rule that supports a recording's sampling scheme re-verifies
its trees with common random numbers (``bench.replay.tree_rng``: the same stream for every rule on
a tree), chain rules on path 0 of K-path trees, modifying rules only on their own recordings
(``bench.replay``'s module docstring says why). Per-tree values are cached in ``OUT/replay/``.
The claims table pairs rules on the same trees where their schemes allow it, else on the same
(prompt, seed); intervals are over (prompt, seed) clusters (``cluster_mean_ci95``,
``cluster_bootstrap_ratio``), since the rounds of one prompt are dependent.

The draft: the shipped EAGLE-3 head (a proper q over an 8,192-token sub-vocabulary) for every rule
it can run losslessly. GBV-mod and SpecTr-GBV★ modify later target rows assuming q of a prefix
depends on its tokens alone, which a head's q does not (the engine refuses the pair), so their
family uses a self-draft: the target itself sampled at draft temperature 1.8, a real model's q with
block efficiency ~2 at L = 4; it measures block efficiency, not speed (the draft costs a target
forward).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from verispec.bench.replay import (
    TREES_DIR, RecordedTrees, TreeRecorder, cluster_mean_ci95, compare_live_and_replay, find_recordings, load_trees,
    live_vs_replay_markdown, replay_recording, tree_for_rule,
)
from verispec.core.tree import DraftScheme
from verispec.errors import ConfigError
from verispec.verify.registry import METHODS

SELF_DRAFT = "self"
SELF_DRAFT_TEMPERATURE = 1.8
REPLAY_DIR = "replay"


@dataclass(frozen=True)
class GridPoint:
    """One live configuration. ``family`` groups the points a claim reads: "paths" (head, K i.i.d.
    paths), "star" (self-draft, modifying rules live), "binary" (head, binary trees as in SpecHub's
    experiments)."""

    family: str
    live_method: str
    draft: str
    num_drafts: int
    draft_len: int
    temperature: float
    tree: tuple[int, ...] | None = None

    @property
    def nodes(self) -> int:
        """Tree nodes incl. the root (binary trees: 2^(d+1) - 1); K x L + 1 at most for paths."""
        if self.tree is None:
            return self.num_drafts * self.draft_len + 1
        total, width = 1, 1
        for children in self.tree:
            width *= children
            total += width
        return total

    @property
    def label(self) -> str:
        shape = "tree" + "-".join(map(str, self.tree)) if self.tree else f"K{self.num_drafts}-L{self.draft_len}"
        return f"{self.family}__{self.live_method}__{self.draft}__{shape}__T{self.temperature:g}"


def make_grid(ks=(1, 2, 3, 4), lengths=(2, 4, 6, 8), temperatures=(0.3, 0.6, 1.0), binary_depths=(1, 2, 3, 4),
              families=None) -> list[GridPoint]:
    """The sweep of issue 15, one factor at a time around (K0, L0, T0) = (2, 4, 0.6) (or the first
    value given): K, L and T on the head's K-path trees with GMPBV live; K with SpecTr-GBV★ live
    (and the published SpecTr-GBV at K0) on the self-draft; binary trees of the given depths
    (3, 7, 15, 31 nodes) at T = 1 under the three sampling schemes of RRS, RRSw and SpecHub."""
    ks, lengths, temperatures = list(ks), list(lengths), [float(t) for t in temperatures]
    if not ks or not lengths or not temperatures or min(ks) < 1 or min(lengths) < 1 or min(temperatures) <= 0:
        raise ConfigError(f"K, L and temperatures need positive values (T > 0: sampled drafts), got K={ks}, L={lengths}, "
                          f"T={temperatures}")
    k0 = 2 if 2 in ks else ks[0]
    l0 = 4 if 4 in lengths else lengths[0]
    t0 = 0.6 if 0.6 in temperatures else temperatures[0]
    points = [GridPoint("paths", "gmpbv", "head", k, l0, t0) for k in ks]
    points += [GridPoint("paths", "gmpbv", "head", k0, length, t0) for length in lengths if length != l0]
    points += [GridPoint("paths", "gmpbv", "head", k0, l0, t) for t in temperatures if t != t0]
    points += [GridPoint("star", "spectr-gbv-star", SELF_DRAFT, k, l0, t0) for k in ks]
    points += [GridPoint("star", "spectr-gbv", SELF_DRAFT, k0, l0, t0)]
    for live in ("rrs", "rrsw", "spechub"):
        points += [GridPoint("binary", live, "head", 2, depth, 1.0, tree=(2,) * depth) for depth in binary_depths]
    unique = list(dict.fromkeys(points))
    return [p for p in unique if families is None or p.family in families]


def default_grid() -> list[GridPoint]:
    return make_grid()


@dataclass
class RecordConfig:
    """Stage 1. Prompts: HumanEval ``start`` .. ``start + limit - 1`` (0-39 are held out from every
    draft's training), or a Spec-Bench JSONL file's held-out ids (divisible by 5), ``limit`` per
    category."""

    out: str = "compare_out"
    K: list[int] = field(default_factory=lambda: [1, 2, 3, 4])
    L: list[int] = field(default_factory=lambda: [2, 4, 6, 8])
    temperatures: list[float] = field(default_factory=lambda: [0.3, 0.6, 1.0])
    binary_depths: list[int] = field(default_factory=lambda: [1, 2, 3, 4])
    dataset: str = "humaneval"
    limit: int = 10
    start: int = 0
    max_new_tokens: int = 32
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    per_prompt: int | None = 12
    top_p: float = 1.0
    target: str | None = None  # None: the embedded default target
    draft: str = "head"  # 'head', a head directory, or a draft model directory
    self_draft_temperature: float = SELF_DRAFT_TEMPERATURE
    families: list[str] | None = None  # record only these families (None: all)
    shard: tuple[int, int] = (0, 1)  # (index, count): this process records points index, index + count, ...

    def grid(self) -> list[GridPoint]:
        return make_grid(self.K, self.L, self.temperatures, self.binary_depths, self.families)

    def validate(self) -> "RecordConfig":
        if self.limit < 1 or (self.dataset == "humaneval" and self.limit < 2):
            raise ConfigError(f"limit must be >= 2 prompts (intervals are over prompts), got {self.limit}")
        if self.dataset == "humaneval" and (self.start < 0 or self.start + self.limit > 40):
            raise ConfigError(f"prompts {self.start}..{self.start + self.limit - 1} leave HumanEval 0-39, the held-out "
                              "prompts; use start + limit <= 40")
        if not self.seeds:
            raise ConfigError("give at least one seed (--seeds 0,1)")
        index, count = self.shard
        if not 0 <= index < count:
            raise ConfigError(f"shard must be INDEX/COUNT with 0 <= INDEX < COUNT, got {index}/{count}")
        self.grid()
        return self

    def prompts(self):
        from verispec.bench.datasets import humaneval_prompts, spec_bench_prompts

        if self.dataset == "humaneval":
            return humaneval_prompts(self.start + self.limit)[self.start :]
        held_out = [p for p in spec_bench_prompts(self.dataset) if p.prompt_id.isdigit() and int(p.prompt_id) % 5 == 0]
        per_category: dict[str, int] = {}
        chosen = []
        for prompt in held_out:
            if per_category.get(prompt.category, 0) < self.limit:
                per_category[prompt.category] = per_category.get(prompt.category, 0) + 1
                chosen.append(prompt)
        if len(chosen) < 2:
            raise ConfigError(f"{self.dataset}: fewer than 2 held-out prompts (question ids divisible by 5)")
        return chosen


def record_point(point: GridPoint, seed: int, config: RecordConfig, target, tokenizer, prompts, draft="head") -> Path:
    """Decode every prompt live with the point's rule; save the recording with its live timings."""
    from verispec.bench.runner import prompt_seed
    from verispec.core.rng import SeededRng
    from verispec.engine.decoder import SpeculativeDecoder
    from verispec.models.default import encode_prompt

    recorder = TreeRecorder(limit=10**9, per_prompt=config.per_prompt)
    decoder = SpeculativeDecoder(
        target, target if point.draft == SELF_DRAFT else draft, tokenizer=tokenizer, method=point.live_method,
        num_drafts=point.num_drafts, draft_len=point.draft_len, tree=list(point.tree) if point.tree else None,
        temperature=point.temperature, top_p=config.top_p, max_new_tokens=config.max_new_tokens,
        draft_temperature=config.self_draft_temperature if point.draft == SELF_DRAFT else None,
        step_callback=recorder.callback,
    )
    live = []
    for index, prompt in enumerate(prompts):
        recorder.current_prompt = str(prompt.prompt_id)
        output = decoder.generate(encode_prompt(tokenizer, prompt.text), rng=SeededRng(prompt_seed(seed, index)))
        breakdown = output.time_breakdown()
        live.append({"prompt_id": str(prompt.prompt_id), "new_tokens": output.new_tokens, "target_calls": output.target_calls,
                     "seconds": output.seconds, **{f"{part}_seconds": float(value) for part, value in breakdown.items()}})
    meta = {**asdict(point), "method": point.live_method, "K": point.num_drafts, "L": point.draft_len, "seed": seed,
            "label": f"{point.label}__s{seed}", "top_p": config.top_p, "per_prompt": config.per_prompt,
            "draft_temperature": config.self_draft_temperature if point.draft == SELF_DRAFT else None,
            "max_new_tokens": config.max_new_tokens, "dataset": config.dataset, "live": live,
            "draft_source": config.draft if point.draft != SELF_DRAFT else "self"}
    path = Path(config.out) / TREES_DIR / f"{meta['label']}.npz"
    recorder.save(path, meta)
    return path


def load_pair(config: RecordConfig):
    """(target, tokenizer, draft) for the head families: the draft is 'head' / a head directory
    (loaded by the decoder) or a draft model directory."""
    import torch

    from verispec.engine.head_drafter import is_head_source
    from verispec.models.default import load_default_target, load_model

    if config.target is None:
        target, tokenizer = load_default_target()
    else:
        target, tokenizer = load_model(config.target, torch.float32, "cpu")
    draft = config.draft if is_head_source(config.draft) else load_model(config.draft, torch.float32, "cpu")[0]
    return target, tokenizer, draft


def record_grid(config: RecordConfig, target=None, tokenizer=None, draft=None, progress: bool = True) -> list[Path]:
    """Stage 1 over the grid (this shard's points), skipping recordings that already exist (a
    stopped run resumes)."""
    config.validate()
    if target is None:
        target, tokenizer, draft = load_pair(config)
    prompts = config.prompts()
    index, count = config.shard
    paths = []
    for point in config.grid()[index::count]:
        for seed in config.seeds:
            path = Path(config.out) / TREES_DIR / f"{point.label}__s{seed}.npz"
            if path.is_file():
                paths.append(path)
                continue
            tic = time.perf_counter()
            paths.append(record_point(point, seed, config, target, tokenizer, prompts, draft))
            if progress:
                print(f"recorded {path.name} in {time.perf_counter() - tic:.0f} s", flush=True)
    return paths


# ----- stage 2: replay every rule, cache per-tree values ---------------------------------------

# lossless rules replayed on real trees (OTM's LP is a small-V reference; SPRINTER is lossy), plus
# the published SpecTr-GBV, lossy for K >= 2 and labelled so wherever it appears
REPLAY_METHODS = ["sd", "bv", "gbv-mod", "spectr", "gmpbv", "spectr-gbv-star", "spectr-gbv", "rrs", "rrsw", "nss",
                  "traversal", "spechub", "qfree"]
LOSSY = {"spectr-gbv"}


@dataclass
class ReplayedRecording:
    """Per-tree replayed BE of every rule that could verify one recording."""

    label: str
    meta: dict
    prompt_ids: list[str]
    live_be: np.ndarray  # (trees,) live accepted_len + 1
    values: dict[str, np.ndarray]  # rule -> (trees,) mean BE over repeats
    skipped: dict[str, str]  # rule -> reason
    predicted: dict[str, np.ndarray] = field(default_factory=dict)  # "sd"/"bv" -> (trees,) E[BE | path 0]

    @property
    def clusters(self) -> np.ndarray:
        """(seed, prompt) of every tree: the unit of the intervals."""
        return np.array([f"{self.meta['seed']}:{p}" for p in self.prompt_ids])


def expected_block_efficiency_given_chain(method: str, tree) -> float:
    """E[accepted + 1 | the drafted chain] of SD or BV, exact (ALGORITHMS.md §2, §3):
    SD: P(tau >= i | x_{1:L}) = prod_{j <= i} min(1, p_j(x_j)/q_j(x_j));
    BV: P(tau >= i | x_{1:i}) = w_i (BV's invariant, §3 [DERIVED]): given the whole chain it is not
    the stop law, but its mean over chains x ~ q is, so sum_i w_i is unbiased for E[tau] over trees.
    ``tree`` is a chain (path 0 of a K-path tree)."""
    from verispec.verify.bv import capped_weights

    nodes = np.arange(tree.num_nodes)
    tokens = tree.tokens[1:]
    p = tree.target.probs_of(nodes[:-1], tokens)
    q = tree.draft.probs_of(nodes[:-1], tokens)
    if method == "sd":
        return 1.0 + float(np.cumprod(np.minimum(1.0, p / q)).sum())
    if method == "bv":
        return 1.0 + float(capped_weights(p, q)[1:].sum())
    raise ConfigError(f"no per-chain expectation for {method!r}; only sd and bv have one here")


def replay_one(recording: RecordedTrees, methods=REPLAY_METHODS, seed: int = 0, repeats: int = 4) -> ReplayedRecording:
    stats, skipped = replay_recording(recording, list(methods), seed=seed, repeats=repeats, chain_view=True)
    replayed = ReplayedRecording(
        recording.source, recording.meta, list(recording.prompt_ids), np.asarray(recording.live_accepted_lens) + 1.0,
        {s.method: np.asarray(s.per_tree) for s in stats}, {m: reason for _, m, reason in skipped},
    )
    if all(t.scheme in (DraftScheme.CHAIN, DraftScheme.IID_PATHS) for t in recording.trees):
        for method in ("sd", "bv"):
            chains = [tree_for_rule(method, tree, True, False) for tree in recording.trees]
            replayed.predicted[method] = np.array([expected_block_efficiency_given_chain(method, c) for c in chains])
    return replayed


def _cached(path: Path, seed: int, repeats: int) -> ReplayedRecording | None:
    if not path.is_file():
        return None
    entry = json.loads(path.read_text())
    if entry["repeats"] != repeats or entry["seed"] != seed:
        return None
    return ReplayedRecording(
        entry["label"], entry["meta"], entry["prompt_ids"], np.asarray(entry["live_be"]),
        {m: np.asarray(v) for m, v in entry["values"].items()}, entry["skipped"],
        {m: np.asarray(v) for m, v in entry["predicted"].items()},
    )


def replay_all(out: str | Path, seed: int = 0, repeats: int = 4, progress: bool = True,
               shard: tuple[int, int] = (0, 1)) -> list[ReplayedRecording]:
    """Replay every recording under OUT, cached per recording in OUT/replay/LABEL.json (a report
    re-run reads the cache; delete it to replay again). ``shard`` = (index, count): replay only
    every count-th recording from index, so several processes can share the work."""
    out = Path(out)
    cache_dir = out / REPLAY_DIR
    cache_dir.mkdir(parents=True, exist_ok=True)
    index, count = shard
    results = []
    for path in find_recordings(out)[index::count]:
        cache_path = cache_dir / f"{path.stem}.json"
        cached = _cached(cache_path, seed, repeats)
        if cached is not None:
            results.append(cached)
            continue
        tic = time.perf_counter()
        replayed = replay_one(load_trees(path), seed=seed, repeats=repeats)
        results.append(replayed)
        cache_path.write_text(json.dumps({
            "label": replayed.label, "meta": replayed.meta, "prompt_ids": replayed.prompt_ids,
            "live_be": replayed.live_be.tolist(), "values": {m: v.tolist() for m, v in replayed.values.items()},
            "skipped": replayed.skipped, "predicted": {m: v.tolist() for m, v in replayed.predicted.items()},
            "repeats": repeats, "seed": seed,
        }))
        if progress:
            print(f"replayed {path.stem}: {len(replayed.prompt_ids)} trees, {len(replayed.values)} rules, "
                  f"{time.perf_counter() - tic:.0f} s", flush=True)
    return results


# ----- claims ---------------------------------------------------------------------------------

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


def _pooled(recordings: list[ReplayedRecording]) -> ReplayedRecording:
    """The recordings of one grid point over seeds, as one (clusters stay (seed, prompt))."""
    first = recordings[0]
    methods = set.intersection(*(set(r.values) for r in recordings))
    predicted = set.intersection(*(set(r.predicted) for r in recordings))
    merged = ReplayedRecording(
        first.label.rsplit("__s", 1)[0], dict(first.meta), [], np.concatenate([r.live_be for r in recordings]),
        {m: np.concatenate([r.values[m] for r in recordings]) for m in methods}, dict(first.skipped),
        {m: np.concatenate([r.predicted[m] for r in recordings]) for m in predicted},
    )
    merged.prompt_ids = [f"{r.meta['seed']}:{p}" for r in recordings for p in r.prompt_ids]
    merged.meta["seed"] = "all"
    return merged


def by_point(replayed: list[ReplayedRecording]) -> dict[str, ReplayedRecording]:
    groups: dict[str, list[ReplayedRecording]] = {}
    for r in replayed:
        groups.setdefault(r.label.rsplit("__s", 1)[0], []).append(r)
    return {label: _pooled(sorted(group, key=lambda r: str(r.meta["seed"]))) for label, group in groups.items()}


def _find(points: dict[str, ReplayedRecording], **want) -> ReplayedRecording | None:
    for point in points.values():
        meta = point.meta
        if all((tuple(meta.get(k)) if isinstance(meta.get(k), list) else meta.get(k)) == v for k, v in want.items()):
            return point
    return None


def _cluster_paired(first: ReplayedRecording, a: str, second: ReplayedRecording, b: str):
    """Per-(seed, prompt) mean of rule a on one recording minus rule b on another (different trees
    drawn for the same prompts and seeds): (mean, half-width, clusters)."""
    from scipy import stats

    def means(rec, method):
        out = {}
        for cluster in np.unique(rec.clusters):
            out[cluster] = float(rec.values[method][rec.clusters == cluster].mean())
        return out

    left, right = means(first, a), means(second, b)
    common = sorted(set(left) & set(right))
    diffs = np.array([left[c] - right[c] for c in common])
    if len(diffs) < 2:
        return math.nan, math.nan, len(diffs)
    half = stats.t.ppf(0.975, len(diffs) - 1) * diffs.std(ddof=1) / math.sqrt(len(diffs))
    return float(diffs.mean()), float(half), len(diffs)


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
        hub = _find(points, family="binary", live_method="spechub", tree=(2,) * depth)
        for other, paper in (("rrs", "+0.05 to +0.27 tokens/step"), ("rrsw", "+0.02 to +0.16 tokens/step")):
            rec = _find(points, family="binary", live_method=other, tree=(2,) * depth)
            if hub is None or rec is None or "spechub" not in hub.values or other not in rec.values:
                continue
            mean, half, count = _cluster_paired(hub, "spechub", rec, other)
            rows.append(ClaimRow(f"SpecHub > {other.upper()}", f"{paper} (SpecHub paper, binary trees 3-31 nodes, T = 1)",
                                 f"head, binary tree of {2 ** (depth + 1) - 1} nodes, T = 1", f"BE(spechub) - BE({other})",
                                 mean, mean - half, mean + half, verdict(mean - half, mean + half, ">"),
                                 "same (prompt, seed), each rule on trees of its own scheme", count))
    # 5. Traversal >= token-level tree rules on the same without-replacement trees
    for depth in depths:
        rec = _find(points, family="binary", live_method="rrsw", tree=(2,) * depth)
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


# ----- plots and report -----------------------------------------------------------------------

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
        star = _find(points, family="star", live_method="spectr-gbv-star", num_drafts=point.meta["num_drafts"])
        if star is None or "spectr-gbv-star" not in star.values:
            continue
        mean, half, count = _cluster_paired(point, "spectr-gbv", star, "spectr-gbv-star")
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


# ----- live tokens/s of each rule's best point (issue 15 item 4) --------------------------------


@dataclass
class LiveBest:
    method: str
    point: str
    temperature: float
    replayed_be: float
    replayed_ci95: float
    live_be: float
    tokens_per_second: float
    plain_tokens_per_second: float
    speedup_median: float
    speedup_min: float
    speedup_max: float
    verify_ms_per_round: float
    draft_ms_per_round: float
    target_ms_per_round: float
    prompts: int


def best_points(replayed: list[ReplayedRecording], temperature: float) -> dict[str, ReplayedRecording]:
    """Per lossless rule, the head-draft point at ``temperature`` with the highest replayed BE."""
    best: dict[str, tuple[float, ReplayedRecording]] = {}
    for point in by_point(replayed).values():
        if point.meta.get("draft") != "head" or point.meta.get("temperature") != temperature:
            continue
        for method, values in point.values.items():
            if method in LOSSY:
                continue
            mean = cluster_mean_ci95(values, point.clusters)[0]
            if method not in best or mean > best[method][0]:
                best[method] = (mean, point)
    return {m: p for m, (_, p) in sorted(best.items())}


def run_live_best(replayed: list[ReplayedRecording], temperature: float, limit: int = 8, max_new_tokens: int = 32,
                  seed: int = 0, target=None, tokenizer=None, progress: bool = True) -> list[LiveBest]:
    """Each rule at its best point, live on HumanEval 0..limit-1, interleaved per prompt with plain
    decoding (rotating order, one process, the threads set by the caller): tokens/s and its ratio."""
    from verispec.bench.datasets import humaneval_prompts
    from verispec.bench.runner import prompt_seed
    from verispec.core.rng import SeededRng
    from verispec.engine.decoder import SpeculativeDecoder
    from verispec.models.default import encode_prompt

    if target is None:
        from verispec.models.default import load_default_target

        target, tokenizer = load_default_target()
    chosen = best_points(replayed, temperature)
    if not chosen:
        raise ConfigError(f"no head-draft recordings at T = {temperature:g} under the replay; record them first")
    decoders = {"plain": SpeculativeDecoder(target, None, tokenizer=tokenizer, method="ar", temperature=temperature,
                                            max_new_tokens=max_new_tokens)}
    not_run: dict[str, str] = {}
    for method, point in chosen.items():
        meta = point.meta
        # a chain rule's replay read path 0, a chain x ~ q: live it drafts that chain alone (K = 1)
        num_drafts = 1 if METHODS[method].draft == "chain" else meta["num_drafts"]
        try:
            decoders[method] = SpeculativeDecoder(
                target, "head", tokenizer=tokenizer, method=method, num_drafts=num_drafts, draft_len=meta["draft_len"],
                tree=list(meta["tree"]) if meta.get("tree") else None, temperature=temperature, max_new_tokens=max_new_tokens,
            )
        except ConfigError as error:  # e.g. qfree's live draft is the token tree, not sampled paths
            not_run[method] = str(error)
    chosen = {m: p for m, p in chosen.items() if m in decoders}
    prompts = humaneval_prompts(limit)
    outputs: dict[str, list] = {name: [] for name in decoders}
    names = list(decoders)
    for index, prompt in enumerate(prompts):
        ids = encode_prompt(tokenizer, prompt.text)
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:  # rotate the order per prompt
            outputs[name].append(decoders[name].generate(ids, rng=SeededRng(prompt_seed(seed, index))))
        if progress:
            print(f"live prompt {index + 1}/{len(prompts)} done", flush=True)
    plain = outputs["plain"]
    rows = []
    for method, point in chosen.items():
        runs = outputs[method]
        ratios = np.array([(r.new_tokens / r.seconds) / (p.new_tokens / p.seconds) for r, p in zip(runs, plain)])
        calls = sum(r.target_calls for r in runs)
        parts = {k: sum(r.time_breakdown()[k] for r in runs) * 1e3 / max(calls, 1) for k in ("verify", "draft", "target")}
        mean, half, _ = cluster_mean_ci95(point.values[method], point.clusters)
        rows.append(LiveBest(
            method, point.label, temperature, mean, half, sum(r.new_tokens for r in runs) / max(calls, 1),
            sum(r.new_tokens for r in runs) / sum(r.seconds for r in runs),
            sum(p.new_tokens for p in plain) / sum(p.seconds for p in plain),
            float(np.median(ratios)), float(ratios.min()), float(ratios.max()),
            parts["verify"], parts["draft"], parts["target"], len(runs),
        ))
    for method, reason in not_run.items():
        if progress:
            print(f"{method} not run live at its best point: {reason}", flush=True)
    return rows


def live_best_markdown(rows: list[LiveBest]) -> str:
    lines = ["| rule | best point (replayed BE) | T | replayed BE | live BE | tok/s | plain tok/s | speedup median (min / max over prompts) | verify / draft / target ms per round |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: -r.speedup_median):
        lines.append(f"| {r.method} | {r.point} | {r.temperature:g} | {r.replayed_be:.3f} ± {r.replayed_ci95:.3f} | {r.live_be:.3f} | "
                     f"{r.tokens_per_second:.1f} | {r.plain_tokens_per_second:.1f} | {r.speedup_median:.2f}x "
                     f"({r.speedup_min:.2f} / {r.speedup_max:.2f}) | {r.verify_ms_per_round:.1f} / {r.draft_ms_per_round:.1f} / "
                     f"{r.target_ms_per_round:.1f} |")
    return "\n".join(lines) + "\n"
