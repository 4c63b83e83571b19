"""Candidate tables of the token-tree draft (issue 12): the adjacency table holds the top-k of the
latest scored row per token with its probability; the suffix index finds the longest earlier
match of the context's suffix (checked against brute force, matches longer than 3 included)."""

import copy

import numpy as np
import pytest
import torch

from verispec.errors import ConfigError
from verispec.models.token_tree import EMPTY, TOP_K_BLOCK, AdjacencyTable, SuffixIndex, _top_k


def test_adjacency_rows_are_the_latest_top_k_with_probabilities():
    table = AdjacencyTable(5, k=2)
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0, -1.0], [5.0, 0.0, 0.0, 0.0, 4.0], [1.0, 0.0, 9.0, 0.5, 0.2]])
    table.update([-1, 3, 3], logits)  # root without token skipped; token 3 scored twice: last row wins
    assert table.next_tokens[3].tolist() == [2, 0]
    probs = torch.softmax(logits[2], -1)
    assert table.next_probs[3].astype(float) == pytest.approx([probs[2].item(), probs[0].item()], abs=1e-3)
    assert (table.next_tokens[[0, 1, 2, 4]] == EMPTY).all()
    tokens, _ = table.candidates(0)
    assert len(tokens) == 0
    table.update([0], logits[:1])
    tokens, recorded = table.candidates(0)
    assert tokens == [1, 3] and recorded[0] > recorded[1]
    assert table.nbytes == 5 * 2 * (8 + 4)


def test_a_copied_adjacency_table_records_into_itself_only():
    """update writes through torch tensors and the NumPy arrays are views of them: a deep copy (the
    batch benchmark copies a warmed table per configuration) must read what it recorded itself."""
    table = AdjacencyTable(5, k=2)
    table.update([1], torch.tensor([[0.0, 3.0, 1.0, 2.0, -1.0]]))
    twin = copy.deepcopy(table)
    twin.update([2], torch.tensor([[4.0, 0.0, 0.0, 1.0, 0.0]]))
    assert twin.candidates(2)[0] == [0, 3] and twin.candidates(1)[0] == [1, 3]
    assert table.candidates(2)[0] == [] and table.candidates(1)[0] == [1, 3]


@pytest.mark.parametrize("vocab", [5, 4 * 8 * TOP_K_BLOCK, 12 * TOP_K_BLOCK + 3])
def test_update_rows_records_what_update_calls_in_order_would(vocab):
    """A batch's refresh: rows gathered from one forward, tokens repeated within and across the
    sequences' trees; the table must end as per-sequence ``update`` calls in turn order leave it."""
    generator = torch.Generator().manual_seed(vocab)
    logits = torch.randn(9, vocab, generator=generator) * 4
    tokens = [3, -1, 4, 3, 1, 4, 2, 3, 0]
    rows = [8, 0, 2, 5, 1, 7, 3, 6, 4]  # the sequences' rows in turn order, not in packed order
    batched, alone = AdjacencyTable(vocab, k=8), AdjacencyTable(vocab, k=8)
    batched.update_rows(tokens, logits, rows)
    for part in (slice(0, 3), slice(3, 6), slice(6, 9)):  # three sequences, one update each
        alone.update(tokens[part], logits[rows[part]])
    assert (batched.next_tokens == alone.next_tokens).all()
    assert np.allclose(batched.next_probs, alone.next_probs, atol=1e-6)


@pytest.mark.parametrize("vocab", [4 * 8 * TOP_K_BLOCK, 768 * TOP_K_BLOCK])
def test_two_stage_top_k_is_torch_top_k(vocab):
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(6, vocab, generator=generator)
    logits[1, 100:140] = 50.0  # the top entries in one block and the next: ties broken alike here
    logits[2] = -logits[2].abs()
    expected = torch.topk(logits, 8).indices
    found = _top_k(logits, 8)
    assert torch.equal(logits.gather(1, found), logits.gather(1, expected))  # the same values, largest first
    assert torch.equal(found[[0, 2, 3, 4, 5]], expected[[0, 2, 3, 4, 5]])


