"""Verifier features for SPRINTER (ALGORITHMS.md §11 "Components", "Feature subtlety").

A feature extractor turns what the draft knows at one position into a fixed-length vector for
each candidate token x. Which features are available depends on the draft:

* ``NGramTokenFeatures`` (the n-gram draft has no hidden state): token features only,
  [q(x), log q(x), max q, entropy of q, x is argmax q, n-gram match order of x / max_n,
  longest match order of the context / max_n] followed by the TARGET's input-embedding row of x
  (a table lookup, no target forward; 576 values for SmolLM2).
* ``DraftHiddenFeatures`` (a neural draft): the draft's last hidden state at the position that
  produced x (the paper's feature, "last embedding of the previous token"), the same five
  q-based token features, and the draft's input-embedding row of x.

Both include x itself, as §11 requires for Thm 3.1's form: a verifier that sees only the context
accepts with a probability s(c) that does not depend on x, and the token law is then
(1 - s(c)) p + s(c) q instead of (1 - beta) p + beta q.

Every extractor records its ``spec()`` (feature set, dimension, the pair's identifiers, the
hidden size) in the verifier file, so a verifier for another pair is refused with a message
naming both pairs (``check_compatible``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

from verispec.errors import ConfigError

PROB_FLOOR = 1e-12
NGRAM_FEATURE_SET = "ngram_token"
HIDDEN_FEATURE_SET = "draft_hidden_token"
Q_FEATURE_NAMES = ("q_x", "log_q_x", "max_q", "entropy_q", "is_argmax_q")


@dataclass
class DraftState:
    """What the draft knows at the position where it draws x.

    context:     (n,) int64 token ids before x (prompt + generated + drafted prefix)
    draft_probs: (V,) float64 processed q(.|context), the law x is drawn from
    hidden:      (H_d,) float32 draft's last hidden state at the position that produces x, or
                 None for a draft without one (n-gram)
    """

    context: np.ndarray
    draft_probs: np.ndarray
    hidden: np.ndarray | None = None


def hf_model(model):
    """The transformers model behind an ``HFModelAdapter`` (or the model itself)."""
    from verispec.models.hf import HFModelAdapter

    return model.model if isinstance(model, HFModelAdapter) else model


def model_identifier(model) -> str:
    """A short, stable name of a model (for verifier file names and pair checks).

    The default target is known by its cache directory name; other models by the last part of
    ``config.name_or_path``, or by their shape when they have no path (e.g. random test models).
    """
    if model is None or isinstance(model, str):
        return "ngram" if model in (None, "ngram", "default") else str(model)
    inner = hf_model(model)
    config = getattr(inner, "config", None)
    path = str(getattr(config, "name_or_path", "") or getattr(config, "_name_or_path", "") or "")
    if path:
        return path.rstrip("/").split("/")[-1]
    return (
        f"{getattr(config, 'model_type', 'model')}-h{getattr(config, 'hidden_size', 0)}"
        f"-l{getattr(config, 'num_hidden_layers', 0)}-v{getattr(config, 'vocab_size', 0)}"
    )


def q_token_features(draft_probs: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """[q(x), log q(x), max q, entropy of q, x is argmax q] per token, shape (len(tokens), 5)."""
    q = np.asarray(draft_probs, dtype=np.float64)
    positive = q[q > 0]
    entropy = float(-(positive * np.log(positive)).sum())
    q_max = float(q.max())
    argmax = int(np.argmax(q))  # lowest id on ties
    q_x = q[tokens]
    return np.stack(
        [q_x, np.log(np.maximum(q_x, PROB_FLOOR)), np.full(len(tokens), q_max), np.full(len(tokens), entropy), (tokens == argmax).astype(np.float64)],
        axis=1,
    )


def ngram_match_orders(context: np.ndarray, max_n: int) -> tuple[dict[int, int], int]:
    """For the n-gram draft (models/ngram.py): the largest n <= max_n such that token x followed
    an earlier occurrence of the context's last n tokens, per such token, and the longest n with
    any match. Tokens that only get unigram mass have order 0."""
    context = np.asarray(context, dtype=np.int64)
    length = len(context)
    orders: dict[int, int] = {}
    longest = 0
    for n in range(1, min(max_n, length - 1) + 1):
        windows = sliding_window_view(context[:-1], n)
        matches = np.flatnonzero((windows == context[length - n :]).all(axis=1))
        if len(matches):
            longest = n
            for token in np.unique(context[matches + n]):
                orders[int(token)] = n
    return orders, longest


class FeatureExtractor:
    """Base: ``features(state, tokens) -> (len(tokens), dim) float32``; ``spec()`` for the file."""

    name: str = ""
    dim: int = 0
    target_name: str = ""
    draft_name: str = ""
    hidden_size: int = 0
    feature_names: tuple[str, ...] = ()

    def features(self, state: DraftState, tokens: Sequence[int] | np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def spec(self) -> dict:
        return {
            "feature_set": self.name,
            "dim": int(self.dim),
            "target": self.target_name,
            "draft": self.draft_name,
            "hidden_size": int(self.hidden_size),
            "scalar_features": list(self.feature_names),
        }


def _embedding_table(model) -> np.ndarray:
    inner = hf_model(model)
    weight = inner.get_input_embeddings().weight
    return weight.detach().float().cpu().numpy()


class NGramTokenFeatures(FeatureExtractor):
    """Token features for the n-gram draft: 7 scalars + the target's input embedding of x."""

    name = NGRAM_FEATURE_SET
    feature_names = Q_FEATURE_NAMES + ("match_order_x", "context_match_order")

    def __init__(self, target, max_n: int = 3, target_name: str | None = None):
        self.embeddings = _embedding_table(target)
        self.max_n = int(max_n)
        self.hidden_size = int(self.embeddings.shape[1])
        self.dim = len(self.feature_names) + self.hidden_size
        self.target_name = target_name or model_identifier(target)
        self.draft_name = "ngram"

    def features(self, state, tokens):
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        orders, longest = ngram_match_orders(state.context, self.max_n)
        order_x = np.array([orders.get(int(t), 0) for t in tokens], dtype=np.float64) / self.max_n
        scalars = np.concatenate(
            [q_token_features(state.draft_probs, tokens), order_x[:, None], np.full((len(tokens), 1), longest / self.max_n)], axis=1
        )
        return np.concatenate([scalars.astype(np.float32), self.embeddings[tokens]], axis=1)


