"""Record draft trees during a sweep and re-verify them with other rules (common random numbers).

Recording (``verispec bench --record``): the engine's ``step_callback`` hands every verified
``DraftTree`` (full float64 target vector of every node, draft vector of every internal node,
sampling scheme, raw paths) to a ``TreeRecorder``; the first ``record_limit`` rounds of each
configuration x dataset x temperature x seed are written to one compressed ``.npz`` file under
``OUT/trees/``, with the live run's accepted length of each round.

Replay (``verispec bench --replay DIR --methods ...``): every stored tree is verified by every
requested rule with ``tree_rng(seed, tree index, repeat)``, which does not depend on the rule, so
all rules see the same random numbers on the same tree (common random numbers): differences
between rules have far less variance than between independent runs. Replay block efficiency of
a tree = accepted_len + 1 (the tokens one target call would emit), averaged over ``repeats``
verifications of the tree. Rules whose
``supported_schemes`` exclude a tree's scheme are skipped, with the reason.

Target modifications (GBV-mod, SpecTr-GBV★, the published SpecTr-GBV; ALGORITHMS.md §4.3, §6):
a live run of such a rule verifies every round on target rows rewritten by the windows that earlier
rounds left. The recorder keeps both the rows as verified and, where windows were in force, the
model's own rows (``DraftTree.unmodified_target``). In replay,

  * the rule that made the windows (the recording's live rule, ``same_modification``) verifies
    the rows AS VERIFIED: the windows
    are applied as the live engine applied them. E over the live distribution of (tree, windows) of
    E[accepted | tree, windows] is the live per-round expectation, so replaying the rule on its own
    recording with fresh random numbers estimates its live block efficiency without bias;
  * every other rule verifies the model's own rows: its own live loop has no windows, and the trees
    of a lossless live rule follow the target's text law whatever rule ran live;
  * a modifying rule on a recording made by another live rule is skipped: the windows its own
    earlier rounds would have left are not in the recording (record with that rule live).

Chain view (``chain_view=True``): chain-only rules (sd, bv, gbv-mod) verify path 0 of a K-path tree
(a chain x ~ q on the same rows), so BV and the multi-path rules are compared on the same trees.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from verispec.core.rng import SeededRng
from verispec.core.rows import DenseRows
from verispec.core.tree import DraftScheme, DraftTree
from verispec.errors import ConfigError, VerispecError
from verispec.verify.registry import get_method

TREES_DIR = "trees"
Z95 = 1.959963984540054


@dataclass
class TreeRecorder:
    """Collects verified trees of one configuration run: at most ``per_prompt`` rounds of each
    prompt (None: no per-prompt cap; set ``current_prompt`` before each prompt) and ``limit`` in
    all. A per-prompt cap spreads a recording over many prompts, the unit of its intervals."""

    limit: int
    per_prompt: int | None = None
    trees: list[DraftTree] = field(default_factory=list)
    live_accepted_lens: list[int] = field(default_factory=list)
    prompt_ids: list[str] = field(default_factory=list)
    current_prompt: str = ""
    _kept_per_prompt: dict[str, int] = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if self.limit < 1 or (self.per_prompt is not None and self.per_prompt < 1):
            raise ConfigError(f"record limits must be >= 1, got limit={self.limit}, per_prompt={self.per_prompt}")

    def callback(self, tree: DraftTree, result, step) -> None:
        """The engine's step_callback(tree, result, step)."""
        kept = self._kept_per_prompt.get(self.current_prompt, 0)
        if len(self.trees) < self.limit and (self.per_prompt is None or kept < self.per_prompt):
            self._kept_per_prompt[self.current_prompt] = kept + 1
            self.trees.append(tree)
            self.live_accepted_lens.append(int(result.accepted_len))
            self.prompt_ids.append(self.current_prompt)

    def save(self, path: Path, meta: dict) -> Path | None:
        if not self.trees:
            return None
        save_trees(path, self.trees, self.live_accepted_lens, self.prompt_ids, meta)
        return path


