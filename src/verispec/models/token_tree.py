"""Candidate tables of the training-free target-aware token-tree draft.

Two sources of candidates, both free of any model call:

* ``AdjacencyTable``: per token id, the target's top-k next tokens the last time the target was
  run on a node carrying that token (Token Recycling, Luo et al. 2024). Every target forward of the
  engine already computes logits at every scored node; ``update`` takes the top-k of their
  softmax (one ``torch.topk`` over (n, V)) and overwrites the rows of the scored tokens. The table persists
  across requests: it describes the target, not one prompt. Memory: V x k x (8 + 4) bytes
  (int64 ids + float32 probabilities), 4.7 MB for V = 49,152 and k = 8.
* ``SuffixIndex``: copy candidates. The positions of every token and bigram of the context (prompt
  + generated text) are indexed; a lookup extends each recent occurrence of the context's last
  bigram (or token) backwards to its full match length, so the longest suffix match anywhere in
  the context is found (capped at ``max_match``, not only n <= 3), and returns the continuations
  of the best occurrences (SuffixDecoding / prompt lookup).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from verispec.errors import ConfigError

EMPTY = -1


class AdjacencyTable:
    """[V, k] table of the target's top-k next tokens after each token id (EMPTY = never seen),
    with the target probability (temperature 1) each had when it was recorded."""

    def __init__(self, vocab_size: int, k: int = 8):
        if k < 1:
            raise ConfigError(f"the adjacency table needs k >= 1 candidates per token, got {k}")
        self.vocab_size = int(vocab_size)
        self.k = min(int(k), self.vocab_size)  # a tiny vocabulary has fewer than k tokens
        # int64 ids and float32 probabilities: the dtypes ``torch.topk`` writes, so ``update``
        # writes a row in place (``out=``), with no index assignment or cast (each cost ~45 us
        # right after a target forward, when its code is cold: a 30-layer forward evicts it).
        # The tensors are the only storage; ``next_tokens`` / ``next_probs`` are NumPy views made
        # on each read, so a copied table (copy.deepcopy) stays one table, not two halves.
        self._next_tokens = torch.full((self.vocab_size, self.k), EMPTY, dtype=torch.int64)
        self._next_probs = torch.zeros((self.vocab_size, self.k), dtype=torch.float32)

    @property
    def next_tokens(self) -> np.ndarray:
        """(V, k) int64 next token ids, EMPTY where never seen (a view of the table)."""
        return self._next_tokens.numpy()

    @property
    def next_probs(self) -> np.ndarray:
        """(V, k) float32 probabilities recorded with them (a view of the table)."""
        return self._next_probs.numpy()

    @property
    def nbytes(self) -> int:
        return int(self.next_tokens.nbytes + self.next_probs.nbytes)

    @torch.no_grad()
    def update(self, tokens: Sequence[int], logits: torch.Tensor) -> None:
        """Record the top-k of ``logits`` (n, V) as the next tokens of ``tokens`` (n,); rows of
        tokens < 0 (an unset root) are skipped. When a token occurs at several nodes the last
        row wins (the deepest, most recent context): only that row is read. ``update_rows`` over
        all n rows: its one softmax and two-stage top-k cost half the per-row ``torch.topk`` calls
        this used to make (5 rows: 172 against 335 us; 25 rows: 874 against 1843 us; V = 49,152,
        1 thread, Zen 5)."""
        self.update_rows(tokens, logits, range(len(tokens)))

    @torch.no_grad()
    def update_rows(self, tokens: Sequence[int], logits: torch.Tensor, rows: Sequence[int]) -> None:
        """``update`` for rows gathered from one larger forward: record the top-k of
        ``logits[rows[i]]`` ((m, V) logits, m >= max(rows) + 1) as the next tokens of ``tokens[i]``;
        tokens < 0 are skipped and when a token occurs several times the last entry wins. A batch
        (engine.batch) passes every sequence's scored rows of its batched forward at once, in turn
        order, so the table ends as the sequences' own ``update`` calls in that order would leave it.

        One softmax and one top-k for all rows, written by index: with 10-40 rows a round the
        per-row ``topk`` calls of ``update`` cost ~30 us each (its kernel scans all V entries).
        The top-k runs in two stages (``_top_k``) where the vocabulary allows. When the wanted rows
        are most of ``logits`` the softmax runs over all of them rather than over a copy of the
        wanted ones (copying a row costs ~2/3 of its softmax)."""
        last: dict[int, int] = {}
        for token, row in zip(tokens, rows):
            if token >= 0:
                last[int(token)] = int(row)
        if not last:
            return
        logits = logits.float().cpu()  # the table lives on the CPU
        picked = torch.tensor(list(last.values()), dtype=torch.long)
        ids = _top_k(logits, self.k, picked)
        if 3 * (logits.shape[0] - len(picked)) < 2 * len(picked):
            probs = torch.softmax(logits, dim=-1)[picked[:, None], ids]
        else:
            probs = torch.softmax(logits[picked], dim=-1).gather(1, ids)
        index = torch.tensor(list(last), dtype=torch.long)  # distinct tokens: one write per table row
        self._next_probs[index] = probs
        self._next_tokens[index] = ids

    def candidates(self, token: int) -> tuple[list[int], list[float]]:
        """(next tokens, recorded probabilities) of ``token``, best first, empties dropped (lists:
        the drafter reads them one by one, and two ``tolist`` calls cost less than NumPy masks)."""
        ids = self.next_tokens[token].tolist()
        known = ids.index(EMPTY) if EMPTY in ids else len(ids)  # a row is filled from its start
        return ids[:known], self.next_probs[token].tolist()[:known]

    # ----- a table kept between processes ---------------------------------------------------
    def save(self, path, target: str = "") -> None:
        """Write the rows seen so far to ``path`` (``.npz``): their token ids, next tokens (int32)
        and probabilities (float16), the vocabulary size and k, and ``target``, a name for the model
        the rows came from. A table learned over many prompts can start later decoders warm
        (``load``)."""
        seen = np.flatnonzero(self.next_tokens[:, 0] != EMPTY)
        np.savez_compressed(
            path, rows=seen.astype(np.int32), next_tokens=self.next_tokens[seen].astype(np.int32),
            next_probs=self.next_probs[seen].astype(np.float16), vocab_size=self.vocab_size, k=self.k,
            target=np.array(target),
        )

    @classmethod
    def load(cls, path, vocab_size: int) -> AdjacencyTable:
        """A table with the rows ``save`` wrote to ``path``, for a target of ``vocab_size`` tokens;
        refused (``ConfigError``) when the file is missing, unreadable or made for another vocabulary."""
        try:
            with np.load(path) as data:
                stored = {name: data[name] for name in ("rows", "next_tokens", "next_probs", "vocab_size", "k")}
        except (OSError, ValueError, KeyError) as error:
            raise ConfigError(f"adjacency table {str(path)!r} cannot be read ({error}); write one with AdjacencyTable.save, "
                              "or leave out adjacency= / --adjacency to start empty") from None
        if int(stored["vocab_size"]) != int(vocab_size):
            raise ConfigError(f"adjacency table {str(path)!r} was made for a vocabulary of {int(stored['vocab_size'])} tokens, "
                              f"the target has {int(vocab_size)}; use a table made with this target, or leave out adjacency= / --adjacency")
        table = cls(vocab_size, int(stored["k"]))
        rows = torch.from_numpy(stored["rows"].astype(np.int64))
        table._next_tokens[rows] = torch.from_numpy(stored["next_tokens"].astype(np.int64))
        table._next_probs[rows] = torch.from_numpy(stored["next_probs"].astype(np.float32))
        return table


# ``_top_k``'s first stage: the maximum of each block of this many vocabulary entries
TOP_K_BLOCK = 64


def _top_k(logits: torch.Tensor, k: int, rows: torch.Tensor | None = None) -> torch.Tensor:
    """(n, k) int64 ids of the k largest entries of each row ``rows`` (n,) of ``logits`` (m, V)
    (None: every row), largest first, read in place (no copy of the rows).

    Two stages where V is a multiple of ``TOP_K_BLOCK`` and has at least 4k blocks: the k largest
    entries lie in the k blocks with the largest maxima (any other block's maximum is below k
    entries already), so a top-k over the block maxima, then over those k blocks' entries, finds
    them: (15, 49152) float32, one thread: 120 us against 460 us for ``torch.topk`` over the rows
    (its CPU kernel walks all V entries per row). Ties at the k-th value may pick another of the
    tied ids than ``torch.topk`` would (a draft's candidates only, never an output)."""
    count, vocab = logits.shape
    if rows is None:
        rows = torch.arange(count)
    if vocab % TOP_K_BLOCK or vocab < 4 * k * TOP_K_BLOCK:
        return torch.topk(logits[rows], k, dim=-1).indices
    blocks = logits.view(count, vocab // TOP_K_BLOCK, TOP_K_BLOCK)
    top_blocks = torch.topk(blocks.amax(dim=-1)[rows], k, dim=-1).indices  # (n, k)
    entries = blocks[rows[:, None], top_blocks].view(len(rows), k * TOP_K_BLOCK)
    within = torch.topk(entries, k, dim=-1).indices
    return top_blocks.gather(1, within // TOP_K_BLOCK) * TOP_K_BLOCK + within % TOP_K_BLOCK


@dataclass(frozen=True)
class CopyMatch:
    """One earlier occurrence of the context's suffix: match_len tokens match, and the copy
    continues at context[start]."""

    start: int
    match_len: int


class SuffixIndex:
    """Index of the running context for longest-suffix-match copy candidates.

    max_match: longest match length measured (longer matches count as max_match);
    max_scan: most recent occurrences of the last bigram/token examined per lookup.
    """

    def __init__(self, max_match: int = 64, max_scan: int = 64):
        self.max_match = int(max_match)
        self.max_scan = int(max_scan)
        self.context: list[int] = []
        self._unigram: dict[int, list[int]] = {}
        self._bigram: dict[tuple[int, int], list[int]] = {}

    def reset(self, tokens: Sequence[int]) -> None:
        self.context = []
        self._unigram, self._bigram = {}, {}
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        context, unigram, bigram = self.context, self._unigram, self._bigram
        for token in tokens:
            token = int(token)
            context.append(token)
            end = len(context)  # the continuation of the n-gram ending here starts at index `end`
            unigram.setdefault(token, []).append(end)
            if end >= 2:
                bigram.setdefault((context[-2], token), []).append(end)

    def matches(self, limit: int = 3) -> list[CopyMatch]:
        """Up to ``limit`` earlier occurrences of the context's suffix whose continuations start
        with distinct tokens, longest match first (most recent first among equals). Occurrences
        of the last bigram are examined when there are any, else those of the last token."""
        context = self.context
        length = len(context)
        if length < 2:
            return []
        positions = self._bigram.get((context[-2], context[-1])) or self._unigram.get(context[-1], [])
        best: dict[int, CopyMatch] = {}
        for start in reversed(positions[-self.max_scan - 1 :]):
            if start >= length:  # the suffix itself
                continue
            match = 1
            while match < self.max_match and start - 1 - match >= 0 and context[start - 1 - match] == context[length - 1 - match]:
                match += 1
            first = context[start]
            if first not in best or match > best[first].match_len:
                best[first] = CopyMatch(start, match)
        return sorted(best.values(), key=lambda m: (-m.match_len, -m.start))[:limit]