class DraftHiddenFeatures(FeatureExtractor):
    """Neural draft: its last hidden state (H_d), 5 q-based scalars, its input embedding of x."""

    name = HIDDEN_FEATURE_SET
    feature_names = Q_FEATURE_NAMES

    def __init__(self, draft, target_name: str, draft_name: str | None = None):
        self.embeddings = _embedding_table(draft)
        inner = hf_model(draft)
        self.hidden_size = int(inner.config.hidden_size)
        self.dim = self.hidden_size + len(self.feature_names) + int(self.embeddings.shape[1])
        self.target_name = target_name
        self.draft_name = draft_name or model_identifier(draft)

    def features(self, state, tokens):
        if state.hidden is None:
            raise ConfigError("the draft_hidden_token features need the draft's hidden state; use a HiddenStateModelDrafter")
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        hidden = np.broadcast_to(np.asarray(state.hidden, dtype=np.float32), (len(tokens), self.hidden_size))
        scalars = q_token_features(state.draft_probs, tokens).astype(np.float32)
        return np.concatenate([hidden, scalars, self.embeddings[tokens]], axis=1)


def make_extractor(target, draft, target_name: str | None = None, draft_name: str | None = None) -> FeatureExtractor:
    """The extractor for a pair: n-gram token features for the n-gram draft, hidden-state +
    token features for a neural draft (a transformers model or an ``HFModelAdapter``)."""
    target_name = target_name or model_identifier(target)
    if draft is None or isinstance(draft, str):
        if draft not in (None, "ngram", "default"):
            raise ConfigError(f"unknown draft {draft!r}: give 'ngram' or a draft model")
        return NGramTokenFeatures(target, target_name=target_name)
    from verispec.engine.drafters import ModelDrafter

    drafter_model = draft.adapter if isinstance(draft, ModelDrafter) else draft
    return DraftHiddenFeatures(drafter_model, target_name, draft_name)


def check_compatible(meta: dict, extractor: FeatureExtractor, source: str = "verifier file") -> None:
    """Refuse a verifier trained for another pair or feature set (clear message naming both)."""
    spec = extractor.spec()
    trained = f"target {meta.get('target')!r} / draft {meta.get('draft')!r} (features {meta.get('feature_set')}, hidden size {meta.get('hidden_size')}, dim {meta.get('dim')})"
    here = f"target {spec['target']!r} / draft {spec['draft']!r} (features {spec['feature_set']}, hidden size {spec['hidden_size']}, dim {spec['dim']})"
    if (
        meta.get("feature_set") != spec["feature_set"]
        or int(meta.get("hidden_size", -1)) != spec["hidden_size"]
        or int(meta.get("dim", -1)) != spec["dim"]
    ):
        raise ConfigError(
            f"{source} was trained for {trained}, but this pair is {here}; a SPRINTER verifier only "
            "works for the pair it was trained on: run `verispec sprinter collect` and `train` for this pair"
        )
    if meta.get("target") != spec["target"] or meta.get("draft") != spec["draft"]:
        import warnings

        warnings.warn(f"{source} was trained for {trained} and is used with {here}: the shapes match, the names do not", stacklevel=2)


class HiddenStateTap:
    """Captures the input of a model's output layer (its last hidden states, one row per logits
    row) on every forward, via a forward pre-hook: no change to the model or the adapter."""

    def __init__(self, model):
        inner = hf_model(model)
        head = inner.get_output_embeddings()
        if head is None:
            raise ConfigError(f"{type(inner).__name__} has no output embedding layer to read hidden states from")
        self.last: torch.Tensor | None = None
        self._handle = head.register_forward_pre_hook(self._hook)

    def _hook(self, module, inputs):
        self.last = inputs[0].detach()

    def rows(self, count: int) -> np.ndarray:
        """The last ``count`` hidden-state rows of the latest forward, (count, H) float32."""
        if self.last is None:
            raise ConfigError("no forward has run yet: nothing to read hidden states from")
        return self.last[0, -count:].float().cpu().numpy()

    def close(self) -> None:
        self._handle.remove()
