"""KV-cached adapter over a Hugging Face causal LM: prefill, tree scoring, commit, rollback (DESIGN.md §4).

The adapter keeps three regions of one transformers ``DynamicCache`` (batch size 1):

    [ committed cache | pending tail | speculative tree ]

* committed cache: keys/values of committed tokens; never recomputed.
* pending tail: committed tokens whose keys/values are not computed yet. Its last token is the
  *pending root*, the context of the next draft tree (node 0). Tokens committed without a forward
  (``append_committed``, a ``commit`` of a round that was never scored) wait here and ride along
  with the next ``extend`` forward, so they cost no forward of their own.
* speculative tree: the root and the draft nodes given to ``extend`` since the last commit, in
  order of addition; node ``n`` sits at cache index ``committed_len + n``.

Tree attention: every node attends to all committed tokens, to its ancestors and to itself, at
position ``committed_len + depth``. So the logits of a node equal those of a plain forward over
``committed tokens + root-to-node path``.

The model forward itself is delegated to a *runner* (``backend``):

* ``"native"`` (``models.native_llama.NativeLlamaRunner``): a direct forward of Llama-architecture
  models over a preallocated cache; same weights and function, less per-call overhead.
* ``"transformers"`` (``TransformersRunner``): the model's own ``forward`` with a
  ``DynamicCache``; the tree mask goes in as a 4D additive mask, which transformers uses as is for
  ``attn_implementation`` "eager" and "sdpa"; flash-attention implementations would silently
  ignore it, so this runner refuses them.
  Sliding-window layers (Gemma 3, Mistral, ...) keep every entry here (transformers' own sliding
  cache drops entries older than the window, which a rollback cannot restore) and get their own
  mask: the tree mask further limited to keys whose *position* is within ``window`` of the query's
  (``query position - key position < window``, transformers' convention). A tree node thus sees
  exactly the last ``window`` positions of its own root path, at any context length.
* ``"auto"`` (default): native when the model qualifies, else transformers.

Features (EAGLE-3 draft heads, ``engine.head_drafter``): after ``enable_features(layer_ids)`` both
runners also return, from the same forward, the hidden states at HF ``hidden_states`` indices
``layer_ids`` of every input, and the adapter keeps one feature row per cache entry, appended,
truncated and moved with the KV entries (``committed_features``, ``node_features``). Off by default.
"""

from __future__ import annotations

from collections.abc import Sequence

import inspect
import sys

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer, get_layer_types_and_kwargs

from verispec.errors import ConfigError
from verispec.models import check_backend
from verispec.models.tree_round import ROOT, RoundState, check_commit_path, check_prompt, place_nodes

TREE_MASK_ATTENTION = ("eager", "sdpa")


def tree_attention_mask(
    cached_len: int,
    tail_len: int,
    ancestors: Sequence[Sequence[int]],
    num_nodes: int,
) -> torch.Tensor:
    """Which entries each input of one forward over [pending tail (minus root), new tree nodes] sees.

    cached_len: entries already in the cache; tail_len: tail tokens fed before the nodes (causal);
    ancestors[i]: node numbers on the root path of the i-th new node, itself included;
    num_nodes: tree nodes in the cache after this forward (node n is column base + n, where
    base = cached_len + tail_len).
    Returns bool (tail_len + len(ancestors), base + num_nodes), True where attention is allowed.
    """
    base = cached_len + tail_len
    allowed = torch.zeros(tail_len + len(ancestors), base + num_nodes, dtype=torch.bool)
    allowed[:, :cached_len] = True
    allowed[:tail_len, cached_len:base] = torch.ones(tail_len, tail_len, dtype=torch.bool).tril()
    allowed[tail_len:, cached_len:base] = True
    rows = [tail_len + i for i, path in enumerate(ancestors) for _ in path]
    cols = [base + node for path in ancestors for node in path]
    allowed[rows, cols] = True
    return allowed