def save_trees(path: Path, trees, live_accepted_lens, prompt_ids, meta: dict) -> None:
    """One compressed npz: the trees' nodes concatenated (offsets per tree), raw paths flattened."""
    path.parent.mkdir(parents=True, exist_ok=True)
    node_counts = [tree.num_nodes for tree in trees]
    paths = [path_ for tree in trees for path_ in tree.paths]
    np.savez_compressed(
        path,
        meta=np.array(json.dumps(meta)),
        node_offsets=np.concatenate([[0], np.cumsum(node_counts)]).astype(np.int64),
        tokens=np.concatenate([tree.tokens for tree in trees]),
        parents=np.concatenate([tree.parents for tree in trees]),
        target_probs=np.concatenate([tree.target_probs for tree in trees]),
        # the model's own rows of the trees verified under modification windows (in tree order)
        has_unmodified=np.array([tree.unmodified_target is not None for tree in trees]),
        unmodified_target_probs=np.concatenate(
            [tree.unmodified_target.dense() for tree in trees if tree.unmodified_target is not None]
            or [np.zeros((0, trees[0].vocab_size))]
        ),
        draft_probs=np.concatenate([tree.draft_probs for tree in trees]),
        schemes=np.array([tree.scheme.value for tree in trees]),
        paths_per_tree=np.array([tree.num_paths for tree in trees], dtype=np.int64),
        path_lengths=np.array([len(p) for p in paths], dtype=np.int64),
        path_nodes=np.array([node for p in paths for node in p], dtype=np.int64),
        live_accepted_lens=np.array(live_accepted_lens, dtype=np.int64),
        prompt_ids=np.array(prompt_ids),
    )


@dataclass
class RecordedTrees:
    """The trees of one recorded configuration, with the live run's accepted lengths."""

    path: Path
    meta: dict
    trees: list[DraftTree]
    live_accepted_lens: list[int]
    prompt_ids: list[str]

    @property
    def source(self) -> str:
        return self.meta.get("label", self.path.stem)


def load_trees(path: str | Path) -> RecordedTrees:
    """The trees of one recording. Every array is read from the archive ONCE (an ``NpzFile``
    decompresses a member again on every access, and each tree's rows are views into it)."""
    path = Path(path)
    with np.load(path, allow_pickle=False) as archive:
        data = {name: archive[name] for name in archive.files}
    offsets = data["node_offsets"]
    path_lengths, path_nodes = data["path_lengths"], data["path_nodes"]
    path_starts = np.concatenate([[0], np.cumsum(path_lengths)])
    # recordings made before the unmodified rows were stored have no such arrays
    has_unmodified = data.get("has_unmodified", np.zeros(len(data["schemes"]), bool))
    unmodified = data.get("unmodified_target_probs")
    tokens, parents, target, draft = data["tokens"], data["parents"], data["target_probs"], data["draft_probs"]
    trees, path_index, unmodified_at = [], 0, 0
    for index, scheme in enumerate(data["schemes"]):
        lo, hi = int(offsets[index]), int(offsets[index + 1])
        paths = []
        for _ in range(int(data["paths_per_tree"][index])):
            paths.append(tuple(int(n) for n in path_nodes[path_starts[path_index]:path_starts[path_index + 1]]))
            path_index += 1
        tree = DraftTree.build(tokens[lo:hi], parents[lo:hi], target[lo:hi], draft[lo:hi], DraftScheme(str(scheme)),
                               paths=paths, validate=False)
        if has_unmodified[index]:
            tree = replace(tree, unmodified_target=DenseRows(unmodified[unmodified_at : unmodified_at + hi - lo]))
            unmodified_at += hi - lo
        trees.append(tree)
    return RecordedTrees(
        path, json.loads(str(data["meta"])), trees,
        [int(t) for t in data["live_accepted_lens"]], [str(p) for p in data["prompt_ids"]],
    )


def find_recordings(directory: str | Path) -> list[Path]:
    """The .npz recordings under DIR/trees (or DIR itself)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ConfigError(f"replay directory {str(directory)!r} not found; give the --out folder of a --record run")
    files = sorted((directory / TREES_DIR).glob("*.npz")) or sorted(directory.glob("*.npz"))
    if not files:
        raise ConfigError(f"no recorded trees (*.npz) in {directory} or {directory / TREES_DIR}; run verispec bench --record first")
    return files


def mean_ci95(values) -> tuple[float, float]:
    """Mean and half-width of its normal-approximation 95% confidence interval."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return math.nan, math.nan
    if values.size == 1:
        return float(values[0]), math.nan
    return float(values.mean()), float(Z95 * values.std(ddof=1) / math.sqrt(values.size))


