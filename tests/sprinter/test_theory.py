"""SPRINTER's guarantees by exact enumeration of the production rule on toy models
(ALGORITHMS.md §11, §14.5 item 8): labels, Thm 3.1 (token law and TV), Thm A.4 (kept
probability), Thm 3.3 (run-length law and E[N]), the context-only-feature law, FPR = 0 lossless."""

from dataclasses import replace

import numpy as np
import pytest

from verispec.core.rng import SeededRng, enumerate_outcomes
from verispec.core.tree import DraftTree
from verispec.draft.samplers import sample_chain
from verispec.errors import ConfigError
from verispec.models.toy import ToyDraft, ToyModel
from verispec.sprinter.evaluate import (
    run_length_law,
    sprinter_next_token_law,
    toy_distribution_check,
    weighted_false_positive_rate,
)
from verispec.sprinter.train import labels_for_gamma
from verispec.theory.closed_forms import (
    sprinter_expected_run_length,
    sprinter_run_length_pmf,
    sprinter_token_law,
    total_variation_distance,
)
from verispec.theory.enumerate import LayeredProcess, generation_law, max_abs_difference, run_step, target_law
from verispec.verify.sprinter import IdealizedSprinter, Sprinter, acceptable_tokens, check_threshold

EXACT = 1e-12


def chain(length):
    return lambda rng, draft_fn: sample_chain(rng, draft_fn, length)


# ----- labels ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "p, q, expected",
    [
        # q/p:        0.5    1.0     1.1    1.2    1.3    1.5    1.6    p = 0
        ([0.4, 0.2, 0.5, 0.5, 0.5, 0.2, 0.5, 0.0], [0.2, 0.2, 0.55, 0.6, 0.65, 0.3, 0.8, 0.1],
         {1.0: [1, 1, 0, 0, 0, 0, 0, 0], 1.2: [1, 1, 1, 1, 0, 0, 0, 0], 1.5: [1, 1, 1, 1, 1, 1, 0, 0]}),
    ],
)
def test_label_arithmetic_for_each_gamma(p, q, expected):
    for gamma, labels in expected.items():
        got = labels_for_gamma(np.array(p), np.array(q), gamma)
        assert got.tolist() == labels, gamma
        # the same arithmetic as the verify layer's definition of "acceptable"
        assert got.astype(bool).tolist() == acceptable_tokens(np.array(p), np.array(q), gamma).tolist()


def test_larger_gamma_labels_more_tokens_acceptable():
    rng = np.random.default_rng(0)
    p, q = rng.dirichlet(np.ones(50)), rng.dirichlet(np.ones(50))
    counts = [labels_for_gamma(p, q, g).sum() for g in (1.0, 1.2, 1.5)]
    assert counts[0] <= counts[1] <= counts[2]
    with pytest.raises(ConfigError):
        labels_for_gamma(p, q, 0.0)


@pytest.mark.parametrize("eta", [0.0, 1.0, -0.1, 1.5])
def test_eta_outside_open_unit_interval_is_an_error(eta):
    with pytest.raises(ConfigError, match="eta"):
        check_threshold(eta)


# ----- Thm 3.1, Thm A.4, Thm 3.3 on toy models --------------------------------------------------
@pytest.mark.parametrize("tpr, fpr, vocab, seed", [(0.8, 0.3, 4, 0), (1.0, 0.0, 3, 1), (0.5, 0.5, 5, 2), (0.9, 0.1, 4, 3), (0.0, 0.95, 3, 4)])
def test_idealised_verifier_token_law_tv_and_kept_probability_are_exact(tpr, fpr, vocab, seed):
    check = toy_distribution_check(tpr, fpr, vocab, seed)
    assert check["law_mass"] == pytest.approx(1.0, abs=EXACT)
    assert check["token_law_max_abs_error"] < EXACT
    assert check["tv_abs_error"] < EXACT
    assert check["kept_probability_abs_error"] < EXACT
    assert check["run_length_pmf_max_abs_error"] < EXACT


class LinearTokenFeatureSprinter(Sprinter):
    """A deterministic verifier on token features only (q(x), log q(x), one-hot of x): accept iff
    w . f(x) + b >= 0 — what a trained linear verifier with x-dependent features does."""

    def __init__(self, weights, bias):
        self.weights, self.bias = np.asarray(weights), bias

    def decisions(self, draft_row):
        vocab = len(draft_row)
        feats = np.concatenate([draft_row[:, None], np.log(np.maximum(draft_row, 1e-12))[:, None], np.eye(vocab)], axis=1)
        return (feats @ self.weights + self.bias >= 0).astype(float)

    def _verify(self, tree, rng):
        probs = np.zeros(tree.num_nodes)
        for node in range(1, tree.num_nodes):
            probs[node] = self.decisions(tree.draft_probs[tree.parents[node]])[tree.tokens[node]]
        return super()._verify(replace(tree, verifier_accept_probs=probs), rng)


def first_token_law(verifier, target, draft, vocab):
    process = LayeredProcess(target, draft)
    law = enumerate_outcomes(lambda rng: run_step(verifier, chain(1), process, (), rng).output_tokens[0])
    return np.array([law.get(x, 0.0) for x in range(vocab)])


