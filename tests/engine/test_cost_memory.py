"""The cost curve kept between processes (engine.cost_memory): what a cost model hands over
(``learned_points``), the file's round trip and merge, damaged and foreign files, the write interval,
the decoder's ``cost_cache`` setting, and the adapters' signatures that key the file."""

import json
import os

import numpy as np
import pytest
import torch

from tests.engine.tiny import tiny_llama
from verispec.draft.tree_policy import CostCurve
from verispec.engine.cost_memory import MAX_WEIGHT, CostMemory, cost_cache_dir
from verispec.engine.cost_model import OnlineCostModel, prior_overhead_shape, prior_shape
from verispec.engine.decoder import SpeculativeDecoder
from verispec.errors import ConfigError
from verispec.models.hf import HFModelAdapter

PROMPT = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]


def steeper_machine(factor: float, sizes=(4,), rounds: int = 9) -> OnlineCostModel:
    """A model fed one-token readings of 10 ms and readings at ``sizes`` costing ``factor`` x the prior."""
    model = OnlineCostModel()
    for _ in range(rounds):
        model.record(1, 0.01, 0.001)
        for n in sizes:
            model.record(n, 0.01 * factor * float(prior_shape([n])[0]), 0.001)
    return model


def test_learned_points_cover_the_read_buckets_only():
    model = steeper_machine(2.0, sizes=(4, 12))
    points = model.learned_points()
    # one point at the top of each bucket read (3-4 and 9-16); nothing for 2 or 5-8
    assert sorted(points) == [4, 16]
    for n, (cost, readings) in points.items():
        assert cost == pytest.approx(2.0 * float(prior_shape([n])[0]), rel=1e-9) and readings == 9  # the window
    plain_only = OnlineCostModel()
    plain_only.record(1, 0.01, 0.001)
    assert plain_only.learned_points() == {}


def test_round_trip_a_fresh_model_starts_from_the_kept_curve(tmp_path):
    memory = CostMemory(tmp_path / "cost.json")
    assert memory.prior_points() is None and memory.points() == {}
    assert memory.remember(steeper_machine(2.0)) is True
    kept = CostMemory(tmp_path / "cost.json")
    assert [n for n, _ in kept.prior_points()] == [1, *(2 ** b for b in range(1, 13))]  # every bucket's top
    fresh = kept.cost_model()
    overheads = prior_overhead_shape(np.arange(1, 5))
    forward = fresh.table(4) - overheads  # before any reading: relative units, the kept curve
    assert forward[[0, 3]] == pytest.approx([1.0, 2.0 * prior_shape([4])[0]], abs=1e-5)
    shipped = OnlineCostModel().table(4) - overheads
    assert forward[3] - 1.0 > 10 * (shipped[3] - 1.0)  # negative control: the shipped curve is far flatter


def test_unread_buckets_are_scaled_from_their_neighbours_not_extrapolated(tmp_path):
    """Kept: 2x the shipped curve at 4 tokens, 3x at 16. Between them the log ratio is interpolated
    (8 tokens: sqrt(6) x); beyond them it is constant (2 tokens 2x, 4096 tokens 3x), so one bucket of
    small trees never makes a large tree look as steep as a line through 1 and 4 tokens would."""
    path = tmp_path / "cost.json"
    shipped = CostCurve(overhead=0.0)
    path.write_text(json.dumps({"version": 2, "points": {"4": {"cost": 2 * shipped(4), "weight": 9},
                                                         "16": {"cost": 3 * shipped(16), "weight": 1}}}))
    points = dict(CostMemory(path).prior_points())
    assert points[1] == 1.0
    assert points[2] == pytest.approx(2 * shipped(2)) and points[4] == pytest.approx(2 * shipped(4))
    assert points[8] == pytest.approx(6 ** 0.5 * shipped(8)) and points[16] == pytest.approx(3 * shipped(16))
    assert points[4096] == pytest.approx(3 * shipped(4096))
    line_through_small_sizes = 1.0 + (2 * shipped(4) - 1.0) / 3 * (32 - 1)
    assert points[32] < line_through_small_sizes / 2
    backend = ((1, 1.0), (2, 1.8), (4, 3.0), (8, 5.1), (16, 9.6))  # a backend's own prior: the ratios apply to it
    scaled = dict(CostMemory(path).prior_points(fallback=backend))
    assert scaled[4] == pytest.approx(2 * shipped(4)) and scaled[2] == pytest.approx(1.8 * 2 * shipped(4) / 3.0)


