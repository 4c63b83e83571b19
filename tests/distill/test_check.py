"""draft check: hand-computable alpha, vocabulary refusal, the CLI end to end on a tiny pair."""

import json

import numpy as np
import pytest

from tests.distill.helpers import constant_llama, save_pair_member, tiny_llama, word_tokenizer
from verispec.cli.main import main
from verispec.core.sampling import SamplingParams
from verispec.distill import check
from verispec.errors import ConfigError

TARGET_P = [0.5, 0.25, 0.125, 0.125]
DRAFT_Q = [0.25, 0.25, 0.4, 0.1]


def test_constant_models_give_the_hand_computed_alpha():
    target, draft = constant_llama(TARGET_P), constant_llama(DRAFT_Q)
    sequences = [([3, 1, 2, 0, 1, 3], 2), ([2, 2, 2, 1], 1)]
    target_logits, draft_logits = check.sequence_logits(target, sequences), check.sequence_logits(draft, sequences)
    assert [len(rows) for rows in target_logits] == [4, 3]

    at_one = check.alpha_from_logits(target_logits, draft_logits, SamplingParams(1.0), SamplingParams(1.0))
    assert at_one.positions == 7
    assert at_one.alpha == pytest.approx(0.25 + 0.25 + 0.125 + 0.1, abs=1e-5)

    # T = 0: one-hots on token 0 (target) and token 2 (draft): never accepted
    greedy = check.alpha_from_logits(target_logits, draft_logits, SamplingParams(0.0), SamplingParams(0.0))
    assert greedy.alpha == 0.0

    # T = 0.5 on both: p ∝ p^2, q ∝ q^2
    p = np.array(TARGET_P) ** 2 / (np.array(TARGET_P) ** 2).sum()
    q = np.array(DRAFT_Q) ** 2 / (np.array(DRAFT_Q) ** 2).sum()
    half = check.alpha_from_logits(target_logits, draft_logits, SamplingParams(0.5), SamplingParams(0.5))
    assert half.alpha == pytest.approx(np.minimum(p, q).sum(), abs=1e-5)

    # a separate draft temperature: draft at T = 1 against the target at T = 0.5
    mixed = check.sweep_draft_temperature(target_logits, draft_logits, SamplingParams(0.5), [1.0])
    assert mixed[0]["alpha"] == pytest.approx(np.minimum(p, np.array(DRAFT_Q)).sum(), abs=1e-5)


def test_a_draft_equal_to_the_target_has_alpha_one():
    model = tiny_llama(3, vocab_size=10)
    sequences = [([1, 4, 2, 7, 7, 3], 2)]
    logits = check.sequence_logits(model, sequences)
    assert check.alpha_from_logits(logits, logits, SamplingParams(0.6), SamplingParams(0.6)).alpha == pytest.approx(1.0)


def test_ngram_rows_follow_the_running_context():
    rows = check.ngram_probs(6, [1, 2, 1, 2, 1], prompt_len=3)
    assert rows.shape == (2, 6)
    np.testing.assert_allclose(rows.sum(-1), 1.0)
    assert rows[0].argmax() == 2  # after "... 2 1" the context continued with 2


def test_mismatched_vocabularies_are_refused():
    assert check.check_vocabularies(10, 10) == []
    problems = check.check_vocabularies(10, 12)
    assert "target 10 tokens, draft 12" in problems[0]
    with pytest.raises(ConfigError, match="shared tokenizer"):
        check.require_compatible(problems)
    same_size = check.check_vocabularies(10, 10, word_tokenizer(10, "w"), word_tokenizer(10, "x"))
    assert same_size and "token strings differ" in same_size[0]
    assert check.check_vocabularies(10, 10, word_tokenizer(10), word_tokenizer(10)) == []


def test_predictions_and_verdict():
    rows = check.predictions(0.8, 0.05)
    assert [r["L"] for r in rows] == list(range(1, 17))
    assert rows[0]["block_efficiency"] == pytest.approx(1.8)
    assert rows[0]["speedup"] == pytest.approx(1.8 / 1.05)
    assert check.verdict(0.8, 0.05, 3.0)[0] == "good"
    assert check.verdict(0.3, 0.05, 1.2)[0] == "marginal"
    label, reasons = check.verdict(0.1, 0.5, 0.9)
    assert label == "not worth it" and any("above" in r for r in reasons)


def _prompt_file(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("w3 w4 w5\nw6 w7\nw2 w9 w4 w4\n")
    return path


def test_cli_check_json_on_a_tiny_pair(tmp_path, capsys):
    tokenizer = word_tokenizer(12)
    target = save_pair_member(tiny_llama(0, vocab_size=12), tokenizer, tmp_path / "target")
    draft = save_pair_member(tiny_llama(1, vocab_size=12, layers=1), tokenizer, tmp_path / "draft")
    common = ["--target", str(target), "--prompts", str(_prompt_file(tmp_path)), "--num-prompts", "3",
              "--max-new-tokens", "6", "--timing-steps", "3", "--timing-context", "20", "--dtype", "fp32", "--json"]
    assert main(["draft", "check", "--draft", str(draft), *common]) == 0
    report = json.loads(capsys.readouterr().out)
    for key in ("vocab_compatible", "cost_ratio", "alpha", "best_L", "predicted_speedup", "verdict"):
        assert key in report
    assert report["vocab_compatible"] is True
    assert 0.0 <= report["alpha"] <= 1.0 and report["cost_ratio"] > 0 and 1 <= report["best_L"] <= 16
    assert report["positions"] > 0

    assert main(["draft", "check", "--draft", "ngram", *common]) == 0
    assert json.loads(capsys.readouterr().out)["draft"] == "ngram"

    assert main(["draft", "temperature", "--draft", str(draft), "--grid", "0.5,1.0", *common]) == 0
    sweep = json.loads(capsys.readouterr().out)
    assert [row["draft_temperature"] for row in sweep["sweep"]] == [0.5, 0.6, 1.0]


def test_check_sequences_reads_recorded_continuations_or_says_none_are_there(tmp_path):
    """--sequences (shared by the pair and the head check): recorded shards are used as they are,
    at most --num-prompts of them, and an empty directory is a clear error, not an empty check."""
    import argparse

    import torch

    from verispec.cli.check_inputs import check_sequences
    from verispec.distill.data import save_shard

    records = [{"tokens": torch.tensor([5, 6, 7, 8 + i]), "prompt_len": 2} for i in range(3)]
    save_shard(tmp_path / "shards" / "shard-0.pt", records)
    args = argparse.Namespace(sequences=str(tmp_path / "shards"), num_prompts=2)
    assert check_sequences(args, target=None, tokenizer=None) == [([5, 6, 7, 8], 2), ([5, 6, 7, 9], 2)]
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no recorded sequences in"):
        check_sequences(argparse.Namespace(sequences=str(tmp_path / "empty"), num_prompts=2), None, None)


def test_cli_check_refuses_a_mismatched_pair(tmp_path, capsys):
    target = save_pair_member(tiny_llama(0, vocab_size=12), word_tokenizer(12), tmp_path / "target")
    draft = save_pair_member(tiny_llama(1, vocab_size=14), word_tokenizer(14), tmp_path / "draft")
    code = main(["draft", "check", "--target", str(target), "--draft", str(draft), "--prompts",
                 str(_prompt_file(tmp_path)), "--dtype", "fp32", "--json"])
    captured = capsys.readouterr()
    assert code == 2
    assert json.loads(captured.out)["vocab_compatible"] is False
    assert "target 12 tokens, draft 14" in captured.err and "verispec distill" in captured.err