def test_adjacency_needs_a_candidate():
    with pytest.raises(ConfigError, match="k >= 1"):
        AdjacencyTable(5, k=0)


def brute_longest_matches(context):
    """{continuation token: longest match length} over earlier occurrences of the suffix; when
    some occurrence matches >= 2 tokens, one-token matches are not candidates (the index looks
    up the last bigram first and falls back to the last token only without a bigram match)."""
    best = {}
    n = len(context)
    for start in range(1, n):
        match = 0
        while match < start and context[start - 1 - match] == context[n - 1 - match]:
            match += 1
        if match:
            token = context[start]
            best[token] = max(best.get(token, 0), match)
    if any(m >= 2 for m in best.values()):
        best = {token: m for token, m in best.items() if m >= 2}
    return best


@pytest.mark.parametrize("seed", range(20))
def test_suffix_index_finds_the_longest_match_per_continuation(seed):
    rng = np.random.default_rng(seed)
    # a small alphabet with repeated phrases, so matches longer than 3 occur
    phrase = rng.integers(0, 4, size=8).tolist()
    context = list(phrase)
    while len(context) < 120:
        context += phrase if rng.random() < 0.5 else rng.integers(0, 4, size=3).tolist()
    context += phrase  # the suffix repeats the phrase: a match of >= 8 tokens exists
    index = SuffixIndex(max_match=1000, max_scan=10_000)
    index.reset(context[:50])
    index.extend(context[50:])
    found = {context[m.start]: m.match_len for m in index.matches(limit=10)}
    assert found == brute_longest_matches(context)
    assert max(found.values()) > 3
    ordered = [m.match_len for m in index.matches(limit=10)]
    assert ordered == sorted(ordered, reverse=True)


def test_no_match_without_an_earlier_occurrence():
    index = SuffixIndex()
    index.reset([1, 2, 3])
    assert index.matches() == []
    index.extend([1, 2])
    (match,) = index.matches()
    assert (index.context[match.start], match.match_len) == (3, 2)


def test_a_saved_table_loads_with_the_same_rows(tmp_path):
    table = AdjacencyTable(7, k=3)
    logits = torch.randn(3, 7, generator=torch.Generator().manual_seed(0))
    table.update([4, 0, 6], logits)
    table.save(tmp_path / "table.npz", target="tiny")
    loaded = AdjacencyTable.load(tmp_path / "table.npz", 7)
    assert loaded.k == 3
    assert np.array_equal(loaded.next_tokens, table.next_tokens)  # unseen rows stay EMPTY
    assert loaded.next_probs == pytest.approx(table.next_probs, abs=1e-3)  # stored as float16
    assert loaded.candidates(4)[0] == table.candidates(4)[0] and loaded.candidates(1) == ([], [])


def test_loading_a_table_refuses_another_vocabulary_and_unreadable_files(tmp_path):
    table = AdjacencyTable(7, k=2)
    table.update([1], torch.arange(7.0)[None])
    table.save(tmp_path / "table.npz")
    with pytest.raises(ConfigError, match="vocabulary of 7 tokens, the target has 9"):
        AdjacencyTable.load(tmp_path / "table.npz", 9)
    with pytest.raises(ConfigError, match="cannot be read"):
        AdjacencyTable.load(tmp_path / "missing.npz", 7)
    (tmp_path / "junk.npz").write_bytes(b"not a table")
    with pytest.raises(ConfigError, match="cannot be read"):
        AdjacencyTable.load(tmp_path / "junk.npz", 7)
    np.savez(tmp_path / "other.npz", weights=np.zeros(3))
    with pytest.raises(ConfigError, match="cannot be read"):
        AdjacencyTable.load(tmp_path / "other.npz", 7)
