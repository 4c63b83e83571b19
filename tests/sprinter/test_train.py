"""Collection, features, training, the verifier file and the CLI's train command (issue 5),
on tiny random HF models and synthetic data."""

from __future__ import annotations

import json
from itertools import product

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from verispec.cli.main import main
from verispec.core.sampling import SamplingParams
from verispec.errors import ConfigError
from verispec.models.hf import HFModelAdapter
from verispec.sprinter.collect import KINDS, CollectConfig, Collector, NGramOracle, NeuralOracle, label_summary, save_dataset
from verispec.sprinter.decoder import SprinterDecoder
from verispec.sprinter.features import (
    DraftHiddenFeatures,
    DraftState,
    NGramTokenFeatures,
    make_extractor,
    model_identifier,
    ngram_match_orders,
)
from verispec.sprinter.train import (
    TrainConfig,
    VerifierNet,
    load_verifier,
    rates_at,
    roc_auc,
    save_verifier,
    train_verifier,
)

PROMPTS = [("a", [1, 2, 3, 1, 2]), ("b", [4, 5, 1, 4, 5]), ("c", [2, 2, 3, 3, 4]), ("d", [5, 4, 3, 2, 1])]


def llama_with_hidden(hidden: int, vocab: int = 6):
    torch.manual_seed(3)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return LlamaForCausalLM(config).eval()


# ----- features ------------------------------------------------------------------------------------
def test_ngram_match_orders():
    orders, longest = ngram_match_orders(np.array([7, 8, 9, 7, 8, 5, 7, 8]), max_n=3)
    # "7 8" occurred twice before, followed by 9 and 5; "8" also followed by 9 and 5; "x 7 8" never
    assert longest == 2 and orders == {9: 2, 5: 2}


def test_ngram_features_hold_token_information(pair):
    target, _ = pair
    extractor = NGramTokenFeatures(target)
    q = np.array([0.5, 0.3, 0.2, 0.0, 0.0, 0.0])
    feats = extractor.features(DraftState(np.array([1, 2, 1, 2]), q), [0, 1])
    assert feats.shape == (2, extractor.dim) and extractor.dim == 7 + 32
    assert feats[0, 0] == pytest.approx(0.5) and feats[1, 0] == pytest.approx(0.3)  # q(x)
    assert feats[0, 4] == 1 and feats[1, 4] == 0  # is argmax
    embed = target.get_input_embeddings().weight.detach().numpy()
    assert np.allclose(feats[1, 7:], embed[1])
    spec = extractor.spec()
    assert spec["draft"] == "ngram" and spec["hidden_size"] == 32 and spec["target"] == model_identifier(target)


# ----- collection ------------------------------------------------------------------------------------
@pytest.mark.parametrize("draft_kind", ["ngram", "model"])
def test_collect_four_kinds_in_equal_proportion(pair, draft_kind):
    target, draft = pair
    params = SamplingParams(1.0)
    adapter = HFModelAdapter(target)
    if draft_kind == "ngram":
        oracle, extractor = NGramOracle(6, params), make_extractor(target, "ngram")
    else:
        oracle, extractor = NeuralOracle(HFModelAdapter(draft), params), make_extractor(target, draft)
        assert isinstance(extractor, DraftHiddenFeatures)
    config = CollectConfig(samples_per_kind=4, continuation_len=6)
    data = Collector(adapter, oracle, extractor, config).collect(PROMPTS, log=lambda m: None)
    kinds = data["kind"].numpy()
    assert [int((kinds == i).sum()) for i in range(len(KINDS))] == [4 * len(PROMPTS)] * 4
    assert data["features"].shape == (16 * len(PROMPTS), extractor.dim)
    assert (data["draft_prob"] > 0).all() and (data["target_prob"] > 0).all()
    summary = label_summary(data)
    assert set(summary) == {"gamma=1", "gamma=1.2", "gamma=1.5"}
    assert summary["gamma=1"]["all"] <= summary["gamma=1.2"]["all"] <= summary["gamma=1.5"]["all"]


