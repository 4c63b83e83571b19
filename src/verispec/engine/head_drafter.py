"""``HeadDrafter``: an EAGLE-3 draft head (``models.eagle_head``) reading the target's own features.

The target adapter (``models.hf.HFModelAdapter`` with ``enable_features``) keeps, for every cached
committed position j, the target's hidden states at the head's ``aux_layer_ids`` (captured by the
verification forward itself, no extra forward). The head keeps its own KV cache:

    [ committed entries 0..c-1 | speculative entries of this round ]

Committed entry j pairs the target feature of position j with the token at position j + 1 and sits
at RoPE position j (``models.eagle_head`` "Alignment"). With committed tokens x_0..x_t and the pending
root x_{t+1}, ``begin_round`` runs ONE head step over the entries c..t not consumed yet (their
features come from the target's last verification forward); the output of entry t gives the
depth-1 q. A drafted prefix (y_1..y_d) is one speculative entry at position t + d, fed the output of
its parent's entry (no fc) and the embedding of y_d; it attends to every committed entry, to its
ancestors' speculative entries and to itself (siblings share a position, never see each other).
Each tree level the samplers ask for (``batch_probs``) is ONE head call. ``commit`` drops every
speculative entry: the accepted tokens' entries are rebuilt next round from the target's features,
as EAGLE does. So q of a prefix is computed from the head's own outputs while it is speculative and
from target features once committed: q is not a function of the token sequence alone, which is
why the target-modifying rules (GBV-mod, SpecTr-GBV*, ALGORITHMS.md §4.3, §6.3) are refused.

q rows: ``head.target_logits`` (-inf outside the draft vocabulary) -> the draft's sampling
parameters (``core.sampling.logits_to_probs``) -> (V,) float64, exactly 0 outside the draft
vocabulary. Before any target feature exists (a one-token prompt) the depth-1 row is uniform over
the draft vocabulary (any q keeps the lossless rules exact).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from verispec.core.sampling import SamplingParams, logits_to_probs
from verispec.engine.drafters import DraftFn, _RoundFn
from verispec.errors import ConfigError
# one definition each: the CLI exporter resolves "head" in SHIPPED_HEAD_DIR too, load_any_head runs the same check
from verispec.models.head_formats import SHIPPED_HEAD_DIR, check_head_matches_target
from verispec.models.kv_buffer import MIN_CAPACITY, KVBuffers

# rules whose target modification assumes q(.|prefix) is a function of the token sequence alone
CONTEXT_ONLY_Q_RULES = ("gbv-mod", "spectr-gbv-star")


def is_head_source(draft) -> bool:
    """Whether ``draft`` names a head: "head", an ``Eagle3Head``, or a directory holding a verispec
    head (``verispec_head.json``) or an EAGLE-3 / speculators checkpoint (when the exporter's
    loader ``models.head_formats.load_any_head`` is installed)."""
    from verispec.models.eagle_head import Eagle3Head, is_head_dir

    if isinstance(draft, Eagle3Head) or (isinstance(draft, str) and draft == "head"):
        return True
    if not isinstance(draft, (str, Path)) or not Path(draft).is_dir():
        return False
    if is_head_dir(draft):
        return True
    config = Path(draft) / "config.json"
    if config.is_file():
        text = config.read_text()
        # LlamaForCausalLMEagle3 / speculators_model_type "eagle3" / EAGLE-3's draft_vocab_size
        return "Eagle3" in text or "eagle3" in text or "draft_vocab_size" in text
    return False


def load_head_source(draft, target) -> object:
    """The ``Eagle3Head`` named by ``draft`` (see ``is_head_source``) in the dtype and on the device of
    ``target`` (an ``HFModelAdapter``)."""
    from verispec.models.eagle_head import Eagle3Head, is_head_dir, load_head

    dtype, device = target.dtype, target.device
    if isinstance(draft, Eagle3Head):
        return draft.to(device=device, dtype=dtype).eval()
    directory = SHIPPED_HEAD_DIR if isinstance(draft, str) and draft == "head" else Path(draft)
    if draft == "head" and not is_head_dir(directory):
        raise ConfigError(
            f"this install ships no trained draft head ({directory} is missing); give a head directory "
            "(--draft DIR / draft=DIR, written by 'verispec train-head' or 'verispec export-head'), or use "
            "--draft tree / ngram"
        )
    if is_head_dir(directory):
        return load_head(directory, dtype=dtype, device=device)
    from verispec.models.head_formats import load_any_head

    embedding = target.model.get_input_embeddings().weight
    return load_any_head(
        directory, target_config=target.model.config, dtype=dtype, device=device, target_embedding=embedding
    ).eval()


class HeadDrafter:
    """A drafter over an ``Eagle3Head`` and the target adapter whose features it reads.

    head: ``models.eagle_head.Eagle3Head`` (dtype/device as it is); target: the decoder's
    ``HFModelAdapter`` (``enable_features`` is called here, takes effect at its next reset);
    params: the draft's sampling parameters; initial_capacity: head KV entries allocated at first
    (doubled when a round needs more, ``models.kv_buffer``).
    """

    def __init__(self, head, target, params: SamplingParams, initial_capacity: int = MIN_CAPACITY):
        check_head_matches_target(head.config, target.model.config)
        self.head = head
        self.target = target
        self.params = params
        self.vocab_size = int(head.config.vocab_size)
        self.calls = 0  # head calls (one per begin_round, one per deeper tree level)
        # the head's forward (``Eagle3Head.step`` with a batch of one); a batch replaces it with a
        # step queued for one packed call over its sequences (``models.head_batch``)
        self.step = head.step
        self.feature_layers = tuple(head.config.aux_layer_ids)  # the decoder turns the target's capture on
        target.enable_features(self.feature_layers)  # validates them against the target now
        self.embed_tokens = target.model.get_input_embeddings()
        self._param = next(head.parameters())
        config = head.config
        self._kv = KVBuffers(1, config.num_key_value_heads, config.head_dim, self._param, initial_capacity)  # one layer
        self._committed = 0  # head entries over committed pairs (entries 0.._committed-1)
        self._speculative = 0  # this round's entries, after the committed ones
        self._tokens: list[int] = []  # committed tokens, pending root last
        self._nodes: dict[tuple[int, ...], tuple[int, torch.Tensor]] = {}  # prefix -> (spec entry, out (H,))
        self._ancestors: dict[tuple[int, ...], list[int]] = {}  # prefix -> its spec entries, root path, itself last
        self._root_out: torch.Tensor | None = None  # output of the last committed entry (depth-1 query)

    # ----- state ------------------------------------------------------------------------------
    def reset(self, prompt_ids: Sequence[int]) -> None:
        self._tokens = [int(t) for t in prompt_ids]
        self._committed = self._speculative = 0
        self._nodes, self._ancestors = {}, {}

    def _embed(self, tokens: Sequence[int]) -> torch.Tensor:
        ids = torch.tensor([list(tokens)], device=self.embed_tokens.weight.device)
        return self.embed_tokens(ids).to(device=self._param.device, dtype=self._param.dtype)

    def _rows(self, out: torch.Tensor) -> list[np.ndarray]:
        """out (n, H) -> n processed q rows over V (exact zeros outside the draft vocabulary)."""
        return list(logits_to_probs(self.head.target_logits(out), self.params))

    # ----- one round --------------------------------------------------------------------------
    @torch.no_grad()
    def begin_round(self) -> DraftFn:
        """Consume the committed entries not seen yet (one head step) and return the round's q."""
        self._speculative = 0
        self._nodes, self._ancestors = {}, {}
        round_fn = _RoundFn(self._score)
        last = len(self._tokens) - 2  # entry t: feature of x_t with token x_{t+1} (the pending root)
        if last < 0:  # one-token prompt: no target feature yet
            logits = torch.full((1, self.vocab_size), float("-inf"))
            logits[0, self.head.draft_to_target.cpu()] = 0.0
            round_fn.rows[()] = logits_to_probs(logits, self.params)[0]
            return round_fn
        start = self._committed
        if start <= last:
            features = self.target.committed_features(start, last + 1)
            hidden = self.head.project(features.to(device=self._param.device, dtype=self._param.dtype))[None]
            embeds = self._embed(self._tokens[start + 1 : last + 2])
            positions = torch.arange(start, last + 1, device=self._param.device)[None]
            self._kv.reserve(last + 1, used=start)
            keys, values = self._kv.keys[0], self._kv.values[0]
            result = self.step(hidden, embeds, positions, keys[:, :, :start], values[:, :, :start], None)
            keys[:, :, start : last + 1] = result.keys
            values[:, :, start : last + 1] = result.values
            self._committed = last + 1
            self._root_out = result.out[0, -1]
            self.calls += 1
        # (start > last cannot happen after a round: every commit adds >= 1 committed entry)
        self._nodes[()] = (-1, self._root_out)
        self._ancestors[()] = []
        round_fn.rows[()] = self._rows(self._root_out[None])[0]
        return round_fn

    @torch.no_grad()
    def _score(self, prefixes: Sequence[tuple[int, ...]]) -> list[np.ndarray]:
        """q rows of ``prefixes`` (their missing ancestors are scored first), one head call per depth."""
        missing = {}
        for prefix in prefixes:
            for depth in range(1, len(prefix) + 1):
                if prefix[:depth] not in self._nodes:
                    missing[prefix[:depth]] = None
        by_depth: dict[int, list[tuple[int, ...]]] = {}
        for prefix in missing:
            by_depth.setdefault(len(prefix), []).append(prefix)
        for depth in sorted(by_depth):
            self._score_level(by_depth[depth])
        return self._rows(torch.stack([self._nodes[tuple(p)][1] for p in prefixes]))

    @torch.no_grad()
    def _score_level(self, prefixes: list[tuple[int, ...]]) -> None:
        """One head call: a speculative entry per prefix (all of one depth d >= 1), at position t + d."""
        if self._committed == 0:
            raise ConfigError("a one-token prompt gives the draft head no target features to draft deeper; use a longer prompt")
        count = len(prefixes)
        first = self._committed + self._speculative
        self._kv.reserve(first + count, used=first)
        keys, values = self._kv.keys[0], self._kv.values[0]
        hidden = torch.stack([self._nodes[p[:-1]][1] for p in prefixes])[None]
        embeds = self._embed([p[-1] for p in prefixes])
        depth = len(prefixes[0])
        positions = torch.full((1, count), self._committed - 1 + depth, device=self._param.device)
        allowed = torch.zeros(count, first + count, dtype=torch.bool, device=self._param.device)
        allowed[:, : self._committed] = True
        for row, prefix in enumerate(prefixes):
            entries = self._ancestors[prefix[:-1]] + [self._speculative + row]
            self._ancestors[prefix] = entries
            allowed[row, [self._committed + e for e in entries]] = True
        result = self.step(hidden, embeds, positions, keys[:, :, :first], values[:, :, :first], allowed[None])
        keys[:, :, first : first + count] = result.keys
        values[:, :, first : first + count] = result.values
        for row, prefix in enumerate(prefixes):
            self._nodes[prefix] = (self._speculative + row, result.out[0, row])
        self._speculative += count
        self.calls += 1

    def commit(self, accepted: Sequence[int], next_token: int) -> None:
        """Drop this round's speculative entries; the accepted tokens' entries are rebuilt next round
        from the target's features of the verification forward."""
        self._tokens += [int(t) for t in accepted] + [int(next_token)]
        self._speculative = 0
        self._nodes, self._ancestors = {}, {}