class TransformersRunner:
    """The model's own ``forward`` over a transformers ``DynamicCache`` (batch size 1).

    Layers with a sliding window keep all their entries in a plain ``DynamicLayer``, and the
    runner tracks the position of every cache entry so that it can build their masks by position
    (tree nodes sit at ``committed_len + depth``, not at their cache index).
    """

    def __init__(self, model):
        attn = getattr(model.config, "_attn_implementation", None)
        if attn not in TREE_MASK_ATTENTION:
            raise ConfigError(
                f"attn_implementation={attn!r} ignores custom tree attention masks; load the model "
                f"with attn_implementation='sdpa' (or 'eager')"
            )
        self.model = model
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.layer_windows = self._layer_windows()
        self.positions = torch.empty(0, dtype=torch.long)  # position of each cache entry
        self.cache = self._new_cache()
        # opt-in feature capture (EAGLE-3 heads), as NativeLlamaRunner
        self.feature_layers: tuple[int, ...] | None = None
        self.last_features: torch.Tensor | None = None

    def _layer_windows(self) -> dict[str, int | None]:
        """The model's attention layer types and their windows (None = full attention).

        Raises ConfigError for cache layers a tree rollback cannot handle (recurrent, chunked,
        quantized ...), and for a model mixing layer types whose forward takes no per-type masks.
        """
        cache = DynamicCache(config=self.model.config)
        layer_types, _ = get_layer_types_and_kwargs(self.model.config.get_text_config(decoder=True))
        windows: dict[str, int | None] = {}
        for layer_type, layer in zip(layer_types, cache.layers):
            if type(layer) is DynamicLayer:
                window = None
            elif type(layer) is DynamicSlidingWindowLayer:
                window = int(layer.sliding_window)
            else:
                raise ConfigError(
                    f"{type(self.model).__name__} needs {type(layer).__name__} cache layers, which tree "
                    "rollback does not support; use a model with full or sliding-window attention layers"
                )
            if windows.setdefault(layer_type, window) != window:
                raise ConfigError(f"layers of type {layer_type!r} have different sliding windows; not supported")
        if len(set(windows.values())) > 1 and not self._takes_mask_per_layer_type():
            raise ConfigError(
                f"{type(self.model).__name__} mixes layer types {sorted(windows)} but its forward does not "
                "take one attention mask per layer type; use backend='transformers' only with models that do"
            )
        return windows

    def _takes_mask_per_layer_type(self) -> bool:
        """Whether the model's forward accepts a {layer type: mask} dict (transformers 5.x convention)."""
        module = sys.modules.get(type(self.model.base_model).__module__)
        return module is not None and "causal_mask_mapping := attention_mask" in inspect.getsource(module)

    @property
    def has_sliding_layers(self) -> bool:
        return any(window is not None for window in self.layer_windows.values())

    def _new_cache(self) -> DynamicCache:
        # Plain layers everywhere: rollback selects entries by index on the sequence axis, and
        # sliding layers are limited by their masks instead of by dropping old entries.
        return DynamicCache()

    def reset(self) -> None:
        self.cache = self._new_cache()
        self.positions = torch.empty(0, dtype=torch.long)

    def seq_length(self) -> int:
        return self.cache.get_seq_length()

    def _additive(self, allowed: torch.Tensor) -> torch.Tensor:
        # The dtype's minimum, not -inf: fused fp16 kernels can turn -inf into NaN.
        additive = torch.zeros(allowed.shape, dtype=self.dtype)
        return additive.masked_fill_(~allowed, torch.finfo(self.dtype).min)[None, None].to(self.device)

    def _masks(self, positions: torch.Tensor, allowed: torch.Tensor | None):
        """The ``attention_mask`` argument: None, one 4D additive mask, or one per layer type.

        positions: (n,) positions of the new inputs; allowed: bool (n, cache length + n) or None
        (causal). Sliding layers additionally need ``query position - key position < window``.
        """
        key_positions = torch.cat([self.positions, positions])
        span = int(positions.max() - key_positions.min())
        sliding = [w for w in self.layer_windows.values() if w is not None and span >= w]
        if not sliding:  # every window covers all keys: one mask serves every layer
            return None if allowed is None else self._additive(allowed)
        if allowed is None:
            cached = len(self.positions)
            allowed = torch.ones(len(positions), cached + len(positions), dtype=torch.bool).tril(cached)
        distance = positions[:, None] - key_positions[None, :]
        masks = {
            layer_type: self._additive(allowed if window is None else allowed & (distance < window))
            for layer_type, window in self.layer_windows.items()
        }
        if len(set(self.layer_windows.values())) == 1:
            return next(iter(masks.values()))
        return masks

    @torch.no_grad()
    def forward(self, input_ids: list[int], positions: list[int], allowed: torch.Tensor | None, keep: int):
        """Append len(input_ids) cache entries; float32 CPU logits of the last ``keep`` inputs, (keep, V).

        allowed: bool (n, cache length + n) attention pattern, or None for plain causal attention.
        With ``feature_layers`` set, ``last_features`` becomes the (n, len(feature_layers) * hidden)
        HF ``hidden_states`` of every input at those indices, from the same forward.
        """
        new_positions = torch.tensor(positions, dtype=torch.long)
        mask = self._masks(new_positions, allowed)
        capture = self.feature_layers
        out = self.model(
            input_ids=torch.tensor([input_ids], device=self.device),
            position_ids=new_positions[None].to(self.device),
            attention_mask=mask,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=keep,
            output_hidden_states=capture is not None,
        )
        if capture is not None:
            self.last_features = torch.cat([out.hidden_states[i][0] for i in capture], dim=-1)
        self.positions = torch.cat([self.positions, new_positions])
        return out.logits[0, -keep:].float().cpu()

    @torch.no_grad()
    def keep_entries(self, length: int, moved: Sequence[int] = ()) -> None:
        """Keep cache entries [0, length) followed by the entries at indices ``moved``.

        The moved entries are copied down in place, so a commit costs O(path), not O(context).
        """
        index = torch.tensor(moved, dtype=torch.long, device=self.device)
        end = length + len(moved)
        for layer in self.cache.layers:
            if not layer.is_initialized:
                continue
            if len(moved):
                # index_select copies first, so overlapping source and destination are safe.
                layer.keys[..., length:end, :] = layer.keys.index_select(-2, index)
                layer.values[..., length:end, :] = layer.values.index_select(-2, index)
            layer.keys, layer.values = layer.keys[..., :end, :], layer.values[..., :end, :]
        self.positions = torch.cat([self.positions[:length], self.positions[index.cpu()]])