@torch.no_grad()
def test_collected_probabilities_match_full_forwards(pair):
    """p(x) stored for a sample equals the target's probability at its prefix (target kind
    rebuilt from the recorded position is not possible, so check the 'original' kind)."""
    target, _ = pair
    adapter = HFModelAdapter(target)
    collector = Collector(adapter, NGramOracle(6, SamplingParams()), make_extractor(target, "ngram"), CollectConfig(2, 4))
    data = collector.collect(PROMPTS[:1], log=lambda m: None)
    original = data["kind"].numpy() == 0
    probs = torch.softmax(target(torch.tensor([PROMPTS[0][1]])).logits[0, -1].double(), -1).numpy()
    for token, p_x in zip(data["token"].numpy()[original], data["target_prob"].numpy()[original]):
        assert p_x == pytest.approx(probs[token], abs=1e-5)


# ----- metrics and training ----------------------------------------------------------------------------
def test_auc_equals_pairwise_probability():
    rng = np.random.default_rng(0)
    labels = rng.random(300) < 0.4
    scores = np.round(rng.random(300) + labels * 0.3, 1)  # ties on purpose
    pos, neg = scores[labels], scores[~labels]
    pairwise = np.mean([(a > b) + 0.5 * (a == b) for a, b in product(pos, neg)])
    assert roc_auc(labels, scores) == pytest.approx(pairwise, abs=1e-12)
    rates = rates_at(labels, scores, 0.5)
    assert rates["tpr"] == pytest.approx(np.mean(pos >= 0.5)) and rates["fpr"] == pytest.approx(np.mean(neg >= 0.5))


@pytest.mark.parametrize("hidden", [0, 8])
def test_training_separates_a_learnable_label(hidden):
    rng = np.random.default_rng(1)
    features = rng.normal(size=(3000, 10)).astype(np.float32)
    labels = (features[:, 0] - 0.5 * features[:, 3] + 0.3 * rng.normal(size=3000) > 0).astype(np.float32)
    prompts = np.arange(3000) // 100
    net, report = train_verifier(features, labels, prompts, TrainConfig(hidden_units=hidden, learning_rate=2e-2, max_epochs=30, patience=3), log=lambda m: None)
    assert report["val_auc"] > 0.95
    assert report["val_prompts"] >= 1 and report["train_samples"] + report["val_samples"] == 3000


def test_train_refuses_bad_eta():
    with pytest.raises(ConfigError, match="eta"):
        train_verifier(np.zeros((4, 2)), np.array([0, 1, 0, 1]), np.array([0, 0, 1, 1]), TrainConfig(eta=1.0))


# ----- the verifier file -----------------------------------------------------------------------------
def tiny_verifier_file(tmp_path, target, gamma=1.2):
    extractor = NGramTokenFeatures(target)
    net = VerifierNet(extractor.dim)
    meta = {**extractor.spec(), "gamma": gamma, "eta": 0.5, "hidden_units": 0, "metrics": {"tpr": 0.9, "fpr": 0.2}}
    return save_verifier(tmp_path / "v.pt", net, meta)


def test_verifier_file_round_trip_and_decoding(tmp_path, pair):
    target, _ = pair
    path = tiny_verifier_file(tmp_path, target)
    loaded = load_verifier(path, extractor=NGramTokenFeatures(target))
    assert loaded.eta == 0.5 and loaded.gamma == 1.2
    output = SprinterDecoder(target, "ngram", path, max_new_tokens=6).generate([1, 2, 3, 1, 2])
    assert output.new_tokens == 6 and output.eta == 0.5


def test_verifier_for_another_pair_is_refused(tmp_path, pair):
    target, _ = pair
    path = tiny_verifier_file(tmp_path, target)
    other = llama_with_hidden(48)
    with pytest.raises(ConfigError) as error:
        SprinterDecoder(other, "ngram", path)
    message = str(error.value)
    assert model_identifier(target) in message and model_identifier(other) in message
    assert "hidden size 32" in message and "hidden size 48" in message


