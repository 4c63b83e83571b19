"""Stage 2 of ``verispec compare``, ``report`` (first half): every rule re-verifies the recordings.

Every lossless rule that supports a recording's sampling scheme re-verifies its trees with common
random numbers (``bench.replay.tree_rng``: the same stream for every rule on a tree), chain rules on
path 0 of K-path trees, modifying rules only on their own recordings (``bench.replay``'s module
docstring says why). Per-tree values are cached in ``OUT/replay/``. The recordings of one grid
point over seeds pool into one ``ReplayedRecording`` (``by_point``), whose clusters stay
(seed, prompt): the rounds of one prompt are dependent.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from verispec.bench.replay import RecordedTrees, find_recordings, load_trees, replay_recording, tree_for_rule
from verispec.core.tree import DraftScheme
from verispec.errors import ConfigError


REPLAY_DIR = "replay"


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


def find_point(points: dict[str, ReplayedRecording], **want) -> ReplayedRecording | None:
    for point in points.values():
        meta = point.meta
        if all((tuple(meta.get(k)) if isinstance(meta.get(k), list) else meta.get(k)) == v for k, v in want.items()):
            return point
    return None


def paired_difference(first: ReplayedRecording, a: str, second: ReplayedRecording, b: str):
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
