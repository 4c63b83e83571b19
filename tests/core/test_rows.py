"""Row providers (core.rows, issue 16): the lazy logits backend the engine runs against the dense
reference backend, and the exactness of the rules THROUGH the lazy backend (ALGORITHMS.md §14.1).

What these catch:
* LogitRows computing a different distribution than ``logits_to_probs`` (temperature, top-k ties,
  top-p ties at the cut by id, exact zeros, greedy argmax ties), or prob() disagreeing with row();
* a rule whose lazy path (entries only, rows on demand, greedy shortcuts) diverges from the same
  rule on full rows: same random numbers must give the same output on many random trees;
* a rule that is not lossless when its rows come from logits (the engine's path).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.verify.exact import paths_sampler, tree_sampler
from verispec.core.rng import SeededRng, enumerate_outcomes
from verispec.core.rows import DenseRows, LogitRows, NodeRows
from verispec.core.sampling import SamplingParams, logits_to_probs
from verispec.core.tree import DraftScheme
from verispec.draft.samplers import sample_iid_paths, sample_tree
from verispec.errors import InvalidDistributionError
from verispec.theory.enumerate import BlockLaw, completed_block_law, max_abs_difference, target_law
from verispec.verify.registry import get_method

PARAMS = [
    SamplingParams(1.0),
    SamplingParams(0.0),
    SamplingParams(0.6, top_p=0.95),
    SamplingParams(0.8, top_k=7),
    SamplingParams(1.3, top_k=20, top_p=0.8),
    SamplingParams(1.0, top_p=0.5),
]


def _logits(generator: torch.Generator, rows: int, vocab: int, kind: int) -> torch.Tensor:
    """Peaked random logits; kind 0: integer logits (many exact ties), 1: a third of the
    vocabulary at -inf (exact zeros), 2: continuous."""
    logits = torch.randn(rows, vocab, generator=generator) * 2.5
    logits[:, : max(1, vocab // 20)] += 4.0  # a few dominant tokens, as in real models
    if kind == 0:
        logits = torch.round(logits)
    elif kind == 1:
        logits[:, vocab // 2 : vocab // 2 + vocab // 3] = float("-inf")
    return logits


@pytest.mark.parametrize("params", PARAMS, ids=repr)
def test_logit_rows_match_logits_to_probs(params):
    generator = torch.Generator().manual_seed(3)
    for trial in range(30):
        vocab = int(torch.randint(2, 400, (1,), generator=generator))
        logits = _logits(generator, 6, vocab, trial % 3)
        reference = logits_to_probs(logits, params)
        rows = LogitRows(logits, params)
        tokens = torch.randint(0, vocab, (6,), generator=generator).numpy()
        # entries first (the lazy path), then whole rows
        entries = rows.probs_of(range(6), tokens)
        dense = rows.dense()
        np.testing.assert_array_equal(reference > 0, dense > 0)  # same support: same truncation
        np.testing.assert_allclose(dense, reference, atol=1e-6, rtol=0)
        np.testing.assert_array_equal(entries, dense[np.arange(6), tokens])  # prob() == row() bit for bit
        np.testing.assert_allclose(dense.sum(axis=1), 1.0, atol=1e-6)
        assert all(rows.argmax(node) == int(np.argmax(reference[node])) for node in range(6))


def test_top_p_keeps_ties_at_the_cut_by_lowest_id():
    # four equal tokens of 0.25 each (after the top one): top_p = 0.5 cuts inside the tie
    logits = torch.log(torch.tensor([[0.2, 0.2, 0.4, 0.2]], dtype=torch.float64)).float()
    params = SamplingParams(1.0, top_p=0.7)
    rows = LogitRows(logits, params)
    np.testing.assert_array_equal(rows.row(0) > 0, logits_to_probs(logits, params)[0] > 0)
    assert list(rows.row(0) > 0) == [True, True, True, False]
    assert rows.prob(0, 3) == 0.0 and rows.prob(0, 1) > 0.0


def test_greedy_rows_are_point_masses_at_the_lowest_argmax_without_building_rows():
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0], [5.0, 5.0, 5.0, 5.0]])
    rows = LogitRows(logits, SamplingParams(0.0))
    assert rows.greedy and rows.argmax(0) == 1 and rows.argmax(1) == 0
    np.testing.assert_array_equal(rows.probs_of([0, 0, 1], [1, 2, 0]), [1.0, 0.0, 1.0])
    assert not rows._rows  # no one-hot vector was materialised for the entries
    np.testing.assert_array_equal(rows.dense(), logits_to_probs(logits, SamplingParams(0.0)))


@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.0), SamplingParams(0.7, top_p=0.9)], ids=repr)
def test_broken_logits_are_reported_when_their_row_is_touched(params):
    logits = torch.zeros(3, 5)
    logits[1, 2] = float("nan")
    logits[2] = float("-inf")
    rows = LogitRows(logits, params)
    assert rows.prob(0, 0) > 0.0  # healthy rows stay usable
    for node in (1, 2):
        with pytest.raises(InvalidDistributionError, match="NaN"):
            rows.probs_of([node], [0])


def test_node_rows_give_zero_rows_where_nothing_was_drawn():
    rows = NodeRows({0: np.array([0.25, 0.75])}, num_rows=3, vocab_size=2)
    assert rows.prob(0, 1) == 0.75 and rows.prob(2, 1) == 0.0
    np.testing.assert_array_equal(rows.dense(), [[0.25, 0.75], [0.0, 0.0], [0.0, 0.0]])


# ----- the rules: lazy backend == dense backend on the same random numbers ---------------------

# (rule, how its drafts are drawn): every hot rule, plus the rules that read full rows through
# PathRows / the dense compatibility arrays (spectr, gmpbv, SpecTr-GBV★, GBV-mod)
RULE_CASES = [
    ("sd", "chain"),
    ("bv", "chain"),
    ("gbv-mod", "chain"),
    ("nss", "iid_tree"),
    ("nss", "without_replacement"),
    ("traversal", "iid_paths"),
    ("traversal", "without_replacement"),
    ("traversal", "iid_tree"),
    ("rrs", "iid_paths"),
    ("rrs", "iid_tree"),
    ("rrsw", "iid_paths"),
    ("rrsw", "without_replacement"),
    ("spechub", "spechub_pair"),
    ("spectr", "iid_paths"),
    ("gmpbv", "iid_paths"),
    ("spectr-gbv-star", "iid_paths"),
]


class _LogitModel:
    """Random peaked logits per prefix (deterministic in the prefix), vocabulary V."""

    def __init__(self, vocab: int, seed: int, base: "_LogitModel | None" = None, noise: float = 1.0):
        self.vocab, self.seed, self.base, self.noise = vocab, seed, base, noise

    def __call__(self, prefix) -> torch.Tensor:
        generator = torch.Generator().manual_seed(hash((self.seed, tuple(prefix))) % (2**31))
        own = _logits(generator, 1, self.vocab, self.seed % 3)[0]
        if self.base is None:
            return own
        # a draft: the target's logits plus noise, so acceptance is neither 0 nor 1
        return self.base(prefix) + self.noise * torch.round(own) / 2.5


def _draw(rng, draft_fn, case, shape):
    if case == "chain":
        return sample_iid_paths(rng, draft_fn, 1, len(shape))
    if case == "iid_paths":
        return sample_iid_paths(rng, draft_fn, 3, len(shape))
    return sample_tree(rng, draft_fn, shape, DraftScheme(case))


def _trees(case, params, seed):
    """The same drafted tree twice: rows from logits (lazy) and the same rows as dense arrays."""
    vocab = 20 + seed * 7 % 90
    target = _LogitModel(vocab, seed)
    draft = _LogitModel(vocab, seed + 1, base=target, noise=1.5)
    draft_params = params if not params.greedy or case != "spechub_pair" else SamplingParams(1.0)
    shape = [2, 2, 1] if case != "chain" else [1, 1, 1, 1]
    skeleton = _draw(SeededRng(seed), lambda prefix: LogitRows(draft(prefix)[None], draft_params).row(0), case, shape)
    target_logits = torch.stack([target(prefix) for prefix in skeleton.prefixes])
    draft_logits = torch.stack([draft(prefix) for prefix in skeleton.prefixes])
    lazy = skeleton.with_target(LogitRows(target_logits, params), validate=False)
    lazy = type(lazy).build(lazy.tokens, lazy.parents, lazy.target, LogitRows(draft_logits, draft_params),
                            lazy.scheme, lazy.paths, validate=False)
    dense = type(lazy).build(
        lazy.tokens, lazy.parents, DenseRows(LogitRows(target_logits, params).dense(), greedy=params.greedy),
        DenseRows(LogitRows(draft_logits, draft_params).dense()), lazy.scheme, lazy.paths,
    )
    return lazy, dense


@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.0), SamplingParams(0.6, top_p=0.95),
                                    SamplingParams(0.9, top_k=5, top_p=0.9)], ids=repr)
@pytest.mark.parametrize("rule,case", RULE_CASES, ids=lambda x: str(x))
def test_lazy_and_dense_rows_give_the_same_output_on_the_same_random_numbers(rule, case, params):
    verifier = get_method(rule).verifier
    for seed in range(12):
        lazy, dense = _trees(case, params, seed)
        for draw in range(3):
            got = verifier.verify(lazy, SeededRng(100 * seed + draw))
            want = verifier.verify(dense, SeededRng(100 * seed + draw))
            assert (got.accepted_node, got.next_token, got.is_bonus) == (want.accepted_node, want.next_token, want.is_bonus)
            if params.greedy:
                # the greedy shortcuts (no row built, no draw from a point mass) against the full
                # rule on one-hot arrays: greedy outputs are deterministic, so they must agree
                full = type(dense).build(dense.tokens, dense.parents, DenseRows(dense.target.dense()), dense.draft,
                                         dense.scheme, dense.paths, validate=False)
                plain = verifier.verify(full, SeededRng(7))
                assert (plain.accepted_node, plain.next_token) == (got.accepted_node, got.next_token)


# ----- exactness through the lazy backend (the engine's code path) -------------------------------

# float32 accumulation of each row's mass (core.rows.LogitRows) leaves the rows normalised to
# ~1e-7; a wrong rule is off by >= 1e-3 on these toys
LAZY_EXACT_TOLERANCE = 2e-6


def _toy_logits(vocab: int, seed: int):
    """Context-dependent toy logits with exact zeros (-inf), and a correlated draft."""
    def target(prefix):
        generator = torch.Generator().manual_seed(hash((seed, tuple(prefix))) % (2**31))
        logits = torch.randn(vocab, generator=generator) * 1.5
        logits[int(torch.randint(0, vocab, (1,), generator=generator))] = float("-inf")
        return logits

    def draft(prefix):
        generator = torch.Generator().manual_seed(hash((seed + 1, tuple(prefix))) % (2**31))
        return torch.nan_to_num(target(prefix), neginf=-3.0) + torch.randn(vocab, generator=generator)

    return target, draft


def _lazy_block_law(verifier, sampler, target_logits, draft_logits, params):
    """The exact law of one block with every row of the round read through LogitRows."""
    def draft_fn(prefix):
        return LogitRows(draft_logits(prefix)[None], params).row(0)

    def program(rng):
        skeleton = sampler(rng, draft_fn)
        logits = torch.stack([target_logits(prefix) for prefix in skeleton.prefixes])
        result = verifier.verify(skeleton.with_target(LogitRows(logits, params), validate=False), rng)
        return result.output_tokens

    return BlockLaw(enumerate_outcomes(program), {})


LAZY_EXACT_CASES = [
    ("sd", paths_sampler(1, 3)),
    ("bv", paths_sampler(1, 3)),
    ("nss", tree_sampler([2, 1], DraftScheme.IID_TREE)),
    ("traversal", paths_sampler(2, 2)),
    ("rrs", tree_sampler([2, 1], DraftScheme.IID_TREE)),
    ("rrsw", tree_sampler([2, 1], DraftScheme.WITHOUT_REPLACEMENT)),
    ("spechub", tree_sampler([2, 1], DraftScheme.SPECHUB_PAIR)),
    ("spectr", paths_sampler(2, 2)),
    ("gmpbv", paths_sampler(2, 2)),
]


@pytest.mark.parametrize("params", [SamplingParams(0.8, top_k=4, top_p=0.9), SamplingParams(1.0)], ids=repr)
@pytest.mark.parametrize("rule,sampler", LAZY_EXACT_CASES, ids=lambda x: x if isinstance(x, str) else "")
def test_rules_are_exact_through_the_lazy_backend(rule, sampler, params):
    vocab = 5
    target_logits, draft_logits = _toy_logits(vocab, seed=len(rule))

    def processed(logit_fn):
        return lambda prefix: LogitRows(logit_fn(prefix)[None], params).row(0)

    law = _lazy_block_law(get_method(rule).verifier, sampler, target_logits, draft_logits, params)
    length = max(len(output) for output in law.probs)
    completed = completed_block_law(law, processed(target_logits), processed(draft_logits), length)
    assert max_abs_difference(completed, target_law(processed(target_logits), length)) < LAZY_EXACT_TOLERANCE


def test_greedy_through_the_lazy_backend_emits_the_target_argmax_chain():
    target_logits, draft_logits = _toy_logits(6, seed=4)
    params = SamplingParams(0.0)
    law = _lazy_block_law(get_method("sd").verifier, paths_sampler(1, 3), target_logits, draft_logits, params)
    assert len(law.probs) == 1
    (output,) = law.probs
    expected = []
    for _ in output:
        expected.append(int(LogitRows(target_logits(tuple(expected))[None], params).argmax(0)))
    assert list(output) == expected
