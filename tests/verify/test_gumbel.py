"""The seed's Gumbel noise (core.noise) and the Gumbel-coupled chain rule (verify.gumbel) on toy
models in float64: the noise's stream layout, the law of its Gumbel-max draws, the rule's
one-round output law against the target's, token-for-token equality with plain Gumbel sampling,
and its acceptance against the exact coupling probability and the (1 - TV) / (1 + TV) bound.

Monte-Carlo tests reject at p < 1e-3 (Pearson chi-square, cells with expected count < 5 pooled;
binomial z-tests at |z| > 3.29), with fixed seeds so the outcome is reproducible. With 20,000
rounds over 4^3 = 64 cells the chi-square test detects a shift of ~0.01 in a cell of mass 0.05
(n delta^2 / m ~ 40 above the df = 63 mean); the negative controls below show that it does.
"""

import numpy as np
import pytest

from tests.verify.mc import chi_square_pvalue
from verispec.core.noise import GumbelNoise, NoiseAt, SeededDraws, gumbel_argmax, gumbel_max
from verispec.core.seeds import check_seed
from verispec.core.rng import SeededRng
from verispec.core.rows import DenseRows
from verispec.draft.samplers import sample_chain, sample_gumbel_chain
from verispec.errors import ConfigError
from verispec.models.toy import ToyDraft, ToyModel, context_free_pair
from verispec.theory.enumerate import target_law
from verispec.verify.registry import get_method

FALSE_ALARM = 1e-3
Z_LIMIT = 3.29  # two-sided 1e-3
VOCAB = 4
DRAFT_LEN = 2
ROUNDS = 20_000
GUMBEL = get_method("gumbel").verifier


# ------------------------------------------------------------------ the noise


def test_stream_layout_is_philox_keyed_by_seed_with_the_position_in_counter_word_one():
    noise = GumbelNoise(7)
    words = np.random.Philox(key=7, counter=[0, 12, 0, 0]).random_raw(10)
    uniform = ((words >> np.uint64(11)).astype(np.float64) + 0.5) / 2.0**53
    assert np.array_equal(noise.gumbel(12, np.arange(10)), -np.log(-np.log(uniform)))


def test_a_draw_depends_on_seed_position_and_token_only():
    noise = GumbelNoise(3)
    ids = np.array([9, 2, 5])
    first = noise.gumbel(40, ids)
    for position in range(80):  # fill and cycle the cache: other positions' reads change nothing
        noise.gumbel(position, np.arange(50))
    assert np.array_equal(GumbelNoise(3).gumbel(40, ids), first)
    assert np.array_equal(noise.gumbel(40, ids), first)
    assert np.array_equal(noise.gumbel(40, np.arange(10))[ids], first)  # independent of V and order
    assert not np.array_equal(noise.gumbel(41, ids), first)
    assert not np.array_equal(GumbelNoise(4).gumbel(40, ids), first)


@pytest.mark.parametrize("bad", [-1, 2**63, 1.5, True, "3", None])
def test_bad_seeds_are_refused_with_the_value(bad):
    with pytest.raises(ConfigError, match="seed must be an integer in"):
        check_seed(bad)
    with pytest.raises(ConfigError, match=repr(bad).replace("(", r"\(").replace(")", r"\)")):
        GumbelNoise(bad)


def test_gumbel_max_draws_follow_the_row_at_each_position():
    """Over positions (independent noise), argmax log p + G has law p: chi-square."""
    probs = np.array([0.5, 0.0, 0.3, 0.15, 0.05])
    ids = np.arange(len(probs))
    noise = GumbelNoise(11)
    counts = np.bincount([gumbel_max(ids, probs, noise, t) for t in range(20_000)], minlength=len(probs))
    assert counts[1] == 0
    law = {(x,): float(p) for x, p in enumerate(probs) if p > 0}
    assert chi_square_pvalue({(x,): int(c) for x, c in enumerate(counts)}, law) > FALSE_ALARM