def cluster_mean_ci95(values, clusters) -> tuple[float, float, int]:
    """(mean, 95% half-width, number of clusters) of per-tree ``values`` whose trees come in
    dependent groups (the rounds of one prompt and seed): the mean of the per-cluster means, with a
    Student-t interval over clusters (scipy.stats.t, clusters - 1 degrees of freedom). Per-tree
    intervals would treat the rounds of one prompt as independent and come out too narrow.
    Fewer than 2 clusters: the half-width is NaN."""
    from scipy import stats

    values = np.asarray(values, dtype=np.float64)
    clusters = np.asarray(clusters)
    if values.shape != clusters.shape:
        raise ConfigError(f"{values.shape[0]} values but {clusters.shape[0]} cluster labels")
    if values.size == 0:
        return math.nan, math.nan, 0
    labels, inverse = np.unique(clusters, return_inverse=True)
    means = np.bincount(inverse, weights=values) / np.bincount(inverse)
    if len(means) < 2:
        return float(means.mean()), math.nan, len(means)
    half = stats.t.ppf(0.975, len(means) - 1) * means.std(ddof=1) / math.sqrt(len(means))
    return float(means.mean()), float(half), len(means)


@dataclass
class LiveVsReplay:
    """One recording: the live run's BE and its live rule's replayed BE on the same trees, each
    with a 95% interval over prompt clusters (``cluster_mean_ci95``)."""

    source: str
    method: str
    num_trees: int
    num_prompts: int
    live: float
    live_ci95: float
    replayed: float
    replayed_ci95: float

    @property
    def agree(self) -> bool:
        """The two intervals overlap."""
        return abs(self.live - self.replayed) <= self.live_ci95 + self.replayed_ci95


def compare_live_and_replay(source: str, method: str, live_be, replayed_be, clusters) -> LiveVsReplay:
    """Live BE and replayed BE of the same trees (per-tree arrays), intervals over ``clusters``."""
    live, live_ci, prompts = cluster_mean_ci95(live_be, clusters)
    replayed, replayed_ci, _ = cluster_mean_ci95(replayed_be, clusters)
    return LiveVsReplay(source, method, len(live_be), prompts, live, live_ci, replayed, replayed_ci)


def live_vs_replay(recording: RecordedTrees, stats: list["ReplayStat"]) -> LiveVsReplay | None:
    """The recording's live BE beside the replayed BE of its own live rule (None when that rule was
    not replayed). Unbiased replay predicts agreement for every rule, the modifying ones included."""
    method = recording.meta.get("method")
    found = [s for s in stats if s.method == method and s.source == recording.source]
    if not found:
        return None
    return compare_live_and_replay(recording.source, method, np.asarray(recording.live_accepted_lens) + 1.0,
                                   found[0].per_tree, recording.prompt_ids)


def live_vs_replay_markdown(rows: list[LiveVsReplay]) -> str:
    lines = [
        "| recording | live rule | trees | clusters | live BE | replayed BE | intervals overlap |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(f"| {row.source} | {row.method} | {row.num_trees} | {row.num_prompts} | {row.live:.3f} ± {row.live_ci95:.3f} "
                     f"| {row.replayed:.3f} ± {row.replayed_ci95:.3f} | {'yes' if row.agree else 'NO'} |")
    return "\n".join(lines) + "\n"


@dataclass
class ReplayStat:
    """BE = accepted_len + 1 of one rule over the trees of one recording.

    diff_vs_reference: paired mean (and CI) of this rule's BE minus the reference rule's (the
    first replayed rule) on the same trees with the same random numbers."""

    source: str
    method: str
    num_trees: int
    block_efficiency: float
    ci95: float
    std: float
    reference: str
    diff_vs_reference: float
    diff_ci95: float
    per_tree: list[float] = field(default_factory=list, repr=False)


