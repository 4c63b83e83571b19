"""The oracle ceiling of ``benchmarks/robustness.py --ceiling``: the true reach probabilities of an
offered tree (against a brute-force forward per node on a tiny float64 target) and the Dinkelbach cut
that uses them (equal to the oracle when the draws are certain, below it when they are not, never a
number that depends on the draws it is not allowed to know)."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from tests.engine.tiny import tiny_llama
from verispec.core.sampling import SamplingParams
from verispec.draft.tree_policy import CandidateTree
from verispec.models.hf import HFModelAdapter

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def robustness():
    spec = importlib.util.spec_from_file_location("verispec_robustness_benchmark", ROOT / "benchmarks" / "robustness.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_true_reach_is_the_product_of_the_targets_probabilities_along_the_path(robustness):
    model = tiny_llama(3, vocab_size=7).double()
    probe = HFModelAdapter(model)
    context = [1, 4, 2, 5]
    # root 5; children 3 and 6; 3's child 0; 0's child 2
    offered = CandidateTree((5, 3, 6, 0, 2), (-1, 0, 0, 1, 3), (None,) * 5, (1.0, 0.5, 0.2, 0.3, 0.1), 2.1)
    params = SamplingParams(0.7, 0, 1.0)
    reach = robustness.true_reach(probe, context, offered, params)

    def probability(prefix, token):
        with torch.no_grad():
            logits = model(torch.tensor([prefix])).logits[0, -1]
        return float(torch.softmax(logits / 0.7, -1)[token])

    p3 = probability(context, 3)
    expected = [1.0, p3, probability(context, 6), p3 * probability(context + [3], 0),
                p3 * probability(context + [3], 0) * probability(context + [3, 0], 2)]
    assert reach == pytest.approx(expected, rel=1e-6)  # the adapter returns float32 logits
    greedy = robustness.true_reach(probe, context, offered, SamplingParams(0.0, 0, 1.0))
    assert set(greedy) <= {0.0, 1.0} and greedy[0] == 1.0


def test_the_ceiling_is_the_oracle_when_the_draws_are_certain_and_below_it_when_not(robustness):
    Round = robustness.CeilingRound
    costs = [1.0, 1.05, 1.1, 1.3]
    # certain draws (greedy): the expectations are the hindsight tokens, and the cut, which maximises
    # the total rate, does at least as well as the oracle's best size per round
    certain = [Round([1, 2, 3, 3], costs, [1, 2, 3, 3]), Round([1, 1, 1, 1], costs, [1, 1, 1, 1]),
               Round([1, 2, 2, 4], costs, [1, 2, 2, 4])]
    assert robustness.ceiling_fraction(certain) == pytest.approx(1.0, abs=1e-9)  # here the same sizes
    # two rounds with the same expectations but different luck: the cut is the same for both, the
    # oracle takes the lucky one long and the unlucky one short
    lucky, unlucky = Round([1, 2, 3, 4], costs, [1, 1.5, 2.0, 2.5]), Round([1, 1, 1, 1], costs, [1, 1.5, 2.0, 2.5])
    fraction = robustness.ceiling_fraction([lucky, unlucky])
    assert 0.5 < fraction < 1.0
    # negative control: expectations that peek at the draws (the hindsight tokens) reach the oracle
    peeking = [Round(r.tokens, costs, [float(t) for t in r.tokens]) for r in (lucky, unlucky)]
    assert robustness.ceiling_fraction(peeking) >= 1.0 - 1e-9
