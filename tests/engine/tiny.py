"""Tiny random Llama pairs (no download) for engine tests: fp32, small vocabulary, with the output
layer scaled so that the distributions are peaked and target and draft clearly differ; and what the
engine's law and greedy tests share: exact laws of the first tokens, sampled counts to hold them
to, greedy references and the draft shape each rule is tried with."""

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from verispec.core.rows import LogitRows
from verispec.engine.decoder import SpeculativeDecoder
from verispec.models.hf import HFModelAdapter
from verispec.verify.registry import METHODS


def tiny_llama(seed: int, vocab_size: int = 6, layers: int = 2, logit_scale: float = 4.0, max_positions: int = 128):
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    return model


@torch.no_grad()
def exact_first_tokens_law(model, prompt, num_tokens: int, temperature: float = 1.0) -> dict:
    """Law of the first ``num_tokens`` tokens of plain sampling, by full forwards over every prefix."""
    law = {(): 1.0}
    for _ in range(num_tokens):
        nxt = {}
        for seq, prob in law.items():
            logits = model(torch.tensor([list(prompt) + list(seq)])).logits[0, -1].double()
            probs = torch.softmax(logits / temperature, dim=-1)
            for token, token_prob in enumerate(probs.tolist()):
                nxt[seq + (token,)] = prob * token_prob
        law = nxt
    return law


def first_tokens_counts(decoder, prompt, num_tokens: int, samples: int) -> dict:
    """How often each tuple of the first ``num_tokens`` generated tokens occurs over seeds 0 .. samples - 1."""
    counts: dict = {}
    for seed in range(samples):
        decoder.seed = seed
        key = tuple(decoder.generate(prompt).token_ids[:num_tokens])
        counts[key] = counts.get(key, 0) + 1
    return counts


def sample_first_tokens(target, draft, prompt, num_tokens: int, samples: int, **decoder_args) -> dict:
    """``first_tokens_counts`` of a decoder of target and draft (no EOS: every sample has ``num_tokens``)."""
    decoder = SpeculativeDecoder(target, draft, max_new_tokens=num_tokens, eos_token_id=[], **decoder_args)
    return first_tokens_counts(decoder, prompt, num_tokens, samples)


def plain_greedy_outputs(model, prompts, new_tokens: int) -> list[list[int]]:
    """The target's own greedy tokens for each prompt (method "ar"): what every lossless rule must return."""
    plain = SpeculativeDecoder(model, None, method="ar", temperature=0, max_new_tokens=new_tokens, eos_token_id=[])
    return [plain.generate(ids).token_ids for ids in prompts]


def greedy_draft_shape(method: str) -> dict:
    """Decoder shape arguments that give ``method`` the kind of draft it verifies, with room to branch."""
    spec = METHODS[method]
    if spec.tree_scheme is not None and spec.tree_scheme.value == "deterministic":  # q-free: a token tree
        return dict(tree=[2, 2, 1])
    if spec.draft == "chain":
        return dict(num_drafts=1, draft_len=4)
    if spec.draft == "tree":
        return dict(num_drafts=2, draft_len=3)
    return dict(num_drafts=3, draft_len=3)


class ForwardMemo:
    """Next-token logits of ``model`` after a whole token sequence, by one full (cache-free)
    forward per distinct sequence, memoised: the replay enumerator re-runs the decoder once per
    leaf of its choice tree, so each prefix is scored once instead of once per leaf."""

    def __init__(self, model):
        self.model = model
        self.rows: dict[tuple[int, ...], torch.Tensor] = {}

    @torch.no_grad()
    def __call__(self, sequence) -> torch.Tensor:
        sequence = tuple(int(t) for t in sequence)
        row = self.rows.get(sequence)
        if row is None:
            row = self.model(torch.tensor([sequence])).logits[0, -1].float()
            self.rows[sequence] = row
        return row


class _NoCacheRunner:
    """Stands in for the adapter's KV-cached runner: ``ExactForwardAdapter`` computes its rows itself."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def reset(self):
        pass

    def forward(self, input_ids, positions, allowed, keep):
        return torch.zeros(keep, self.vocab_size)

    def keep_entries(self, length, moved=()):
        pass


class ExactForwardAdapter(HFModelAdapter):
    """``HFModelAdapter`` whose node rows come from memoised full forwards of each node's whole
    sequence (committed tokens + root path) instead of the KV cache. Everything else — node
    numbering, validation, commit / rollback bookkeeping — is the real adapter's, so the decoder
    runs unchanged. ``test_exact_forward_adapter_matches_the_kv_cached_one`` pins it to the real
    adapter's rows."""

    def __init__(self, model, memo: ForwardMemo | None = None):
        super().__init__(model, backend="transformers")
        self.memo = memo or ForwardMemo(model)
        self.runner = _NoCacheRunner(self.vocab_size)

    def extend(self, tokens, parents):
        first = self.num_nodes
        super().extend(tokens, parents)
        committed = tuple(self._tokens[:-1])
        rows = [
            self.memo(committed + tuple(self._node_tokens[a] for a in self._node_ancestors[node]))
            for node in range(first, self.num_nodes)
        ]
        return torch.stack(rows) if rows else torch.empty(0, self.vocab_size)


def exact_target_law(memo: ForwardMemo, prompt, num_tokens: int, params) -> dict:
    """Exact law of the first ``num_tokens`` tokens of plain sampling from the memoised model under
    the sampling parameters ``params`` (verispec.core.sampling), by scoring every prefix.

    Rows are built with the engine's own row arithmetic (``core.rows.LogitRows``: float32 sum over
    V, float64 entries). Those rows sum to 1 only within δ ~ 1e-8 and the rules renormalise some
    of them (residuals, modified rows), so an exact engine still differs from this law by ~N δ
    (observed 5e-9 .. 2e-8 for N = 3-4); test_engine_exact_law.tolerance bounds it from δ."""
    law = {(): 1.0}
    for _ in range(num_tokens):
        nxt = {}
        for seq, prob in law.items():
            probs = LogitRows(memo(tuple(prompt) + seq)[None], params).dense()[0]
            for token in np.flatnonzero(probs > 0):
                nxt[seq + (int(token),)] = prob * float(probs[token])
        law = nxt
    return law
