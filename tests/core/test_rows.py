"""Row providers (core.rows, issue 16): the lazy logits backend the engine runs against the dense
reference backend, and the exactness of the rules THROUGH the lazy backend (ALGORITHMS.md §14.1).

What these catch:
* LogitRows computing a different distribution than ``logits_to_probs`` (temperature, top-k ties,
  top-p ties at the cut by id, exact zeros, greedy argmax ties), through either kernels (NumPy on
  the host, torch as on a GPU) and for bf16 logits, or prob() disagreeing with row();
* support() / gather() differing from row() in any entry, missing a positive entry, ids out of
  order, or building a dense row where they must not (every backend and sampling setting);
* a top-p nucleus found wrong at large V by any of its candidate passes, or rounding that merges
  logits at a truncation cut dropping a token logits_to_probs keeps;
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
from verispec.errors import ConfigError, InvalidDistributionError
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


# (kernels, logits dtype): NumPy on views of CPU float32 logits (the engine's CPU path), the torch
# kernels a GPU runs (here on CPU tensors), and bf16 logits (converted per touched row)
KERNEL_CASES = [("host", torch.float32), ("device", torch.float32), ("host", torch.bfloat16), ("device", torch.bfloat16)]


@pytest.mark.parametrize("kernels,dtype", KERNEL_CASES, ids=str)
@pytest.mark.parametrize("params", PARAMS, ids=repr)
def test_logit_rows_match_logits_to_probs(params, kernels, dtype):
    generator = torch.Generator().manual_seed(3)
    for trial in range(30):
        vocab = int(torch.randint(2, 400, (1,), generator=generator))
        logits = _logits(generator, 6, vocab, trial % 3).to(dtype)
        reference = logits_to_probs(logits, params)
        rows = LogitRows(logits, params, kernels=kernels)
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


@pytest.mark.parametrize("kernels", ["host", "device"])
@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.0), SamplingParams(0.7, top_p=0.9),
                                    SamplingParams(0.7, top_k=2)], ids=repr)
def test_broken_logits_are_reported_when_their_row_is_touched(params, kernels):
    logits = torch.zeros(5, 5)
    logits[1, 2] = float("nan")
    logits[2] = float("-inf")
    logits[3, 4] = float("inf")
    logits[4, 0], logits[4, 3] = float("inf"), float("nan")  # +inf before a NaN: the argmax sees one of them
    rows = LogitRows(logits, params, kernels=kernels)
    assert rows.prob(0, 0) > 0.0  # healthy rows stay usable
    for node in (1, 2, 3, 4):
        for touch in (lambda: rows.probs_of([node], [0]), lambda: rows.support(node), lambda: rows.gather(node, [0])):
            with pytest.raises(InvalidDistributionError, match="NaN"):
                touch()


def test_node_rows_give_zero_rows_where_nothing_was_drawn():
    rows = NodeRows({0: np.array([0.25, 0.75])}, num_rows=3, vocab_size=2)
    assert rows.prob(0, 1) == 0.75 and rows.prob(2, 1) == 0.0
    np.testing.assert_array_equal(rows.dense(), [[0.25, 0.75], [0.0, 0.0], [0.0, 0.0]])


# ----- support() and gather(): the residuals' view of a row (issue 16) --------------------------

SUPPORT_PARAMS = [*PARAMS, SamplingParams(0.6, top_p=0.95, top_k=50)]


def _check_support_and_gather(rows, node, generator, lazy_rows_cache=None):
    """support(node) and gather(node, .) against row(node), entry by entry, bit for bit; the
    support and gathers are asked for BEFORE the row, so the lazy path is what is checked."""
    vocab = rows.vocab_size
    ids, values = rows.support(node)
    probe = torch.randint(0, vocab, (12,), generator=generator).numpy()
    probe = np.concatenate([probe, probe[:3], ids[:5]])  # repeats and support ids
    gathered = rows.gather(node, probe)
    on_support = rows.gather(node, ids)
    if lazy_rows_cache is not None:
        assert not lazy_rows_cache  # nothing above built a dense row
    row = rows.row(node)
    assert ids.dtype == np.int64 and values.dtype == np.float64 and ids.shape == values.shape
    assert np.all(np.diff(ids) > 0), "support ids must be strictly ascending"
    np.testing.assert_array_equal(values, row[ids])
    np.testing.assert_array_equal(on_support, values)
    np.testing.assert_array_equal(gathered, row[probe])
    assert set(np.flatnonzero(row > 0)) <= set(ids.tolist()), "the support misses a positive entry"
    assert rows.gather(node, []).shape == (0,)


@pytest.mark.parametrize("kernels,dtype", KERNEL_CASES, ids=str)
@pytest.mark.parametrize("params", SUPPORT_PARAMS, ids=repr)
def test_logit_rows_support_and_gather_equal_the_row(params, kernels, dtype):
    generator = torch.Generator().manual_seed(11)
    for trial in range(24):
        vocab = int(torch.randint(2, 500, (1,), generator=generator))
        logits = _logits(generator, 4, vocab, trial % 3).to(dtype)
        rows = LogitRows(logits, params, kernels=kernels)
        truncated = params.greedy or params.top_p < 1.0 or 0 < params.top_k < vocab
        for node in range(4):
            # truncated and greedy rows answer support/gather without a dense row
            _check_support_and_gather(rows, node, generator, rows._rows if truncated and node == 0 else None)
        # the support is the processed row's support: same truncation as logits_to_probs
        reference = logits_to_probs(logits, params)
        for node in range(4):
            ids, values = rows.support(node)
            if truncated:
                np.testing.assert_array_equal(ids, np.flatnonzero(reference[node] > 0))
            np.testing.assert_allclose(values, reference[node, ids], atol=1e-6, rtol=0)


@pytest.mark.parametrize("params", SUPPORT_PARAMS, ids=repr)
def test_node_and_dense_rows_support_and_gather_equal_the_row(params):
    generator = torch.Generator().manual_seed(12)
    for trial in range(6):
        vocab = int(torch.randint(2, 300, (1,), generator=generator))
        probs = logits_to_probs(_logits(generator, 4, vocab, trial % 3), params)
        node_rows = NodeRows({0: probs[0], 2: probs[2]}, num_rows=4, vocab_size=vocab)
        for rows in (node_rows, DenseRows(probs, greedy=params.greedy)):
            for node in range(4):
                _check_support_and_gather(rows, node, generator)
        for node in (1, 3):  # nothing drawn there: an empty support, zero entries
            ids, values = node_rows.support(node)
            assert ids.size == 0 and values.size == 0 and ids.dtype == np.int64
            np.testing.assert_array_equal(node_rows.gather(node, [0, vocab - 1]), [0.0, 0.0])


def test_greedy_support_is_the_argmax_point_mass_without_building_rows():
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0], [5.0, 5.0, 5.0, 5.0], [-1.0, 2.0, 7.0, 7.0]]).bfloat16()
    for kernels in ("host", "device"):
        rows = LogitRows(logits, SamplingParams(0.0), kernels=kernels)
        for node, argmax in enumerate([1, 0, 2]):
            ids, values = rows.support(node)
            assert ids.tolist() == [argmax] and values.tolist() == [1.0]
            np.testing.assert_array_equal(rows.gather(node, [3, argmax, 0]), [float(argmax == 3), 1.0, float(argmax == 0)])
        assert not rows._rows


def test_top_p_tie_at_the_cut_is_in_the_support_by_lowest_id():
    # p = (0.2, 0.2, 0.4, 0.2): top_p = 0.7 needs 0.4 + 0.2 + 0.2 (cum 0.8): of the three tied
    # tokens at 0.2 the two lowest ids are kept
    logits = torch.log(torch.tensor([[0.2, 0.2, 0.4, 0.2]], dtype=torch.float64)).float()
    for kernels in ("host", "device"):
        rows = LogitRows(logits, SamplingParams(1.0, top_p=0.7), kernels=kernels)
        ids, values = rows.support(0)
        assert ids.tolist() == [0, 1, 2]
        np.testing.assert_allclose(values, [0.25, 0.25, 0.5], rtol=1e-6)
        np.testing.assert_array_equal(rows.gather(0, [3, 1]), [0.0, values[1]])


def test_truncation_keeps_logits_that_rounding_merges_with_the_cut():
    # max logit 8: in float32, 1.1e-7 - 8, 1e-7 - 8 and 0 - 8 all round to -8, so the three
    # distinct logits share one s; top-k = 3 cuts at 1.1e-7 and logits_to_probs keeps all three
    logits = torch.tensor([[8.0, 0.0, 1e-7, 1.1e-7, -3.0, 7.0]])
    assert len(set(((logits[0, 1:4] - 8.0) / 0.7).tolist())) == 1
    # with top_p = 0.99999 the nucleus then ends inside those ties: lowest ids first
    for params in (SamplingParams(1.0, top_k=3), SamplingParams(0.7, top_k=3), SamplingParams(0.7, top_k=3, top_p=0.99999)):
        for kernels in ("host", "device"):
            rows = LogitRows(logits, params, kernels=kernels)
            reference = logits_to_probs(logits, params)[0]
            ids, _ = rows.support(0)
            assert ids.tolist() == ([0, 1, 2, 5] if params.top_p < 1.0 else [0, 1, 2, 3, 5])
            np.testing.assert_array_equal(ids, np.flatnonzero(reference > 0))
            np.testing.assert_array_equal(rows.row(0) > 0, reference > 0)


def test_top_k_with_fewer_finite_logits_than_k_keeps_every_finite_token():
    logits = torch.full((1, 30), float("-inf"))
    logits[0, [3, 17, 20]] = torch.tensor([1.0, 2.0, 0.5])
    for kernels in ("host", "device"):
        rows = LogitRows(logits, SamplingParams(0.9, top_k=7), kernels=kernels)
        reference = logits_to_probs(logits, SamplingParams(0.9, top_k=7))[0]
        ids, values = rows.support(0)
        np.testing.assert_array_equal(rows.row(0), np.where(np.isin(np.arange(30), ids), rows.row(0), 0.0))
        np.testing.assert_allclose(rows.row(0), reference, atol=1e-7, rtol=0)


def _float64_nucleus(logits: torch.Tensor, params: SamplingParams) -> np.ndarray:
    """The processed row in float64 throughout from the float32 s (a sort of all V, exact mass):
    the reference at large V, where logits_to_probs's float32 softmax itself moves the top-p cut
    by a few tokens of p ~ 1e-6."""
    scaled = ((logits.float() - logits.float().max()) / params.temperature).double().numpy()
    probs = np.exp(scaled - np.log(np.sum(np.exp(scaled))))
    order = np.lexsort((np.arange(len(probs)), -probs))
    crossing = int(np.searchsorted(np.cumsum(probs[order]), params.top_p - 1e-12))
    kept = np.zeros(len(probs))
    kept[order[: crossing + 1]] = probs[order[: crossing + 1]]
    return kept / kept.sum()


@pytest.mark.parametrize("kernels", ["host", "device"])
def test_nucleus_at_large_vocabularies_every_candidate_pass(kernels):
    """Rows whose nucleus needs the first candidate pass (peaked), the second (p ~ 2e-5 < 3e-5
    everywhere: near uniform) and the last ((1 - top_p)/(4V): a tail of p ~ 6e-7 < 1e-6 that
    the nucleus must reach), at V = 50,000, against the float64 reference: the same tokens up to
    the float32 mass over V that places the cut (what they differ in holds < 4e-6 of the mass;
    the tail row is the worst case of float32 accumulation, ~1.6e-6)."""
    generator = torch.Generator().manual_seed(5)
    peaked = torch.randn(50_000, generator=generator) * 3.0
    flat = torch.randn(50_000, generator=generator) * 0.05
    tail = torch.full((50_000,), -12.0)
    tail[:10] = 0.0
    tail[30_000:] = float("-inf")  # 20,000 finite logits
    logits = torch.stack([peaked, flat, tail])
    for params in (SamplingParams(0.6, top_p=0.95), SamplingParams(1.0, top_p=0.995)):
        rows = LogitRows(logits, params, kernels=kernels)
        for node in range(3):
            reference = _float64_nucleus(logits[node], params)
            ids, values = rows.support(node)
            differing = np.setxor1d(ids, np.flatnonzero(reference > 0))
            assert reference[differing].sum() + rows.gather(node, differing).sum() < 4e-6
            assert len(differing) < 0.001 * len(ids) + 2
            np.testing.assert_allclose(values, reference[ids], atol=1e-6, rtol=0)
            # the kept mass is the float64 normaliser: p = exp(s - log_norm) entry by entry, whose
            # sum is 1 up to one rounding per entry (n eps); a fixed 1e-12 failed at n = 21,715 when
            # torch summed with 2 threads in another order (1.2e-12)
            assert abs(values.sum() - 1.0) < len(values) * np.finfo(np.float64).eps
    assert len(rows.support(2)[0]) > 10_000  # at T = 1 the tail row's nucleus reaches into the tail


@pytest.mark.parametrize("kernels", ["host", "device"])
def test_untruncated_rows_sum_to_one_where_float32_accumulation_would_not(kernels):
    # 10 dominant tokens over 128,000 at e^-12: a float32 sum of the mass is off by ~1.6e-6 here;
    # the normaliser of an untruncated row must not be (categorical() checks sums to 1e-6)
    logits = torch.full((1, 128_010), -12.0)
    logits[0, :10] = 0.0
    row = LogitRows(logits, SamplingParams(1.0), kernels=kernels).row(0)
    assert abs(row.sum() - 1.0) < 2e-7


def test_host_and_device_kernels_give_the_same_rows():
    generator = torch.Generator().manual_seed(8)
    for params in SUPPORT_PARAMS:
        for trial in range(6):
            vocab = int(torch.randint(2, 3000, (1,), generator=generator))
            logits = _logits(generator, 3, vocab, trial % 3)
            host, device = LogitRows(logits, params, kernels="host"), LogitRows(logits, params, kernels="device")
            for node in range(3):
                np.testing.assert_array_equal(host.support(node)[0], device.support(node)[0])
                # the float32 mass over V may be summed in another order: the normaliser differs by rounding
                np.testing.assert_allclose(host.row(node), device.row(node), rtol=1e-6, atol=0)


def test_logit_rows_read_strided_logits_in_place():
    generator = torch.Generator().manual_seed(9)
    logits = _logits(generator, 4, 300, 2)
    strided = logits.t().contiguous().t()  # same values, column-major
    assert not strided.is_contiguous()
    for params in (SamplingParams(0.0), SamplingParams(0.6, top_p=0.95), SamplingParams(1.0)):
        np.testing.assert_array_equal(LogitRows(strided, params).dense(), LogitRows(logits, params).dense())


def test_unknown_kernels_are_refused_with_the_choices():
    with pytest.raises(ConfigError, match="kernels must be one of"):
        LogitRows(torch.zeros(1, 3), SamplingParams(1.0), kernels="gpu")


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