def test_remembering_merges_with_what_was_kept(tmp_path):
    """Sizes a process did not read keep their point; a size read again is averaged in log by
    readings (9 and 9: the geometric mean; a third process's 3 readings weigh 3 against 18); the
    kept weight stops at MAX_WEIGHT, so a changed machine is followed."""
    path = tmp_path / "cost.json"
    CostMemory(path).remember(steeper_machine(3.0, sizes=(16,)))
    CostMemory(path).remember(steeper_machine(1.5, sizes=(4,)))
    records = CostMemory(path).records()
    assert sorted(records) == [4, 16]
    assert records[16] == pytest.approx((3.0 * float(prior_shape([16])[0]), 9), rel=1e-5)  # not read the second time
    assert records[4] == pytest.approx((1.5 * float(prior_shape([4])[0]), 9), rel=1e-5)
    CostMemory(path).remember(steeper_machine(6.0, sizes=(16,)))
    assert CostMemory(path).records()[16] == pytest.approx((18 ** 0.5 * float(prior_shape([16])[0]), 18), rel=1e-5)
    CostMemory(path).remember(steeper_machine(1.0, sizes=(16,), rounds=3))
    assert CostMemory(path).records()[16] == pytest.approx(
        ((18 ** 0.5) ** (18 / 21) * float(prior_shape([16])[0]), 21), rel=1e-5)
    for _ in range(10):
        CostMemory(path).remember(steeper_machine(1.0, sizes=(16,)))
    cost, weight = CostMemory(path).records()[16]
    third = (18 ** 0.5) ** (18 / 21)  # the factor over the prior after the third process
    # each of the ten reads factor 1: the first weighs 9 against 21, the others 9 against 27
    assert weight == MAX_WEIGHT
    assert cost == pytest.approx(third ** (21 / 30 * 0.75 ** 9) * float(prior_shape([16])[0]), rel=1e-4)


def test_a_model_without_speculative_readings_writes_nothing(tmp_path):
    path = tmp_path / "cost.json"
    plain = OnlineCostModel()
    plain.record(1, 0.01, 0.001)
    assert CostMemory(path).remember(plain) is False and not path.exists()


@pytest.mark.parametrize("content", [
    "not json", json.dumps([1, 2]), json.dumps({"version": 99, "points": {"4": {"cost": 1.2, "weight": 9}}}),
    json.dumps({"version": 1, "points": {"4": 1.2}}),  # the first format
    json.dumps({"version": 2, "points": {"4": {"cost": -1.0, "weight": 9}}}),
    json.dumps({"version": 2, "points": {"1": {"cost": 1.0, "weight": 9}}}),
    json.dumps({"version": 2, "points": {"3": {"cost": 1.1, "weight": 9}}}),
    json.dumps({"version": 2, "points": {"4": {"cost": "fast", "weight": 9}}}), json.dumps({"version": 2}),
    json.dumps({"version": 2, "points": {"4": {"cost": float("inf"), "weight": 9}}}),
    json.dumps({"version": 2, "points": {"4": {"cost": 1.2, "weight": 0}}}),
    json.dumps({"version": 2, "points": {"4": {"cost": 1.2}}}),
])
def test_a_damaged_or_foreign_file_is_ignored_then_replaced(tmp_path, content):
    path = tmp_path / "cost.json"
    path.write_text(content)
    memory = CostMemory(path)
    assert memory.points() == {} and memory.prior_points(fallback=((1, 1.0), (2, 1.8))) == ((1, 1.0), (2, 1.8))
    assert memory.remember(steeper_machine(2.0)) is True
    assert sorted(CostMemory(path).points()) == [4]


def test_writes_are_at_most_one_per_interval(tmp_path):
    memory = CostMemory(tmp_path / "cost.json", min_interval=3600.0)
    assert memory.remember(steeper_machine(2.0)) is True
    assert memory.remember(steeper_machine(3.0)) is False  # a server's next request, a second later
    assert CostMemory(tmp_path / "cost.json").points()[4] == pytest.approx(2.0 * float(prior_shape([4])[0]), rel=1e-5)
    assert memory.remember(steeper_machine(3.0), force=True) is True


def test_an_unwritable_location_warns_and_decoding_goes_on(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    memory = CostMemory(blocker / "cost.json")  # its parent is a file: it cannot be created
    with pytest.warns(UserWarning, match="VERISPEC_COST_CACHE"):
        assert memory.remember(steeper_machine(2.0)) is False


def test_settings_are_checked(tmp_path):
    assert CostMemory.from_setting(False, None) is None and CostMemory.from_setting(None, None) is None
    assert CostMemory.from_setting(str(tmp_path / "c.json"), None).path == tmp_path / "c.json"
    with pytest.raises(ConfigError, match="cost_signature.*file path"):
        CostMemory.from_setting(True, object())
    with pytest.raises(ConfigError, match="True, False or a file path, got 3"):
        CostMemory.from_setting(3, None)
    with pytest.raises(ConfigError, match="is a directory"):
        CostMemory(tmp_path)


def test_the_default_location_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("VERISPEC_COST_CACHE", str(tmp_path / "curves"))
    assert cost_cache_dir() == tmp_path / "curves"
    monkeypatch.delenv("VERISPEC_COST_CACHE")
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path / "root"))
    assert cost_cache_dir() == tmp_path / "root" / "cost-curves"