def test_greedy_rows_give_their_argmax_and_read_no_noise():
    rows = DenseRows(np.array([[0.0, 1.0, 0.0]]), greedy=True)

    class NoNoise(GumbelNoise):
        def gumbel(self, position, ids):
            raise AssertionError("a greedy row read the noise")

    assert gumbel_argmax(rows, 0, NoNoise(0), 5) == 1


# ------------------------------------------------------------------ the rule, one round


def _round(target, draft, noise: GumbelNoise, position: int = 0, draft_noise: GumbelNoise | None = None):
    """One Gumbel-coupled round at ``position``; ``draft_noise`` (a negative control) draws the
    draft with other noise than the target's."""
    skeleton = sample_gumbel_chain(NoiseAt(draft_noise or noise, position), draft, DRAFT_LEN, VOCAB)
    tree = skeleton.with_target(np.stack([target(prefix) for prefix in skeleton.prefixes]))
    return GUMBEL.verify(tree, NoiseAt(noise, position))


def _plain(target, noise: GumbelNoise, length: int, position: int = 0) -> tuple[int, ...]:
    """Plain Gumbel sampling: token t = argmax log p(.|prefix) + G(t)."""
    tokens: tuple[int, ...] = ()
    for depth in range(length):
        row = target(tokens)
        tokens += (gumbel_max(np.arange(VOCAB), row, noise, position + depth),)
    return tokens


def _toy(seed: int):
    target = ToyModel(VOCAB, seed=seed, zero_frac=0.2)
    return target, ToyDraft(target, seed=seed + 100, zero_frac=0.2)


@pytest.mark.parametrize("toy_seed", [1, 2])
def test_every_round_emits_plain_sampling_tokens(toy_seed):
    target, draft = _toy(toy_seed)
    for seed in range(500):
        noise = GumbelNoise(seed)
        result = _round(target, draft, noise, position=seed % 7)
        assert result.output_tokens == _plain(target, noise, len(result.output_tokens), position=seed % 7)


def _completed_counts(target, draft, rounds: int, draft_noise_offset: int | None = None, verifier=GUMBEL):
    """Counts of one round's output completed to DRAFT_LEN + 1 tokens by plain sampling from
    the target with an independent generator (so only the round's own tokens are under test)."""
    completer = np.random.default_rng(12345)
    counts: dict = {}
    for seed in range(rounds):
        noise = GumbelNoise(seed)
        draft_noise = None if draft_noise_offset is None else GumbelNoise(seed + draft_noise_offset)
        skeleton = sample_gumbel_chain(NoiseAt(draft_noise or noise, 0), draft, DRAFT_LEN, VOCAB)
        tree = skeleton.with_target(np.stack([target(prefix) for prefix in skeleton.prefixes]))
        output = verifier.verify(tree, NoiseAt(noise, 0)).output_tokens
        while len(output) < DRAFT_LEN + 1:
            output += (int(completer.choice(VOCAB, p=target(output))),)
        counts[output] = counts.get(output, 0) + 1
    return counts


def test_one_round_output_law_is_the_targets():
    target, draft = _toy(3)
    counts = _completed_counts(target, draft, ROUNDS)
    assert chi_square_pvalue(counts, target_law(target, DRAFT_LEN + 1)) > FALSE_ALARM


def test_the_law_test_rejects_a_rule_that_emits_the_drafts_token():
    """Negative control (power): keep every draft token (the draft's law) -> rejected. Toys
    without exact zeros, so the rejection comes from the chi-square itself, not from a count on
    a cell of probability 0."""
    target = ToyModel(VOCAB, seed=3)
    draft = ToyDraft(target, seed=103)

    class KeepDraft:
        def verify(self, tree, draws):
            from verispec.verify.base import result_at

            leaf = tree.num_nodes - 1
            return result_at(tree, leaf, gumbel_argmax(tree.target, leaf, draws.noise, draws.position + DRAFT_LEN), True)

    counts = _completed_counts(target, draft, ROUNDS, verifier=KeepDraft())
    assert chi_square_pvalue(counts, target_law(target, DRAFT_LEN + 1)) < FALSE_ALARM