def make_runner(model, backend: str = "auto"):
    """The runner for ``backend`` ("auto", "native" or "transformers"; see the module docstring)."""
    from verispec.models.native_llama import NativeLlamaRunner, supports

    if check_backend(backend) == "llamacpp":
        raise ConfigError(
            "backend 'llamacpp' runs GGUF files through llama.cpp, not a transformers model; give the target as a "
            ".gguf path (or 'default' / 'gemma3-270m'), or use backend 'auto'"
        )
    if backend == "transformers":
        return TransformersRunner(model)
    reason = supports(model)
    if reason is None:
        return NativeLlamaRunner(model)
    if backend == "native":
        raise ConfigError(f"backend='native' cannot run this model: {reason}; use backend='transformers' or 'auto'")
    return TransformersRunner(model)


class HFModelAdapter(RoundState):
    """A transformers ``AutoModelForCausalLM`` behind reset / extend / commit, batch size 1.

    Node numbering within a round (between two commits): node 0 is the pending root, the nodes
    given to ``extend`` are numbered 1, 2, ... in order of addition, across calls. The first
    ``extend`` of a round must start with the root (token = pending root or -1, parent = -1).
    """

    def __init__(self, model, device: str | torch.device | None = None, backend: str = "auto", runner=None):
        """runner: the forward to use instead of ``make_runner(model, backend)`` (the batched
        engine gives each sequence a slot of one shared ``models.batch_runner.BatchedLlamaRunner``)."""
        if device is not None:
            model = model.to(device)
        model.eval()
        self.model = model
        self.runner = make_runner(model, backend) if runner is None else runner
        self.backend = "native" if not isinstance(self.runner, TransformersRunner) else "transformers"
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        out = model.get_output_embeddings()
        self.vocab_size: int = int(out.weight.shape[0]) if out is not None else int(model.config.vocab_size)
        self.max_context: int = int(model.config.max_position_embeddings)
        self._cached_len = 0  # entries of the committed cache actually holding keys/values
        self._tokens: list[int] = []  # committed tokens, pending root last
        self._node_tokens: list[int] = []  # speculative tree, node 0 = root once extended
        self._node_depths: list[int] = []
        self._node_parents: list[int] = []
        self._node_ancestors: list[list[int]] = []  # root path of each node, itself included
        # feature capture (``enable_features``): one row per cache entry, kept in step with the KV
        # cache through ``_forward`` / ``_keep`` (same appends, truncations and moves)
        self.feature_layers: tuple[int, ...] | None = None
        self._features: torch.Tensor | None = None  # (capacity, F), rows [0, _feature_len) valid
        self._feature_len = 0

    # ----------------------------------------------------------------- state

    def _check_position(self, position: int) -> None:
        if position >= self.max_context:
            raise ConfigError(
                f"position {position} exceeds the model's context of {self.max_context} tokens; "
                "use a shorter prompt or fewer max_new_tokens / a shallower draft"
            )

    # -------------------------------------------------------------- features

    def enable_features(self, layer_ids: Sequence[int]) -> None:
        """From now on every forward also keeps, for every cache entry, the target's hidden states at
        HF ``hidden_states`` indices ``layer_ids`` (the inputs of those decoder layers, concatenated:
        EAGLE-3 head features, ``models.eagle_head``), taken from the same forward. They are moved
        and truncated exactly like the KV entries. Takes effect from the next ``reset``."""
        ids = tuple(int(i) for i in layer_ids)
        layers = int(self.model.config.get_text_config(decoder=True).num_hidden_layers)
        bad = [i for i in ids if not 0 <= i < layers]
        if not ids or bad:
            raise ConfigError(
                f"feature layer ids {list(ids)} must be HF hidden_states indices of layer inputs in [0, {layers - 1}] "
                f"for this {layers}-layer target; the head was built for another target"
            )
        if not hasattr(self.runner, "feature_layers"):
            raise ConfigError(f"the {type(self.runner).__name__} runner cannot return hidden states; use backend 'native' or 'transformers'")
        self.runner.feature_layers = ids
        self.feature_layers = ids
        self._features, self._feature_len = None, 0

    def disable_features(self) -> None:
        """Stop capturing features (the forwards cost what they cost without a head again)."""
        if hasattr(self.runner, "feature_layers"):
            self.runner.feature_layers = None
        self.feature_layers = None
        self._features, self._feature_len = None, 0

    @property
    def feature_size(self) -> int:
        """Width F of one feature row (0 when features are off)."""
        if self.feature_layers is None:
            return 0
        return len(self.feature_layers) * int(self.model.config.get_text_config(decoder=True).hidden_size)

    def committed_features(self, start: int, end: int) -> torch.Tensor:
        """Features (end - start, F) of committed positions [start, end), model dtype and device (a view,
        valid until the next forward or commit). Every position before the pending root has one once
        the root's tree was scored and committed; tokens still in the pending tail have none yet."""
        if self.feature_layers is None:
            raise ConfigError("features are off: call enable_features(layer_ids) before reset")
        if not 0 <= start <= end <= self._cached_len or self._feature_len < end:
            raise ConfigError(
                f"features of positions [{start}, {end}) are not computed (the target cache holds {self._cached_len} "
                "committed entries); score the round before asking for its features"
            )
        return self._features[start:end]

    def node_features(self) -> torch.Tensor:
        """Features (num_nodes, F) of this round's tree nodes (row n = node n), from their scoring forward."""
        if self.feature_layers is None:
            raise ConfigError("features are off: call enable_features(layer_ids) before reset")
        return self._features[self._cached_len : self._cached_len + self.num_nodes]

    def _forward(self, input_ids: list[int], positions: list[int], allowed, keep: int) -> torch.Tensor:
        """runner.forward plus the features of its inputs, appended like its KV entries."""
        logits = self.runner.forward(input_ids, positions, allowed, keep)
        if self.feature_layers is not None:
            rows = self.runner.last_features
            end = self._feature_len + rows.shape[0]
            if self._features is None or self._features.shape[0] < end:
                capacity = max(256, 2 * end)
                grown = rows.new_zeros(capacity, rows.shape[1])
                if self._features is not None:
                    grown[: self._feature_len] = self._features[: self._feature_len]
                self._features = grown
            self._features[self._feature_len : end] = rows
            self._feature_len = end
        return logits

    def _keep(self, length: int, moved: Sequence[int] = ()) -> None:
        """runner.keep_entries, applied to the feature rows too."""
        self.runner.keep_entries(length, moved)
        if self.feature_layers is not None and self._features is not None:
            if len(moved):
                index = torch.tensor(list(moved), dtype=torch.long, device=self._features.device)
                # index_select copies first, so overlapping source and destination are safe.
                self._features[length : length + len(moved)] = self._features.index_select(0, index)
            self._feature_len = length + len(moved)

    # ------------------------------------------------------------------- API

    def reset(self, prompt_ids: Sequence[int]) -> None:
        """Start a sequence: prefill prompt_ids[:-1] in one forward; prompt_ids[-1] becomes the pending root."""
        prompt = check_prompt(prompt_ids, self.max_context)
        self.runner.reset()
        self._feature_len = 0
        self._cached_len = 0
        self._tokens = prompt
        self._clear_tree()
        if len(prompt) > 1:
            # Pure causal prefill: transformers builds the mask (sdpa can then use its causal kernels).
            self._forward(prompt[:-1], list(range(len(prompt) - 1)), None, keep=1)
            self._cached_len = len(prompt) - 1

    def extend(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """Append tree nodes and return their next-token logits, shape (len(tokens), V), float32, CPU.

        parents[i] is the node number of token i's parent: 0 = root, or any earlier node (of this
        call or an earlier one this round). The first call of a round must begin with the root:
        tokens[0] = pending root (or -1), parents[0] = -1; its row holds p(.|committed context).
        One forward; committed tokens are never recomputed.
        """
        if len(tokens) == len(parents) == 0:
            return torch.empty(0, self.vocab_size)
        first = self.num_nodes
        tokens, parents, depths, ancestors = place_nodes(
            tokens, parents, first, self._tokens[-1], lambda node: (self._node_depths[node], self._node_ancestors[node])
        )
        self._check_position(self.committed_len + max(depths))

        # Committed tokens still pending (minus the root, which is node 0) ride along, causally.
        tail = self._tokens[self._cached_len : -1] if first == ROOT else []
        positions = list(range(self._cached_len, self.committed_len))
        positions += [self.committed_len + depth for depth in depths]
        if not tail and len(tokens) == 1 and first == ROOT:
            allowed = None  # the root alone sees the whole cache: no mask to build (~40 us) and drop
        else:
            allowed = tree_attention_mask(self._cached_len, len(tail), ancestors, first + len(tokens))
            if allowed.all():  # one input that sees the whole cache (a chain step): no mask needed
                allowed = None
        logits = self._forward(tail + tokens, positions, allowed, keep=len(tokens))

        self._cached_len += len(tail)
        self._node_tokens += tokens
        self._node_parents += parents
        self._node_depths += depths
        self._node_ancestors += ancestors
        return logits

    def score(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """Score a whole draft tree from the root in one forward (tokens[0] is the root, parents[0] = -1).

        Drops any speculative nodes of this round first, then behaves as ``extend``.
        Returns (len(tokens), V) float32 CPU logits: row i is the next-token logits after node i.
        """
        self.rollback()
        return self.extend(tokens, parents)

    def rollback(self) -> None:
        """Drop this round's speculative tree (root included); the committed state is unchanged."""
        if self.num_nodes:
            self._keep(self._cached_len)
            self._clear_tree()

    def _clear_tree(self) -> None:
        self._node_tokens, self._node_parents, self._node_depths, self._node_ancestors = [], [], [], []

    def commit(self, path: Sequence[int], next_token: int) -> None:
        """Commit the root and the nodes of ``path``, then make ``next_token`` the pending root.

        path: node numbers of a root-to-node path, root excluded (may be empty); every other
        speculative entry is dropped from the cache. If the root was not extended this round the
        path must be empty, and the root waits in the pending tail for the next forward.
        """
        path = check_commit_path(path, self.num_nodes, self._node_parents)
        if not self.num_nodes:
            self._tokens.append(int(next_token))
            return
        root_index = self.committed_len
        self._keep(root_index + 1, [root_index + n for n in path])
        self._tokens += [self._node_tokens[n] for n in path] + [int(next_token)]
        self._cached_len = self.committed_len
        self._clear_tree()

    def append_committed(self, tokens: Sequence[int], next_token: int) -> None:
        """Commit the pending root, then ``tokens`` (never scored), then make ``next_token`` the root.

        Drops this round's draft nodes but keeps the root's cache entry if it was extended. The
        new tokens join the pending tail and are computed by the next forward.
        """
        tokens = [int(t) for t in tokens]
        if self.num_nodes:
            self._keep(self.committed_len + 1)
            self._cached_len = self.committed_len + 1
            self._clear_tree()
        self._tokens += tokens + [int(next_token)]
