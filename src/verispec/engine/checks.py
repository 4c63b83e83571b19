"""Checks of a decoder's settings: output limits, stop strings, EOS ids, prompt ids and tree shapes,
each a ``ConfigError`` that names the bad value and the fix."""

from __future__ import annotations

import numpy as np

from verispec.errors import ConfigError

MAX_DRAFTS = 64
MAX_DRAFT_LEN = 64
DEFAULT_DRAFT_LEN = 4  # L when it is not given and not chosen per round
AUTO_MAX_DRAFT_LEN = 8  # the longest chain the per-round choice of L may pick
MAX_TREE_NODES = MAX_DRAFTS * MAX_DRAFT_LEN  # as many nodes as the largest K x L i.i.d. paths
OTM_MAX_TUPLES = 20_000


def check_max_new_tokens(max_new_tokens) -> int:
    """max_new_tokens as an int >= 1 (a fractional or boolean value is a ConfigError)."""
    if isinstance(max_new_tokens, bool) or not float(max_new_tokens).is_integer() or max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    return int(max_new_tokens)


def check_stop_strings(stop) -> tuple[str, ...]:
    if isinstance(stop, str):
        raise ConfigError(f"stop must be a list of strings, got the string {stop!r}; write stop=[{stop!r}]")
    stop = tuple(stop)
    if any(not isinstance(s, str) or not s for s in stop):
        raise ConfigError(f"stop strings must be non-empty strings, got {list(stop)!r}; drop the empty ones")
    return stop


def eos_token_ids(eos_token_id, tokenizer, target) -> set[int]:
    """The EOS ids: ``eos_token_id`` if given, else, with a tokenizer, the union of the tokenizer's
    EOS and the target model's ``generation_config.eos_token_id`` (chat models often list several,
    e.g. <|im_end|> and <|endoftext|>). Token-id decoding without a tokenizer has no implicit EOS."""
    if eos_token_id is None:
        if tokenizer is None:
            return set()
        found = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
        config = getattr(getattr(target, "model", None), "generation_config", None)
        if config is not None and getattr(config, "eos_token_id", None) is not None:
            found += list(np.atleast_1d(config.eos_token_id))
        found += list(getattr(target, "eos_token_ids", ()))  # a GGUF's own end tokens (llama.cpp backend)
        eos_token_id = found
    ids = [e for e in np.atleast_1d(np.asarray(eos_token_id, dtype=object)).tolist()]
    bad = [e for e in ids if isinstance(e, bool) or not float(e).is_integer() or e < 0]
    if bad:
        raise ConfigError(f"eos_token_id must be token ids >= 0, got {bad!r}; pass [] for no EOS")
    return {int(e) for e in ids}


def check_prompt_ids(prompt, vocab_size: int) -> list[int]:
    """Prompt token ids as ints in [0, vocab_size), else a ConfigError naming the offenders."""
    ids = [int(t) for t in prompt]
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ConfigError(
            f"prompt token ids must lie in [0, {vocab_size}) (the target's vocabulary), got {bad[:5]}; "
            "encode the prompt with the target's tokenizer"
        )
    return ids


def check_tree_shape(tree) -> list[int]:
    """Children per depth, within the K / L limits and at most MAX_TREE_NODES nodes."""
    tree = [int(width) for width in tree]
    if not tree or min(tree) < 1:
        raise ConfigError(f"tree must list >= 1 children per depth, got {tree}")
    if len(tree) > MAX_DRAFT_LEN or max(tree) > MAX_DRAFTS:
        raise ConfigError(
            f"tree {tree}: at most {MAX_DRAFT_LEN} depths (L) of at most {MAX_DRAFTS} children (K) each"
        )
    nodes, width = 0, 1
    for children in tree:
        width *= children
        nodes += width
        if nodes > MAX_TREE_NODES:
            raise ConfigError(f"tree {tree} has more than {MAX_TREE_NODES} nodes; use fewer children per depth")
    return tree