def exact_coupling_acceptance(p: np.ndarray, q: np.ndarray) -> float:
    """P(argmax log q + G = argmax log p + G) = sum_x 1 / sum_z max(p_z / p_x, q_z / q_x) (races)."""
    both = (p > 0) & (q > 0)
    total = 0.0
    for x in np.flatnonzero(both):
        total += 1.0 / np.sum(np.maximum(p / p[x], q / q[x]))
    return total


PAIRS = {
    "close": ([0.5, 0.3, 0.15, 0.05], [0.4, 0.35, 0.2, 0.05]),
    "far": ([0.7, 0.1, 0.1, 0.1], [0.1, 0.2, 0.3, 0.4]),
    "zeros": ([0.6, 0.0, 0.4, 0.0], [0.3, 0.3, 0.2, 0.2]),
}


@pytest.mark.parametrize("pair", PAIRS)
def test_first_token_acceptance_matches_the_exact_coupling_and_the_bound(pair):
    p, q = (np.array(v) for v in PAIRS[pair])
    target, draft = context_free_pair(p, q)
    tv = 0.5 * np.abs(p - q).sum()
    exact = exact_coupling_acceptance(p, q)
    assert exact >= (1 - tv) / (1 + tv) - 1e-12
    assert exact <= 1 - tv + 1e-12  # no coupling beats the optimal one
    rounds = 20_000
    accepted = sum(_round(target, draft, GumbelNoise(seed)).accepted_len >= 1 for seed in range(rounds))
    z = (accepted - rounds * exact) / np.sqrt(rounds * exact * (1 - exact))
    assert abs(z) < Z_LIMIT, (accepted / rounds, exact)


def test_draft_noise_not_shared_drops_acceptance_but_keeps_the_output():
    """Negative control: a draft drawn with other noise is an independent q-sample: acceptance
    falls to sum p q (below the coupling's), while every emitted token is still plain sampling's."""
    p, q = np.array(PAIRS["close"][0]), np.array(PAIRS["close"][1])
    target, draft = context_free_pair(p, q)
    rounds = 5_000
    shared = unshared = 0
    for seed in range(rounds):
        noise = GumbelNoise(seed)
        shared += _round(target, draft, noise).accepted_len >= 1
        result = _round(target, draft, noise, draft_noise=GumbelNoise(seed + 10**9))
        unshared += result.accepted_len >= 1
        assert result.output_tokens == _plain(target, noise, len(result.output_tokens))
    independent = float(p @ q)
    assert abs(unshared - rounds * independent) < Z_LIMIT * np.sqrt(rounds * independent * (1 - independent))
    assert shared - unshared > 5 * np.sqrt(rounds)


def test_with_a_plain_rng_the_rule_is_the_q_free_walk_on_an_ordinary_chain():
    """(What the exact enumeration of ``verispec audit`` runs.) One path from q, y ~ p."""
    target, draft = _toy(4)
    rng = SeededRng(0)
    skeleton = sample_chain(rng, draft, DRAFT_LEN)
    result = GUMBEL.verify(skeleton.with_target(np.stack([target(x) for x in skeleton.prefixes])), rng)
    assert 0 <= result.accepted_len <= DRAFT_LEN


def test_a_draft_with_another_vocabulary_is_refused_naming_both_sizes():
    target = ToyModel(VOCAB, seed=1)
    wide = ToyModel(VOCAB + 2, seed=2)
    with pytest.raises(ConfigError, match=r"6 tokens but the target's vocabulary has 4"):
        sample_gumbel_chain(NoiseAt(GumbelNoise(0), 0), wide, DRAFT_LEN, VOCAB)
    skeleton = sample_chain(SeededRng(0), wide, DRAFT_LEN)
    tree = skeleton.with_target(np.stack([target(()) for _ in skeleton.prefixes]), validate=False)
    with pytest.raises(ConfigError, match=r"6 tokens but the target's have 4"):
        GUMBEL.verify(tree, NoiseAt(GumbelNoise(0), 0))


def test_seeded_draws_are_a_seeded_rng_carrying_the_noise():
    draws = SeededDraws(5)
    assert draws.categorical(np.array([0.0, 1.0])) == 1
    assert draws.noise.seed == 5
    with pytest.raises(ConfigError, match="-2"):
        SeededDraws(-2)