@dataclass
class ReplayReport:
    stats: list[ReplayStat]
    skipped: list[tuple[str, str, str]]  # (source, method, reason)
    live: dict[str, tuple[float, float, int]]  # source -> (mean live BE, ci95, trees)
    methods: list[str]

    def to_dict(self) -> dict:
        return {
            "definition": "replay BE per tree = accepted_len + 1; ± = 95% CI (normal approximation); "
            "common random numbers: the same SeededRng((seed, tree index, repeat)) for every rule",
            "stats": [{k: v for k, v in stat.__dict__.items() if k != "per_tree"} for stat in self.stats],
            "skipped": [{"source": s, "method": m, "reason": r} for s, m, r in self.skipped],
            "live": {s: {"block_efficiency": m, "ci95": c, "num_trees": n} for s, (m, c, n) in self.live.items()},
        }


def tree_rng(seed: int, index: int, repeat: int = 0) -> SeededRng:
    """The Rng of tree ``index`` (and repeat): the same for every rule (common random numbers)."""
    return SeededRng(np.random.default_rng([int(seed), int(index), int(repeat)]))


def same_modification(method: str, live_method: str | None) -> bool:
    """Whether ``method`` leaves the modification windows that the live rule of a recording left:
    only the same rule does (at K = 1 gbv-mod, spectr-gbv and ★ may agree in law, but their windows
    are not shown to be the same, so none stands in for another)."""
    return method == live_method


def path_zero_chain(tree: DraftTree) -> DraftTree:
    """Path 0 of a K-i.i.d.-path tree as a chain on the same rows: a draft x ~ q of its own (the
    paths are independent), for chain rules in ``chain_view`` replay."""
    if tree.scheme is not DraftScheme.IID_PATHS or not tree.paths:
        raise ConfigError(f"the chain view needs a tree of K i.i.d. paths, got scheme {tree.scheme.value}")
    nodes = np.array([0, *tree.paths[0]], dtype=np.int64)
    chain = DraftTree.build(
        tree.tokens[nodes], np.arange(-1, len(nodes) - 1), tree.target.dense()[nodes], tree.draft.dense()[nodes],
        DraftScheme.CHAIN, paths=[tuple(range(1, len(nodes)))], validate=False,
    )
    if tree.unmodified_target is not None:
        chain = replace(chain, unmodified_target=DenseRows(tree.unmodified_target.dense()[nodes]))
    return chain


def tree_for_rule(method: str, tree: DraftTree, chain_view: bool, modified_rows: bool) -> DraftTree:
    """The tree ``method`` verifies: path 0 in the chain view, and the model's own rows unless the
    method replays the windows the live run applied."""
    spec = get_method(method)
    if chain_view and spec.draft == "chain" and tree.scheme is DraftScheme.IID_PATHS:
        tree = path_zero_chain(tree)
    if not modified_rows and tree.unmodified_target is not None:
        tree = replace(tree, target=tree.unmodified_target, unmodified_target=None)
    return tree


def _replay_rule(recording: RecordedTrees, method: str, seed: int, repeats: int, chain_view: bool):
    """Per-tree mean BE of one rule, or the reason it cannot be replayed on this recording."""
    spec = get_method(method)
    live = recording.meta.get("method")
    modified_rows = spec.verifier.needs_target_modification
    if modified_rows and not same_modification(method, live):
        return None, (f"{method} carries a target modification into later rounds, and this recording's live rule "
                      f"({live}) left other windows (or none); record with {method} live (--methods {method}) to replay it")
    trees = [tree_for_rule(method, tree, chain_view, modified_rows) for tree in recording.trees]
    unsupported = {tree.scheme for tree in trees} - set(spec.verifier.supported_schemes)
    if unsupported:
        allowed = ", ".join(sorted(s.value for s in spec.verifier.supported_schemes))
        hint = " (a chain rule verifies path 0 of K-path trees with chain_view=True)" if spec.draft == "chain" else ""
        return None, (f"recorded scheme {', '.join(sorted(s.value for s in unsupported))} is not among {method}'s "
                      f"supported schemes ({allowed}){hint}")
    try:
        return [
            float(np.mean([spec.verifier.verify(tree, tree_rng(seed, index, r)).accepted_len + 1 for r in range(repeats)]))
            for index, tree in enumerate(trees)
        ], None
    except VerispecError as error:
        return None, f"{type(error).__name__}: {error}"


