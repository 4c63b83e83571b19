"""Shared helpers of the exact-enumeration tests (ALGORITHMS.md §14.1 items 3-4)."""

from verispec.draft.samplers import sample_iid_paths, sample_tree
from verispec.theory.enumerate import (
    block_law,
    completed_block_law,
    generation_law,
    max_abs_difference,
    target_law,
)

EXACT_TOLERANCE = 1e-9


def paths_sampler(num_drafts: int, draft_len: int, merge: bool = True):
    return lambda rng, draft_fn: sample_iid_paths(rng, draft_fn, num_drafts, draft_len, merge=merge)


def tree_sampler(shape, scheme):
    return lambda rng, draft_fn: sample_tree(rng, draft_fn, shape, scheme)


def block_error(verifier, sampler, target, draft, completed_len: int):
    """max |completed output law - P| on V^{completed_len}, and the block law."""
    law = block_law(verifier, sampler, target, draft)
    completed = completed_block_law(law, target, draft, completed_len)
    return max_abs_difference(completed, target_law(target, completed_len)), law


def generation_error(verifier, sampler, target, draft, num_tokens: int, apply_modification: bool = True):
    law = generation_law(verifier, sampler, target, draft, num_tokens, apply_modification)
    return max_abs_difference(law, target_law(target, num_tokens))