def test_signatures_change_with_what_the_costs_depend_on():
    model = tiny_llama(0, vocab_size=8)
    first, same = HFModelAdapter(model), HFModelAdapter(model)
    assert first.cost_signature() == same.cost_signature()
    other_dtype = HFModelAdapter(tiny_llama(0, vocab_size=8).double())
    other_shape = HFModelAdapter(tiny_llama(0, vocab_size=8, layers=3))
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(previous + 1)
        more_threads = first.cost_signature()
    finally:
        torch.set_num_threads(previous)
    assert len({first.cost_signature(), other_dtype.cost_signature(), other_shape.cost_signature(), more_threads}) == 4
    path = CostMemory.for_target(first).path
    assert path.parent == cost_cache_dir() and path == CostMemory.for_target(same).path
    assert path != CostMemory.for_target(other_dtype).path


def test_a_decoder_keeps_its_curve_and_the_next_one_starts_from_it(tmp_path):
    """cost_cache=True: the file of the target's signature is written after a run, and the next
    decoder's cost model starts from it; the seeded text does not depend on it (q-free draws are
    drafter-invariant)."""
    target = HFModelAdapter(tiny_llama(1, vocab_size=8).double())
    memory_path = CostMemory.for_target(target).path
    if memory_path.exists():
        memory_path.unlink()
    first = SpeculativeDecoder(target, "tree", temperature=0.8, max_new_tokens=24, seed=5, cost_cache=True)
    assert first.cost_model.prior.points == OnlineCostModel().prior.points  # nothing kept yet
    text = first.generate(PROMPT).token_ids
    assert first.cost_model.learned_points(), "the toy run should have read speculative rounds"
    kept = CostMemory(memory_path).points()
    assert kept == pytest.approx({n: round(c, 6) for n, (c, _) in first.cost_model.learned_points().items()}, abs=1e-6)
    second = SpeculativeDecoder(target, "tree", temperature=0.8, max_new_tokens=24, seed=5, cost_cache=True)
    assert second.cost_model.prior.points == CostMemory(memory_path).prior_points() != OnlineCostModel().prior.points
    assert second.generate(PROMPT).token_ids == text
    plain = SpeculativeDecoder(target, None, method="ar", temperature=0.8, max_new_tokens=24, seed=5)
    assert plain.generate(PROMPT).token_ids == text


def test_a_stream_closed_early_still_keeps_what_it_measured(tmp_path):
    target = HFModelAdapter(tiny_llama(1, vocab_size=8).double())
    path = tmp_path / "cost.json"
    decoder = SpeculativeDecoder(target, "tree", temperature=0.0, max_new_tokens=40, cost_cache=path)
    rounds = decoder._run(PROMPT)
    for snapshot in rounds:
        if snapshot.new_tokens >= 15:
            break
    assert snapshot.stop_reason == "running" and not path.exists()
    rounds.close()
    assert decoder.cost_model.learned_points() and CostMemory(path).points()


def test_plain_decoding_and_an_explicit_model_keep_nothing_of_their_own(tmp_path):
    target = HFModelAdapter(tiny_llama(1, vocab_size=8).double())
    path = tmp_path / "cost.json"
    SpeculativeDecoder(target, None, method="ar", max_new_tokens=8, cost_cache=path).generate(PROMPT)
    assert not path.exists()  # plain rounds read one-token forwards only
    shared = OnlineCostModel()
    decoder = SpeculativeDecoder(target, "tree", temperature=0.0, max_new_tokens=24, cost_model=shared, cost_cache=path)
    assert decoder.cost_model is shared
    decoder.generate(PROMPT)
    assert CostMemory(path).points() == pytest.approx(
        {n: round(c, 6) for n, (c, _) in shared.learned_points().items()}, abs=1e-6)
    np.testing.assert_array_equal(sorted(CostMemory(path).points()), sorted(shared.learned_points()))
    assert os.path.getsize(path) < 4096


@pytest.fixture(scope="module")
def tiny_default_pair():
    from verispec.models.default import load_default_tokenizer

    tokenizer = load_default_tokenizer()
    return tiny_llama(0, vocab_size=len(tokenizer), max_positions=1024).double(), tokenizer


def test_the_command_keeps_the_curve_unless_told_not_to(monkeypatch, tmp_path, tiny_default_pair, capsys):
    from verispec.cli import generate as generate_cli
    from verispec.cli.main import main

    model, tokenizer = tiny_default_pair
    monkeypatch.setattr(generate_cli, "load_pair", lambda target, draft, *rest: (model, tokenizer, draft))
    monkeypatch.setenv("VERISPEC_COST_CACHE", str(tmp_path / "off"))
    args = ["generate", "def add(a, b):", "--max-new-tokens", "32", "--temperature", "0", "--no-chat", "--backend", "native"]
    assert main([*args, "--no-cost-cache"]) == 0
    assert not (tmp_path / "off").exists()
    monkeypatch.setenv("VERISPEC_COST_CACHE", str(tmp_path / "on"))
    assert main(args) == 0
    (kept,) = (tmp_path / "on").glob("*.json")
    assert CostMemory(kept).points()
    capsys.readouterr()
