"""Feature capture of the target runners (issue 13 item 2): the hidden states a scoring forward
returns for EAGLE-3 heads equal ``models.eagle_head.target_features`` of a plain forward over each
input's whole root path, for prefill, chain and tree forwards, after commits and rollbacks, with
the native and the transformers runner."""

import pytest
import torch

from tests.engine.tiny import tiny_llama
from verispec.errors import ConfigError
from verispec.models.eagle_head import default_aux_layer_ids, target_features
from verispec.models.hf import HFModelAdapter

PROMPT = [1, 5, 2, 7, 3]


def reference(model, aux, sequence):
    """Features (len(sequence), F) of a plain causal forward over ``sequence``."""
    features, _ = target_features(model, torch.tensor([list(sequence)]), aux)
    return features[0]


def node_paths(tokens, parents, committed):
    """Each node's whole sequence: committed tokens (root included) + its drafted path."""
    paths = []
    for node, (token, parent) in enumerate(zip(tokens, parents)):
        paths.append(list(committed) if node == 0 else paths[parent] + [token])
    return paths


@pytest.fixture(scope="module")
def model():
    return tiny_llama(3, vocab_size=8, layers=8)


@pytest.mark.parametrize("backend", ["native", "transformers"])
def test_features_equal_a_plain_forward(model, backend):
    aux = default_aux_layer_ids(8)
    adapter = HFModelAdapter(model, backend=backend)
    adapter.enable_features(aux)
    adapter.reset(PROMPT)
    # prefill: every prompt position but the pending root
    torch.testing.assert_close(adapter.committed_features(0, len(PROMPT) - 1), reference(model, aux, PROMPT[:-1]), atol=1e-5, rtol=1e-5)
    rounds = [
        ([-1, 4, 6, 1], [-1, 0, 1, 2], [1, 2], 5),  # chain, two accepted
        ([-1, 2, 3, 0, 6, 1], [-1, 0, 0, 1, 1, 3], [2], 4),  # tree, one accepted (a non-first child)
        ([-1, 2, 3, 0, 6], [-1, 0, 0, 1, 1], [], 6),  # tree, nothing accepted
        ([-1, 5], [-1, 0], [1], 0),  # chain of one, accepted
    ]
    for tokens, parents, path, next_token in rounds:
        adapter.score([-1, 7, 7], [-1, 0, 1])  # a tree that is rolled back by the next score
        adapter.score(tokens, parents)
        committed = adapter.tokens()
        features = adapter.node_features()
        for node, sequence in enumerate(node_paths([committed[-1], *tokens[1:]], parents, committed)):
            torch.testing.assert_close(features[node], reference(model, aux, sequence)[-1], atol=1e-5, rtol=1e-5)
        adapter.commit(path, next_token)
        done = adapter.tokens()
        torch.testing.assert_close(
            adapter.committed_features(0, len(done) - 1), reference(model, aux, done[:-1]), atol=1e-5, rtol=1e-5
        )
    # append_committed: the new tokens have no features until the next forward computes them
    adapter.append_committed([3, 1], 2)
    with pytest.raises(ConfigError, match="not computed"):
        adapter.committed_features(0, len(adapter.tokens()) - 1)
    adapter.score([-1], [-1])
    adapter.commit([], 4)
    done = adapter.tokens()
    torch.testing.assert_close(adapter.committed_features(0, len(done) - 1), reference(model, aux, done[:-1]), atol=1e-5, rtol=1e-5)


def test_features_grow_past_the_initial_capacity():
    aux = (0, 4, 7)
    model = tiny_llama(3, vocab_size=8, layers=8, max_positions=512)
    adapter = HFModelAdapter(model, backend="native")
    adapter.enable_features(aux)
    prompt = [i % 8 for i in range(300)]
    adapter.reset(prompt)
    adapter.score([-1, 1, 2], [-1, 0, 1])
    adapter.commit([1, 2], 3)
    done = adapter.tokens()
    torch.testing.assert_close(adapter.committed_features(290, len(done) - 1), reference(model, aux, done[:-1])[290:], atol=1e-4, rtol=1e-4)


def test_features_off_by_default_and_bad_layers_refused(model):
    adapter = HFModelAdapter(model)
    adapter.reset(PROMPT)
    assert adapter.runner.last_features is None  # no capture unless enabled
    with pytest.raises(ConfigError, match="enable_features"):
        adapter.committed_features(0, 1)
    with pytest.raises(ConfigError, match=r"\[0, 7\]"):
        adapter.enable_features((2, 4, 8))
