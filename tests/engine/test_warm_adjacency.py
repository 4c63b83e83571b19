"""A decoder's token-tree draft started from a learned adjacency table (``adjacency=``, the CLI's
``--adjacency``): it drafts from the table's rows from the first round, learns in its own copy, and
is refused for any other draft or another vocabulary. That the text does not change is
tests/engine/test_drafter_invariance.py's "token-trees-warm-table"."""


import argparse

import numpy as np
import pytest
import torch

from tests.engine.tiny import tiny_llama
from verispec.cli.generate import adjacency_flag
from verispec.engine.decoder import SpeculativeDecoder
from verispec.errors import ConfigError
from verispec.models.token_tree import EMPTY, AdjacencyTable

VOCAB = 12
PROMPT = [1, 2, 3]


@pytest.fixture(scope="module")
def target():
    return tiny_llama(0, vocab_size=VOCAB).double()


def learned_table(target) -> AdjacencyTable:
    """The target's own next tokens after every token (what decoding many prompts would leave)."""
    table = AdjacencyTable(VOCAB, k=3)
    with torch.no_grad():
        rows = torch.cat([target(torch.tensor([PROMPT + [token]])).logits[0, -1:] for token in range(VOCAB)])
    table.update(list(range(VOCAB)), rows)
    return table


def decoder(target, **kwargs):
    return SpeculativeDecoder(target, temperature=0.0, max_new_tokens=12, eos_token_id=[], **kwargs)


def test_a_warm_table_drafts_from_the_first_round_and_stays_unchanged(target):
    table = learned_table(target)
    before = table.next_tokens.copy(), table.next_probs.copy()
    cold, warm = decoder(target), decoder(target, adjacency=table)
    first_cold, first_warm = cold.generate(PROMPT).steps[0], warm.generate(PROMPT).steps[0]
    assert first_cold.tree_nodes == 1  # an empty table has nothing to offer yet
    assert first_warm.tree_nodes > 1 and first_warm.accepted_len >= 1  # the target's own rows: accepted
    assert warm.drafter.adjacency is not table  # the decoder learns in its own copy
    assert np.array_equal(table.next_tokens, before[0]) and np.array_equal(table.next_probs, before[1])


def test_a_table_is_read_from_its_file(target, tmp_path):
    learned_table(target).save(tmp_path / "table.npz")
    warm = decoder(target, adjacency=tmp_path / "table.npz")
    assert (warm.drafter.adjacency.next_tokens[:, 0] != EMPTY).all()
    assert warm.generate(PROMPT).steps[0].tree_nodes > 1


def test_a_table_is_refused_for_another_draft_or_vocabulary(target):
    with pytest.raises(ConfigError, match="token-tree draft"):
        decoder(target, draft="ngram", adjacency=AdjacencyTable(VOCAB))
    with pytest.raises(ConfigError, match="none \\(plain decoding\\)"):
        decoder(target, method="ar", adjacency=AdjacencyTable(VOCAB))
    with pytest.raises(ConfigError, match="has 5 tokens, the target 12"):
        decoder(target, adjacency=AdjacencyTable(5))


def test_the_cli_flag_starts_the_trees_from_a_file_and_refuses_plain_decoding(target, tmp_path):
    learned_table(target).save(tmp_path / "table.npz")
    for empty in (argparse.Namespace(), argparse.Namespace(adjacency=None), argparse.Namespace(adjacency="none")):
        trees = decoder(target, adjacency=adjacency_flag(empty))
        assert (trees.drafter.adjacency.next_tokens == EMPTY).all()
    given = adjacency_flag(argparse.Namespace(adjacency=str(tmp_path / "table.npz")))
    assert (decoder(target, adjacency=given).drafter.adjacency.next_tokens[:, 0] != EMPTY).all()
    with pytest.raises(ConfigError, match="token-tree draft"):
        decoder(target, method="ar", adjacency=given)