def replay_recording(recording: RecordedTrees, methods: list[str], seed: int = 0, repeats: int = 1,
                     chain_view: bool = False):
    """(stats, skipped) of every rule in ``methods`` on one recording. Each tree's BE is the mean
    of accepted_len + 1 over ``repeats`` verifications with independent common random numbers.
    Rows and views per rule: see the module docstring."""
    per_rule: dict[str, list[float]] = {}
    skipped: list[tuple[str, str, str]] = []
    for method in methods:
        values, reason = _replay_rule(recording, method, seed, repeats, chain_view)
        if values is None:
            skipped.append((recording.source, method, reason))
        else:
            per_rule[method] = values
    stats = []
    reference = next(iter(per_rule), None)
    for method, values in per_rule.items():
        mean, ci = mean_ci95(values)
        diff, diff_ci = mean_ci95(np.asarray(values) - np.asarray(per_rule[reference]))
        stats.append(ReplayStat(
            recording.source, method, len(values), mean, ci,
            float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
            reference, diff, diff_ci, list(values),
        ))
    return stats, skipped


def replay(directory: str | Path, methods: list[str], seed: int = 0, repeats: int = 1, chain_view: bool = False) -> ReplayReport:
    """Re-verify every tree recorded under ``directory`` with every rule in ``methods``."""
    if repeats < 1:
        raise ConfigError(f"replay repeats must be >= 1, got {repeats}")
    if not methods:
        raise ConfigError("replay needs --methods, e.g. --methods sd,bv,gbv-mod")
    for method in methods:
        get_method(method)
    stats, skipped, live = [], [], {}
    for path in find_recordings(directory):
        recording = load_trees(path)
        rule_stats, rule_skipped = replay_recording(recording, methods, seed, repeats, chain_view)
        stats.extend(rule_stats)
        skipped.extend(rule_skipped)
        mean, ci = mean_ci95([tau + 1 for tau in recording.live_accepted_lens])
        live[recording.source] = (mean, ci, len(recording.trees))
    return ReplayReport(stats, skipped, live, list(methods))


def replay_markdown(report: ReplayReport) -> str:
    """Sources as rows, rules as columns: mean replay BE ± 95% CI, and the paired difference
    against the first rule."""
    lines = [
        "# verispec replay",
        "",
        "Replay BE per tree = accepted_len + 1; ± = 95% CI. Every rule verifies the same recorded "
        "trees with the same random numbers (SeededRng((seed, tree index, repeat))); Δ = paired "
        "difference against the first rule, ± its 95% CI. 'live' = the recorded run's own rounds.",
        "",
    ]
    methods = [m for m in report.methods if any(s.method == m for s in report.stats)]
    header = ["source", "trees", "live BE", *methods, *[f"Δ {m} − {methods[0]}" for m in methods[1:]]]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    by_source: dict[str, dict[str, ReplayStat]] = {}
    for stat in report.stats:
        by_source.setdefault(stat.source, {})[stat.method] = stat
    for source, (live_mean, live_ci, trees) in report.live.items():
        cells = [source, str(trees), f"{live_mean:.3f} ± {live_ci:.3f}"]
        stats = by_source.get(source, {})
        cells += [f"{stats[m].block_efficiency:.3f} ± {stats[m].ci95:.3f}" if m in stats else "skipped" for m in methods]
        cells += [
            f"{stats[m].diff_vs_reference:+.3f} ± {stats[m].diff_ci95:.3f}" if m in stats and stats[m].reference == methods[0] else "–"
            for m in methods[1:]
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if report.skipped:
        lines += ["", "Skipped:", ""]
        lines += [f"- {method} on {source}: {reason}" for source, method, reason in report.skipped]
    return "\n".join(lines) + "\n"


def write_replay(report: ReplayReport, out_dir: str | Path) -> dict[str, Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"md": out_dir / "replay.md", "json": out_dir / "replay.json", "csv": out_dir / "replay.csv"}
    paths["md"].write_text(replay_markdown(report))
    paths["json"].write_text(json.dumps(report.to_dict(), indent=1))
    columns = ["source", "method", "num_trees", "block_efficiency", "ci95", "std", "reference", "diff_vs_reference", "diff_ci95"]
    with paths["csv"].open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        writer.writerows([getattr(stat, c) for c in columns] for stat in report.stats)
    return paths
