"""Replay of the modifying rules (GBV-mod, SpecTr-GBV★): the recorder keeps the rows as verified
and the model's own rows; a modifying rule replays its own windows, every other rule the model's
rows; chain rules verify path 0 of K-path trees; intervals are over prompts."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from verispec.bench.replay import (
    RecordedTrees, TreeRecorder, cluster_mean_ci95, live_vs_replay, live_vs_replay_markdown, load_trees,
    path_zero_chain, replay_recording, tree_rng,
)
from verispec.core.tree import DraftScheme, DraftTree
from verispec.engine.decoder import SpeculativeDecoder
from verispec.errors import ConfigError
from verispec.verify.registry import get_method

PROMPTS = 8


def record(tiny_pair, method: str, num_drafts: int, per_prompt=None, max_new_tokens=200) -> RecordedTrees:
    """A live run of ``method`` over PROMPTS prompts (one seed each), every round recorded."""
    target, draft, _ = tiny_pair
    recorder = TreeRecorder(limit=100_000, per_prompt=per_prompt)
    for index in range(PROMPTS):
        recorder.current_prompt = f"p{index}"
        decoder = SpeculativeDecoder(target, draft, method=method, num_drafts=num_drafts, draft_len=4, temperature=1.0,
                                     max_new_tokens=max_new_tokens, eos_token_id=[], seed=index, step_callback=recorder.callback)
        decoder.generate([1, 2, 3, 4 + index])
    meta = {"method": method, "K": num_drafts, "L": 4, "label": f"{method}-K{num_drafts}"}
    return RecordedTrees(Path(meta["label"]), meta, recorder.trees, recorder.live_accepted_lens, recorder.prompt_ids)


@pytest.fixture(scope="module")
def star(tiny_pair):
    return record(tiny_pair, "spectr-gbv-star", 2)


@pytest.fixture(scope="module")
def gbv(tiny_pair):
    return record(tiny_pair, "gbv-mod", 1)


def modified_trees(recording):
    return [t for t in recording.trees if t.unmodified_target is not None]


def test_windows_in_force_are_recorded_with_both_rows(star, tmp_path):
    modified = modified_trees(star)
    assert 10 < len(modified) < len(star.trees)  # windows in force in some rounds, not all
    assert all(not np.array_equal(t.target_probs, t.unmodified_target.dense()) for t in modified)
    recorder = TreeRecorder(limit=10_000)
    recorder.trees, recorder.live_accepted_lens, recorder.prompt_ids = star.trees, star.live_accepted_lens, star.prompt_ids
    recorder.save(tmp_path / "star.npz", dict(star.meta))
    back = load_trees(tmp_path / "star.npz")
    assert back.meta["method"] == "spectr-gbv-star"
    for original, loaded in zip(star.trees, back.trees):
        assert np.array_equal(loaded.target_probs, original.target_probs)
        assert (loaded.unmodified_target is None) == (original.unmodified_target is None)
        if original.unmodified_target is not None:
            assert np.array_equal(loaded.unmodified_target.dense(), original.unmodified_target.dense())


def test_each_rule_replays_the_rows_its_live_loop_would_see(star):
    """★ on its own recording: the rows as verified; spectr (no windows of its own): the model's
    rows. Checked tree by tree against direct verification with the same random numbers."""
    stats, skipped = replay_recording(star, ["spectr-gbv-star", "spectr"], seed=3)
    assert not skipped
    per_rule = {s.method: s.per_tree for s in stats}
    for index, tree in enumerate(star.trees):
        own = tree if tree.unmodified_target is None else replace(tree, target=tree.unmodified_target)
        expected_star = get_method("spectr-gbv-star").verifier.verify(tree, tree_rng(3, index)).accepted_len + 1
        expected_spectr = get_method("spectr").verifier.verify(own, tree_rng(3, index)).accepted_len + 1
        assert per_rule["spectr-gbv-star"][index] == expected_star
        assert per_rule["spectr"][index] == expected_spectr


def test_a_modifying_rule_needs_its_own_recording(star, gbv):
    _, skipped = replay_recording(star, ["gmpbv", "gbv-mod"], chain_view=True)
    assert [m for _, m, _ in skipped] == ["gbv-mod"]
    assert "record with gbv-mod live" in skipped[0][2]
    _, skipped = replay_recording(gbv, ["spectr-gbv-star", "gbv-mod"])
    assert [m for _, m, _ in skipped] == ["spectr-gbv-star"]  # K = 1 windows of gbv-mod are not ★'s by name


def test_replaying_gbv_mod_without_its_windows_is_detectably_wrong(gbv):
    """Negative control: the same trees and random numbers on the model's rows overstate GBV-mod
    (its modification lowers later rounds' acceptance). Paired differences over 8 prompts; the
    measured gap on this pair is ~0.26 tokens, its 95% half-width ~0.1."""
    stats, _ = replay_recording(gbv, ["gbv-mod"], repeats=4)
    unmodified = RecordedTrees(gbv.path, gbv.meta, [
        replace(t, target=t.unmodified_target, unmodified_target=None) if t.unmodified_target is not None else t
        for t in gbv.trees], gbv.live_accepted_lens, gbv.prompt_ids)
    wrong, _ = replay_recording(unmodified, ["gbv-mod"], repeats=4)
    gap, half, _ = cluster_mean_ci95(np.asarray(wrong[0].per_tree) - np.asarray(stats[0].per_tree), gbv.prompt_ids)
    assert gap - half > 0


@pytest.mark.parametrize("fixture", ["star", "gbv"])
def test_replayed_block_efficiency_agrees_with_the_live_run(fixture, request):
    """Unbiased replay: live BE and the live rule's replayed BE on the same trees, 95% intervals
    over 8 prompts; each interval misses its mean with probability 5%, so an overlap failure
    (a gap beyond the sum of the half-widths) has a false-alarm rate well below 1%."""
    recording = request.getfixturevalue(fixture)
    stats, _ = replay_recording(recording, [recording.meta["method"]], seed=11, repeats=4)
    row = live_vs_replay(recording, stats)
    assert row.num_prompts == PROMPTS and row.num_trees == len(recording.trees)
    assert row.agree, row
    assert "| yes |" in live_vs_replay_markdown([row])


def test_chain_view_verifies_path_zero_as_a_chain(star):
    tree = next(t for t in star.trees if t.unmodified_target is None and len(t.paths) == 2)
    chain = path_zero_chain(tree)
    nodes = [0, *tree.paths[0]]
    direct = DraftTree.chain(tree.tokens[nodes[1:]], tree.target_probs[nodes], tree.draft_probs[nodes[:-1]])
    assert chain.scheme is DraftScheme.CHAIN and np.array_equal(chain.tokens, direct.tokens)
    bv = get_method("bv").verifier
    for repeat in range(20):
        assert bv.verify(chain, tree_rng(0, 0, repeat)) == bv.verify(direct, tree_rng(0, 0, repeat))
    stats, skipped = replay_recording(star, ["sd", "bv"], chain_view=True)
    assert not skipped and all(len(s.per_tree) == len(star.trees) for s in stats)
    _, skipped = replay_recording(star, ["bv"])
    assert "chain_view=True" in skipped[0][2]
    with pytest.raises(ConfigError, match="K i.i.d. paths"):
        path_zero_chain(chain)


def test_per_prompt_cap_spreads_a_recording_over_prompts(tiny_pair):
    recording = record(tiny_pair, "sd", 1, per_prompt=3, max_new_tokens=60)
    counts = {p: recording.prompt_ids.count(p) for p in set(recording.prompt_ids)}
    assert len(counts) == PROMPTS and set(counts.values()) == {3}
    with pytest.raises(ConfigError, match="record limits"):
        TreeRecorder(limit=5, per_prompt=0)


def test_cluster_interval_is_wider_than_the_naive_one_on_correlated_rounds():
    """Rounds of one prompt share its difficulty: the per-tree interval ignores that and is too
    narrow; the interval over prompt means is not."""
    rng = np.random.default_rng(0)
    prompt_effect = rng.normal(0, 1, size=10)
    clusters = np.repeat(np.arange(10), 30)
    values = prompt_effect[clusters] + rng.normal(0, 0.2, size=300)
    mean, half, count = cluster_mean_ci95(values, clusters)
    naive_half = 1.96 * values.std(ddof=1) / np.sqrt(values.size)
    assert count == 10 and half > 3 * naive_half
    assert mean == pytest.approx(prompt_effect.mean(), abs=0.05)
    assert np.isnan(cluster_mean_ci95([1.0, 2.0], ["a", "a"])[1])
    with pytest.raises(ConfigError):
        cluster_mean_ci95([1.0], ["a", "b"])
