"""``verispec compare``: the per-chain expectations are exact, the interval and verdict logic is
right on known data, and the report stage turns recordings into a claims table and plots."""

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import toy_pair
from verispec.bench.compare import (
    CANNOT_TELL, FAILS, HOLDS, GridPoint, RecordConfig, cluster_bootstrap_ratio, default_grid, make_grid,
    expected_block_efficiency_given_chain, replay_all, verdict, write_compare_report,
)
from verispec.bench.replay import TreeRecorder
from verispec.core.tree import DraftTree
from verispec.engine.decoder import SpeculativeDecoder
from verispec.errors import ConfigError
from verispec.theory import closed_forms as cf


def _every_drafted_chain(target, draft, vocab: int, length: int):
    """(Q(x), chain tree) for every chain x of ``length`` tokens the draft can produce (Q(x) > 0)."""
    for chain in itertools.product(range(vocab), repeat=length):
        prefixes = [chain[:i] for i in range(length + 1)]
        q_rows = np.array([draft(p) for p in prefixes[:-1]])
        weight = float(np.prod([q_rows[i][chain[i]] for i in range(length)]))
        if weight > 0.0:
            yield weight, DraftTree.chain(chain, np.array([target(p) for p in prefixes]), q_rows)


@pytest.mark.parametrize("method,closed_form", [("sd", cf.expected_len_sd), ("bv", cf.expected_len_bv)])
@pytest.mark.parametrize("vocab,length", [(3, 2), (4, 3)])
def test_per_chain_expectation_averages_to_the_closed_form(method, closed_form, vocab, length):
    """Sum over every chain x ~ q of Q(x) E[BE | x] equals 1 + E[tau] of the rule's closed form
    (exact zeros in both models: chains with q = 0 never appear, p = 0 stops the product)."""
    target, draft = toy_pair(vocab, seed=7 + length)
    total = sum(weight * expected_block_efficiency_given_chain(method, tree)
                for weight, tree in _every_drafted_chain(target, draft, vocab, length))
    assert total == pytest.approx(1.0 + closed_form(target, draft, length), abs=1e-12)


def test_bv_per_chain_expectation_is_never_below_sd():
    """w_i >= prod_{j <= i} min(1, r_j) on every chain (§3's capped weight against SD's product), and
    strictly above where a ratio r > 1 is followed by one < 1: the closed-form gain note of the
    BV >= SD claim rests on this."""
    target, draft = toy_pair(4, seed=3)
    gaps = [expected_block_efficiency_given_chain("bv", tree) - expected_block_efficiency_given_chain("sd", tree)
            for _, tree in _every_drafted_chain(target, draft, 4, 3)]
    assert len(gaps) > 20 and min(gaps) >= -1e-15 and max(gaps) > 0.01


def test_per_chain_expectation_refuses_other_rules():
    target, draft = toy_pair(3, seed=1)
    tree = DraftTree.chain([0], np.array([target(()), target((0,))]), np.array([draft(())]))
    with pytest.raises(ConfigError, match="only sd and bv"):
        expected_block_efficiency_given_chain("gmpbv", tree)


def test_verdicts():
    assert verdict(0.1, 0.3, ">") == HOLDS and verdict(-0.3, -0.1, ">") == FAILS and verdict(-0.1, 0.2, ">") == CANNOT_TELL
    assert verdict(-0.3, -0.1, "<") == HOLDS and verdict(math.nan, 1.0, ">") == CANNOT_TELL


def test_cluster_bootstrap_ratio_on_known_data():
    rng = np.random.default_rng(1)
    clusters = np.repeat(np.arange(20), 10)
    base = 1.5 + rng.normal(0, 0.3, size=20)[clusters]
    better = base * 1.2 + rng.normal(0, 0.05, size=200)
    ratio, low, high = cluster_bootstrap_ratio(better, base, clusters)
    assert ratio == pytest.approx(0.2, abs=0.01) and low < ratio < high and 0.005 < high - low < 0.05
    ratio, low, high = cluster_bootstrap_ratio(base, base, clusters)
    assert ratio == 0.0 and low == high == 0.0
    assert math.isnan(cluster_bootstrap_ratio([1.0], [1.0], ["a"])[1])


