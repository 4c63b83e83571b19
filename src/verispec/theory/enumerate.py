"""Exact output laws of verification rules on toy models (ALGORITHMS.md §14.1).

The replay enumerator (``verispec.core.rng.enumerate_outcomes``) runs the production sampler and
verifier once per branch of their random choices, which gives the exact law of one block's output
(x_{1:tau}, y) and of several iterations. The criteria of §14.1 items 3-4 then compare the
completed law with the target law P.

Models are plain callables ``prefix -> probability vector`` (tuple of ints -> (V,) float64).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from verispec.core.rng import Rng, enumerate_outcomes
from verispec.draft.samplers import DraftSkeleton
from verispec.verify.base import Verifier, VerifyResult
from verispec.verify.modification import ModificationWindow, Windows, advance_windows, effective_target

ProbFn = Callable[[tuple[int, ...]], np.ndarray]
# A sampler draws a draft skeleton below a context: (rng, draft_fn_at_context) -> skeleton
Sampler = Callable[[Rng, ProbFn], DraftSkeleton]


@dataclass
class LayeredProcess:
    """The target process in force: ``target`` modified by windows anchored at contexts
    (oldest first), as GBV-mod / SpecTr-GBV★ leave it (§4.3). ``probs(context)`` is p̂(.|context)."""

    target: ProbFn
    draft: ProbFn
    layers: tuple[tuple[tuple[int, ...], ModificationWindow], ...] = ()
    _memo: dict = field(default_factory=dict, repr=False)

    def _state(self, context: tuple[int, ...]) -> tuple[np.ndarray, Windows, tuple[np.ndarray, ...]]:
        if context in self._memo:
            return self._memo[context]
        if context:
            _, parent_windows, parent_bases = self._state(context[:-1])
            windows = advance_windows(parent_windows, parent_bases, context[-1], self.draft(context[:-1]))
        else:
            windows = ()
        windows += tuple(window for anchor, window in self.layers if anchor == context)
        raw = self.target(context)
        vector, bases, _ = effective_target(windows, raw, self.draft(context)) if windows else (raw, (), 0)
        self._memo[context] = (vector, windows, bases)
        return self._memo[context]

    def probs(self, context: tuple[int, ...]) -> np.ndarray:
        return self._state(tuple(context))[0]

    def with_layer(self, anchor: tuple[int, ...], window: ModificationWindow | None) -> "LayeredProcess":
        if window is None:
            return self
        return LayeredProcess(self.target, self.draft, self.layers + ((tuple(anchor), window),))


def run_step(
    verifier: Verifier, sampler: Sampler, process: LayeredProcess, context: tuple[int, ...], rng: Rng
) -> VerifyResult:
    """One iteration below ``context``: draft (through rng), score with the process, verify."""
    context = tuple(context)
    skeleton = sampler(rng, lambda prefix: process.draft(context + prefix))
    target_probs = np.stack([process.probs(context + prefix) for prefix in skeleton.prefixes])
    return verifier.verify(skeleton.with_target(target_probs, validate=False), rng)


@dataclass(frozen=True)
class BlockLaw:
    """Exact law of one block's output; ``windows[output]`` is the modification it leaves."""

    probs: dict[tuple[int, ...], float]
    windows: dict[tuple[int, ...], ModificationWindow | None]

    @property
    def expected_accepted_len(self) -> float:
        return sum(prob * (len(output) - 1) for output, prob in self.probs.items())


def block_law(verifier: Verifier, sampler: Sampler, target: ProbFn, draft: ProbFn, context=(), layers=()) -> BlockLaw:
    """Exact law of one iteration's output below ``context``, with the target modified by
    ``layers`` (anchored windows left by earlier iterations)."""
    process = LayeredProcess(target, draft, tuple(layers))
    windows: dict = {}

    def program(rng: Rng):
        result = run_step(verifier, sampler, process, context, rng)
        windows[result.output_tokens] = result.modification
        return result.output_tokens

    return BlockLaw(enumerate_outcomes(program), windows)


def sequence_law(process: LayeredProcess, context: tuple[int, ...], length: int) -> dict[tuple[int, ...], float]:
    """Law of the next ``length`` tokens under the (possibly modified) process."""
    law = {(): 1.0}
    for _ in range(length):
        nxt = {}
        for seq, prob in law.items():
            vector = process.probs(tuple(context) + seq)
            for token in np.flatnonzero(vector > 0):
                nxt[seq + (int(token),)] = prob * float(vector[token])
        law = nxt
    return law


def completed_block_law(law: BlockLaw, target: ProbFn, draft: ProbFn, length: int, context=()) -> dict[tuple[int, ...], float]:
    """§14.1 item 3: fill each output up to ``length`` tokens by sampling from the target process
    the block leaves behind (modified where the rule modifies it), summing over all tails."""
    completed: dict[tuple[int, ...], float] = defaultdict(float)
    base = LayeredProcess(target, draft)
    for output, prob in law.probs.items():
        process = base.with_layer(tuple(context) + output, law.windows.get(output))
        tails = sequence_law(process, tuple(context) + output, length - len(output))
        for tail, tail_prob in tails.items():
            completed[output + tail] += prob * tail_prob
    return dict(completed)


def generation_law(
    verifier: Verifier, sampler: Sampler, target: ProbFn, draft: ProbFn, num_tokens: int, apply_modification: bool = True
) -> dict[tuple[int, ...], float]:
    """§14.1 item 4: law of the first ``num_tokens`` tokens generated by repeated iterations,
    each using the target process left by the previous ones (nested modifications).

    Dynamic programming over iterations: the state after an iteration is (tokens, windows in
    force); each distinct state's next block is enumerated once, which is exact and far cheaper
    than enumerating whole generations leaf by leaf.
    """
    frontier: dict[tuple, float] = {((), ()): 1.0}
    final: dict[tuple[int, ...], float] = defaultdict(float)
    while frontier:
        successors: dict[tuple, float] = defaultdict(float)
        for (tokens, layers), prob in frontier.items():
            law = block_law(verifier, sampler, target, draft, context=tokens, layers=layers)
            for output, output_prob in law.probs.items():
                produced = tokens + output
                window = law.windows.get(output) if apply_modification else None
                if len(produced) >= num_tokens:
                    final[produced[:num_tokens]] += prob * output_prob
                else:
                    successors[(produced, layers + (((produced, window),) if window else ()))] += prob * output_prob
        frontier = successors
    return dict(final)


def max_abs_difference(law: dict, reference: dict) -> float:
    keys = set(law) | set(reference)
    return max((abs(law.get(k, 0.0) - reference.get(k, 0.0)) for k in keys), default=0.0)


def total_variation(law: dict, reference: dict) -> float:
    keys = set(law) | set(reference)
    return 0.5 * sum(abs(law.get(k, 0.0) - reference.get(k, 0.0)) for k in keys)


def target_law(target: ProbFn, length: int, context=()) -> dict[tuple[int, ...], float]:
    return sequence_law(LayeredProcess(target, target), tuple(context), length)


def all_sequences(vocab_size: int, length: int):
    return itertools.product(range(vocab_size), repeat=length)