@pytest.mark.parametrize("seed", range(4))
def test_token_feature_verifier_law_and_tv_identity_are_exact(seed):
    vocab = 5
    target = ToyModel(vocab, seed=seed, zero_frac=0.2)
    draft = ToyDraft(target, seed=seed + 50, zero_frac=0.2)
    weights = np.random.default_rng(seed).normal(size=vocab + 2)
    verifier = LinearTokenFeatureSprinter(weights, 0.1)
    p, q = target(()), draft(())
    accept = verifier.decisions(q)
    measured = first_token_law(verifier, target, draft, vocab)
    assert np.abs(measured - sprinter_next_token_law(p, q, accept)).max() < EXACT
    # TV(P_S, p) = beta_w TV(p, q) with the (q - p)-weighted FPR, exactly
    beta = weighted_false_positive_rate(p, q, accept)
    assert total_variation_distance(measured, p) == pytest.approx(beta * total_variation_distance(p, q), abs=EXACT)


@pytest.mark.parametrize("tpr, fpr", [(0.7, 0.2), (1.0, 0.4), (0.3, 0.0)])
def test_idealised_law_matches_the_per_token_formula(tpr, fpr):
    target = ToyModel(4, seed=9, zero_frac=0.25)
    draft = ToyDraft(target, seed=19, zero_frac=0.25)
    p, q = target(()), draft(())
    accept = np.where(acceptable_tokens(p, q), tpr, fpr)
    assert np.abs(sprinter_next_token_law(p, q, accept) - sprinter_token_law(p, q, fpr)).max() < EXACT


class ContextOnlySprinter(Sprinter):
    """Features that do not depend on x (the hidden state before x is drawn): the verifier accepts
    with a probability s(c) that is the same for every token."""

    def __init__(self, accept_prob):
        self.accept_prob = accept_prob

    def _verify(self, tree, rng):
        return super()._verify(replace(tree, verifier_accept_probs=np.full(tree.num_nodes, self.accept_prob)), rng)


@pytest.mark.parametrize("s", [0.0, 0.35, 0.8, 1.0])
def test_context_only_features_give_the_s_mixture(s):
    target = ToyModel(4, seed=3, zero_frac=0.25)
    draft = ToyDraft(target, seed=33, zero_frac=0.25)
    p, q = target(()), draft(())
    measured = first_token_law(ContextOnlySprinter(s), target, draft, 4)
    assert np.abs(measured - ((1 - s) * p + s * q)).max() < EXACT


# ----- FPR = 0 is lossless; FPR > 0 is not (negative control) -------------------------------------
@pytest.mark.parametrize("tpr, length, tokens", [(0.6, 2, 3), (1.0, 3, 3), (0.0, 1, 2)])
def test_zero_fpr_is_lossless_over_several_rounds(tpr, length, tokens):
    target = ToyModel(3, seed=5, zero_frac=0.25)
    draft = ToyDraft(target, seed=55, zero_frac=0.25)
    law = generation_law(IdealizedSprinter(tpr, 0.0), chain(length), target, draft, tokens)
    assert max_abs_difference(law, target_law(target, tokens)) < 1e-9


def test_positive_fpr_is_not_lossless():
    target = ToyModel(3, seed=5, zero_frac=0.25)
    draft = ToyDraft(target, seed=55, zero_frac=0.25)
    law = generation_law(IdealizedSprinter(0.6, 0.3), chain(2), target, draft, 3)
    assert max_abs_difference(law, target_law(target, 3)) > 1e-3


# ----- Thm 3.3: run length ------------------------------------------------------------------------
def test_run_length_test_vector():
    assert sprinter_expected_run_length(0.9, 0.3, 5) == pytest.approx(3.938657, abs=1e-6)


@pytest.mark.parametrize("tpr, fpr, n", [(0.9, 0.3, 5), (0.6, 0.1, 3), (1.0, 0.5, 4), (0.8, 0.0, 2)])
def test_run_length_law_is_exact(tpr, fpr, n):
    law = run_length_law(tpr, fpr, n)
    for k, prob in law.items():
        if k >= 0:
            assert prob == pytest.approx(sprinter_run_length_pmf(tpr, fpr, n, k), abs=EXACT)
    mean = sum(k * prob for k, prob in law.items() if k >= 0)
    assert mean == pytest.approx(sprinter_expected_run_length(tpr, fpr, n), abs=1e-12)


@pytest.mark.parametrize("tpr, fpr, n", [(0.9, 0.3, 5), (0.7, 0.2, 3)])
def test_expected_run_length_matches_simulation(tpr, fpr, n):
    """Monte-Carlo of the production rule: |mean - E[N]| < 5 sigma / sqrt(samples)."""
    target, draft = np.array([0.7, 0.3]), np.array([0.3, 0.7])
    length = n + 40
    tree = DraftTree.chain([0] * n + [1] * 40, np.tile(target, (length + 1, 1)), np.tile(draft, (length, 1)))
    verifier, rng = IdealizedSprinter(tpr, fpr), SeededRng(123)
    runs = np.array([verifier.verify(tree, rng).accepted_len for _ in range(20_000)])
    expected = sprinter_expected_run_length(tpr, fpr, n)
    assert abs(runs.mean() - expected) < 5 * runs.std() / np.sqrt(len(runs))
    # tokens per target call = N + 1
    assert runs.mean() + 1 == pytest.approx(expected + 1, abs=5 * runs.std() / np.sqrt(len(runs)))