def test_default_grid_sweeps_what_the_issue_asks():
    grid = default_grid()
    paths = [p for p in grid if p.family == "paths"]
    assert {p.num_drafts for p in paths if p.draft_len == 4 and p.temperature == 0.6} == {1, 2, 3, 4}
    assert {p.draft_len for p in paths if p.num_drafts == 2 and p.temperature == 0.6} == {2, 4, 6, 8}
    assert {p.temperature for p in paths if p.num_drafts == 2 and p.draft_len == 4} == {0.3, 0.6, 1.0}
    binary = [p for p in grid if p.family == "binary"]
    assert sorted({p.nodes for p in binary}) == [3, 7, 15, 31]
    assert {p.live_method for p in binary} == {"rrs", "rrsw", "spechub"}
    # the modifying rules run live only on the self-draft (the engine refuses them with the head)
    assert all(p.draft == "self" for p in grid if p.live_method in ("spectr-gbv-star", "spectr-gbv", "gbv-mod"))
    assert len({p.label for p in grid}) == len(grid)
    small = make_grid([1, 3], [3], [0.8], [2], families=["paths", "binary"])
    assert {(p.num_drafts, p.draft_len, p.temperature) for p in small if p.family == "paths"} == {(1, 3, 0.8), (3, 3, 0.8)}
    assert {p.nodes for p in small if p.family == "binary"} == {7}


def test_record_config_keeps_to_held_out_prompts(tmp_path):
    with pytest.raises(ConfigError, match="held-out"):
        RecordConfig(start=35, limit=10).validate()
    with pytest.raises(ConfigError, match=">= 2 prompts"):
        RecordConfig(limit=1).validate()
    with pytest.raises(ConfigError, match="positive values"):
        RecordConfig(temperatures=[0.0]).validate()
    spec_bench = tmp_path / "q.jsonl"
    spec_bench.write_text("".join(json.dumps({"question_id": i, "category": c, "turns": [f"q{i}"]}) + "\n"
                                  for i, c in [(1, "a"), (5, "a"), (10, "a"), (15, "b"), (16, "b")]))
    prompts = RecordConfig(dataset=str(spec_bench), limit=1).prompts()
    assert [p.prompt_id for p in prompts] == ["5", "15"]  # ids divisible by 5, limit per category


def _record(tiny_pair, out: Path, point: GridPoint, seed: int):
    """What ``record_point`` saves, from the tiny pair (no tokenizer, no HumanEval)."""
    target, draft, _ = tiny_pair
    recorder = TreeRecorder(limit=10_000, per_prompt=6)
    decoder = SpeculativeDecoder(target, draft, method=point.live_method, num_drafts=point.num_drafts,
                                 draft_len=point.draft_len, tree=list(point.tree) if point.tree else None,
                                 temperature=point.temperature, max_new_tokens=24, eos_token_id=[], seed=seed,
                                 step_callback=recorder.callback)
    live = []
    for index in range(6):
        recorder.current_prompt = f"p{index}"
        output = decoder.generate([1, 2, index + 3])
        live.append({"prompt_id": f"p{index}", "new_tokens": output.new_tokens, "target_calls": output.target_calls,
                     "seconds": output.seconds, **{f"{k}_seconds": v for k, v in output.time_breakdown().items()}})
    from dataclasses import asdict

    meta = {**asdict(point), "method": point.live_method, "K": point.num_drafts, "L": point.draft_len, "seed": seed,
            "label": f"{point.label}__s{seed}", "live": live, "draft_temperature": None}
    recorder.save(out / "trees" / f"{meta['label']}.npz", meta)