def test_neural_pair_verifier_refused_for_ngram_pair(tmp_path, pair):
    target, draft = pair
    extractor = make_extractor(target, draft)
    path = save_verifier(tmp_path / "n.pt", VerifierNet(extractor.dim), {**extractor.spec(), "gamma": 1.0, "eta": 0.5})
    with pytest.raises(ConfigError, match="draft_hidden_token"):
        load_verifier(path, extractor=make_extractor(target, "ngram"))
    # and it decodes with the pair it was made for
    output = SprinterDecoder(target, draft, path, max_new_tokens=4).generate([1, 2, 3])
    assert output.new_tokens == 4


@pytest.mark.parametrize("eta", [0.0, 1.0, 1.5])
def test_loading_with_eta_outside_unit_interval_is_an_error(tmp_path, pair, eta):
    path = tiny_verifier_file(tmp_path, pair[0])
    with pytest.raises(ConfigError, match="eta"):
        load_verifier(path, eta=eta)


def test_not_a_verifier_file_is_refused(tmp_path):
    bad = tmp_path / "bad.pt"
    torch.save({"hello": 1}, bad)
    with pytest.raises(ConfigError, match="not a SPRINTER verifier"):
        load_verifier(bad)
    with pytest.raises(ConfigError, match="not found"):
        load_verifier(tmp_path / "missing.pt")


# ----- CLI: train ----------------------------------------------------------------------------------
def synthetic_dataset(seed: int, prompts: int = 10, per_prompt: int = 80) -> dict:
    rng = np.random.default_rng(seed)
    n = prompts * per_prompt
    features = rng.normal(size=(n, 12)).astype(np.float32)
    target_prob = rng.uniform(0.05, 0.9, size=n)
    # q/p driven by feature 0, so the label is learnable
    draft_prob = np.clip(target_prob * np.exp(0.6 * features[:, 0] + 0.2 * rng.normal(size=n)), 1e-4, 1.0)
    return {
        "features": torch.from_numpy(features).half(),
        "token": torch.zeros(n, dtype=torch.long),
        "draft_prob": torch.from_numpy(draft_prob),
        "target_prob": torch.from_numpy(target_prob),
        "kind": torch.from_numpy((np.arange(n) % 4).astype(np.int8)),
        "position": torch.zeros(n, dtype=torch.long),
        "prompt_index": torch.from_numpy(np.arange(n) // per_prompt),
        "prompt_ids": [f"p{seed}-{i}" for i in range(prompts)],
        "meta": {"feature_set": "ngram_token", "dim": 12, "target": "toy-target", "draft": "ngram", "hidden_size": 5, "kinds": list(KINDS),
                 "sampling": {"temperature": 1.0, "top_k": 0, "top_p": 1.0}},
    }


def test_cli_train_writes_verifier_and_metrics(tmp_path, capsys):
    save_dataset(synthetic_dataset(0), tmp_path / "train" / "data.pt")
    save_dataset(synthetic_dataset(1, prompts=4), tmp_path / "test" / "data.pt")
    out = tmp_path / "verifier"
    code = main(["sprinter", "train", "--data", str(tmp_path / "train"), "--test-data", str(tmp_path / "test"),
                 "--gamma", "1.2", "--eta", "0.5", "--epochs", "20", "--out", str(out)])
    assert code == 0
    record = json.loads((out / "train.json").read_text())
    for key in ("auc", "tpr", "fpr", "gamma", "eta"):
        assert key in record
    assert record["gamma"] == 1.2 and record["eta"] == 0.5 and record["auc"] > 0.8
    assert record["auc_source"].startswith("held-out test prompts")
    assert (out / "toy-target__ngram__g1.2.pt").is_file() and (out / "roc.png").is_file()
    meta = load_verifier(out / "toy-target__ngram__g1.2.pt").meta
    assert meta["dim"] == 12 and meta["gamma"] == 1.2


def test_cli_rejects_eta_outside_unit_interval(tmp_path, capsys):
    save_dataset(synthetic_dataset(0, prompts=3), tmp_path / "data.pt")
    code = main(["sprinter", "train", "--data", str(tmp_path / "data.pt"), "--eta", "1.0", "--out", str(tmp_path)])
    assert code == 2
    assert "eta" in capsys.readouterr().err