def test_report_stage_end_to_end(tiny_pair, tmp_path):
    points = [GridPoint("paths", "gmpbv", "head", k, 4, 0.6) for k in (1, 2)]
    points += [GridPoint("paths", "gmpbv", "head", 2, length, 0.6) for length in (2, 8)]
    points += [GridPoint("star", "spectr-gbv-star", "self", 2, 4, 0.6)]
    points += [GridPoint("binary", live, "head", 2, depth, 1.0, tree=(2,) * depth) for live in ("rrs", "rrsw", "spechub")
               for depth in (1, 2)]
    for point in points:
        for seed in (0, 1):
            _record(tiny_pair, tmp_path, point, seed)
    replayed = replay_all(tmp_path, repeats=2, progress=False)
    assert len(replayed) == 2 * len(points)
    star = next(r for r in replayed if r.meta["family"] == "star")
    assert "spectr-gbv-star" in star.values and "gbv-mod" in star.skipped
    paths = write_compare_report(tmp_path, replayed, "verispec compare report --out X")
    claims = json.loads(paths["json"].read_text())
    assert isinstance(claims, list)
    for record in claims:  # the interface other tools read (issue 15)
        assert {"claim", "paper_value", "measured", "ci_low", "ci_high", "verdict"} <= set(record)
    import csv

    table = list(csv.DictReader(paths["csv"].open()))
    assert {"rule", "K", "L", "temperature", "block_efficiency", "ci_low", "ci_high"} <= set(table[0])
    assert {r["rule"] for r in table} >= {"sd", "bv", "gmpbv", "spechub", "rrs", "rrsw", "traversal"}
    names = {c["claim"] for c in claims}
    assert "BV >= SD (block efficiency, same chain)" in names
    assert "GMPBV improves block efficiency over BV" in names
    assert {"SpecHub > RRS", "SpecHub > RRSW", "Traversal >= NSS"} <= names
    assert any(c["claim"].startswith("Closed form predicts") for c in claims)
    bv_rows = [c for c in claims if c["claim"].startswith("BV >= SD")]
    assert bv_rows and all(c["note"].startswith("closed-form expected gain on these chains: +") for c in bv_rows)
    assert all(c["verdict"] in (HOLDS, FAILS, CANNOT_TELL) for c in claims)
    assert all(c["ci_low"] <= c["measured"] <= c["ci_high"] for c in claims if not math.isnan(c["ci_low"]))
    # plots only for swept dimensions: K (1, 2) and L (2, 4, 8) and tree nodes (3, 7); T was not swept
    assert {"be_vs_K", "be_vs_L", "be_vs_nodes", "live_breakdown"} <= set(paths) and "be_vs_T" not in paths
    text = paths["md"].read_text()
    assert "## Claims" in text and "Live vs replayed" in text and "plots/be_vs_K.png" in text
    # the cache: a second report reads it instead of replaying
    again = replay_all(tmp_path, repeats=2, progress=False)
    assert [r.label for r in again] == [r.label for r in replayed]
    assert all(np.array_equal(a.values[m], b.values[m]) for a, b in zip(again, replayed) for m in a.values)
    from verispec.cli.main import main

    paths["json"].unlink()
    assert main(["compare", "report", "--out", str(tmp_path), "--repeats", "2"]) == 0  # reads the cache
    assert json.loads(paths["json"].read_text()) == claims
    assert main(["compare", "report", "--out", str(tmp_path), "--shard", "2/2"]) == 2  # a clear error, no traceback
    halves = [replay_all(tmp_path, repeats=2, progress=False, shard=(i, 2)) for i in (0, 1)]
    assert sorted(r.label for half in halves for r in half) == sorted(r.label for r in replayed)
    assert not {r.label for r in halves[0]} & {r.label for r in halves[1]}


def test_plot_axes_have_integer_ticks_and_units(tiny_pair, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from verispec.bench.compare import by_point, plot_block_efficiency

    for k in (1, 3):
        _record(tiny_pair, tmp_path, GridPoint("paths", "gmpbv", "head", k, 3, 1.0), 0)
        _record(tiny_pair, tmp_path, GridPoint("paths", "gmpbv", "head", k, 3, 1.0), 1)
    points = by_point(replay_all(tmp_path, repeats=1, progress=False))
    import matplotlib.pyplot as plt

    captured = {}
    original = plt.Figure.savefig

    def keep(fig, *args, **kwargs):
        captured["ax"] = fig.axes[0]
        return original(fig, *args, **kwargs)

    plt.Figure.savefig = keep
    try:
        path = plot_block_efficiency(points, "paths", "num_drafts", {"draft_len": 3}, ["sd", "gmpbv"], tmp_path / "k.png",
                                     "title", "K (drafted paths)", True)
    finally:
        plt.Figure.savefig = original
    ax = captured["ax"]
    assert path.is_file() and list(ax.get_xticks()) == [1, 3]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "3"]
    assert "tokens per target call" in ax.get_ylabel() and "95% CI" in ax.get_title().replace("\n", " ")
    assert plot_block_efficiency(points, "paths", "draft_len", {}, ["sd"], tmp_path / "l.png", "t", "L", True) is None
