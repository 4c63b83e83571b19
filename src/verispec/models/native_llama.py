"""A direct forward of Llama-architecture models with a preallocated KV cache (DESIGN.md §4).

``HFModelAdapter`` calls a *runner* for its one operation on the model: "append these tokens at
these positions under this attention mask, return the logits of the last few". Going through
``LlamaForCausalLM.forward`` costs, per call, a mask-building pass, a ``DynamicCache`` that grows
by ``torch.cat`` (a copy of every layer's keys and values per forward), ``repeat_kv`` copies for
grouped-query attention and a few hundred module dispatches. At batch size 1 on a CPU, with a
draft that is called once per drafted token, that overhead is a sizeable share of the time.

``NativeLlamaRunner`` computes the same function (same weights, read in place from the
transformers modules, no copy) in the style of gpt-fast: a short loop over layers with
``F.linear``, one preallocated key/value buffer per layer written in place (``models.kv_buffer``), and
``scaled_dot_product_attention`` with ``enable_gqa``. Rotary embeddings come from the model's own
``rotary_emb`` module, so every RoPE variant transformers supports (default, llama3, linear,
dynamic, yarn, ...) is used exactly as transformers defines it; the output layer is called as a
module when it is not a plain ``nn.Linear`` or has hooks, so forward hooks on ``lm_head``
(SPRINTER's feature extractor) still fire.

bf16 on CPU: ``F.linear`` hands the weight to oneDNN, which prepares (reorders) it on every call;
with 1-5 rows that preparation is a large part of the product's cost. The runner reorders each
weight once at construction (``torch.ops.mkldnn._reorder_linear_weight``, the call
torch.compile's CPU backend uses for frozen weights) and multiplies with the packed copy: up to
2x faster per product at 1-5 rows, about 25 % per forward of the default target (5 tokens,
1 thread: 69 -> 51 ms; transformers' own forward: 78 ms; ``benchmarks/runner_speed.py``), with
bit-identical results in our checks.

fp32 on CPU: ``F.linear`` goes to MKL's sgemm, which on an AMD Zen 5 (1 thread) ran a product of m
rows as m matrix-vector products: the output layer took 6.6 ms at 1 row, 13.9 ms at 2, 20.6 ms at 3.
oneDNN's product on the packed fp32 weight took 2.8, 3.0 and 3.2 ms (5.6 ms at 16 rows), with an
error against a float64 product of the same order (4e-6 against 2e-6 for MKL, relative to outputs of
~1), and a row's result did not depend on how many rows (2-25) shared the product, except in the
down projection (K = 1536: up to 9e-6). So fp32 is packed too: one forward 1.6x faster at 1 token, 2.5x at 5; on held-out
prompts plain decoding 1.5x and the default token trees 1.9x (``benchmarks/runner_speed.py``,
``benchmarks/prepack_speed.py``; docs/numbers.md).

The price is one extra copy of the linear weights in memory (bf16: +251 MB for the default target,
fp32: twice that, 134.5 M weights x 4 bytes), and the packed copies are a snapshot: build a new runner (a new adapter) after
changing the model's weights; ``prepack=False`` keeps ``F.linear`` on the module weights. Other
dtypes and devices use ``F.linear`` on the module weights directly (no copy).

It supports the classes whose decoder layers are transformers' ``LlamaDecoderLayer`` (Llama 1-3,
SmolLM, TinyLlama, the sub-vocabulary drafts of ``models.default_draft``) with SiLU MLPs and
``pretraining_tp`` 1; ``supports(model)`` says whether a model qualifies and why not, and the
adapter falls back to the transformers forward otherwise. Logits agree with transformers' forward
to float rounding (tests/models/test_native_llama.py: 1e-5 in fp32).

One new token in bf16 / fp16 on a CPU (a decoding step, a root-only round) attends by two float32
products (``models.attention``) instead of ``scaled_dot_product_attention``, whose flash kernel is
4-8x slower for a single bf16 query row: a third of the default target's one-token forward at 600
cached tokens (28.6 -> 17.4 ms on an AMD Zen 5, 1 thread). Same float32 accumulation, one rounding.

Batch-invariant mode (``row_shape``, ``models.row_shape``): forwards run in padded chunks of a
measured shape, with attention one row at a time over each row's gathered keys, so a row's logits do
not depend on how many tokens shared its forward (docs/drafter-invariance.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from verispec.errors import ConfigError
from verispec.models.attention import single_query_attention, takes_single_query_path
from verispec.models.kv_buffer import MIN_CAPACITY, KVBuffers


def supports(model) -> str | None:
    """None if ``model`` can run natively, else the reason it cannot (shown to the user)."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaModel, LlamaRMSNorm

    body = getattr(model, "model", None)
    if not isinstance(body, LlamaModel):
        return f"{type(model).__name__} is not a Llama-architecture model (its body is {type(body).__name__})"
    config = model.config
    if getattr(config, "pretraining_tp", 1) not in (None, 1):
        return f"pretraining_tp={config.pretraining_tp} (tensor-parallel emulation) is not implemented"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act={config.hidden_act!r}; only 'silu' is implemented"
    for layer in body.layers:
        if type(layer) is not LlamaDecoderLayer or type(layer.input_layernorm) is not LlamaRMSNorm:
            return f"layer type {type(layer).__name__} differs from LlamaDecoderLayer"
    if type(body.norm) is not LlamaRMSNorm:
        return f"final norm {type(body.norm).__name__} differs from LlamaRMSNorm"
    return None


def _can_prepack(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether oneDNN weight prepacking applies and works here (bf16 or fp32 on a CPU with oneDNN)."""
    if dtype not in (torch.bfloat16, torch.float32) or device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    try:
        # deterministic probe values: drawing them would advance torch's global random state
        weight = torch.linspace(-1, 1, 8 * 16).reshape(8, 16).to(dtype)
        x = torch.linspace(-2, 2, 3 * 16).reshape(1, 3, 16).to(dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        out = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    except (RuntimeError, AttributeError):  # a torch build without these oneDNN ops
        return False
    return torch.allclose(out.float(), F.linear(x, weight).float(), atol=1e-2)


class _Linear:
    """y = x W^T + b of an ``nn.Linear``: on the module's own weight, or on a oneDNN-packed copy."""

    def __init__(self, linear, prepack: bool):
        self.bias = linear.bias
        self.packed = prepack
        self.weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None) if prepack else linear.weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


class _FusedLinear(_Linear):
    """The product of several ``nn.Linear`` of one input at once: their weights stacked (oneDNN-packed
    when ``prepack``), outputs side by side; called as a ``_Linear``. One weight read and one call
    instead of several: the q/k/v and gate/up products of a layer, whose outputs are slices of this one."""

    def __init__(self, linears, prepack: bool):
        weight = torch.cat([linear.weight.detach() for linear in linears])
        biases = [linear.bias for linear in linears]
        self.bias = None if all(b is None for b in biases) else torch.cat([
            b.detach() if b is not None else weight.new_zeros(linear.out_features) for b, linear in zip(biases, linears)])
        self.packed = prepack
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, None) if prepack else weight


def _rms_norm(x: torch.Tensor, norm) -> torch.Tensor:
    """transformers' LlamaRMSNorm, step for step (normalise in float32, scale in the input dtype)."""
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * x.to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on x (1, heads, n, head_dim) with cos/sin (1, 1, n, head_dim), as transformers' rotate_half
    (any shapes that broadcast, head_dim last: the batched runner passes (n, heads, head_dim))."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def mlp_residual(hidden: torch.Tensor, layer, linears) -> torch.Tensor:
    """hidden + the decoder layer's SiLU MLP of its post-attention norm (``linears``: the layer's
    seven ``_Linear``, MLP last)."""
    gate_proj, up_proj, down_proj = linears[4:]
    x = _rms_norm(hidden, layer.post_attention_layernorm)
    return hidden + down_proj(F.silu(gate_proj(x)) * up_proj(x))


def _row_keys(allowed: torch.Tensor, key_end: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys of each real row of a shaped chunk: (index long (real, key_end), mask bool (real, key_end)).

    allowed: bool (real, start + real). A row's visible entries come first, in cache order (for a tree
    node: the committed context, then its ancestors, as if scored alone), then the zeroed entry
    ``key_end``, masked.
    """
    real = allowed.shape[0]
    index = torch.full((real, key_end), key_end, dtype=torch.long)
    mask = torch.zeros(real, key_end, dtype=torch.bool)
    for row in range(real):
        visible = allowed[row].nonzero().flatten()
        index[row, : len(visible)] = visible
        mask[row, : len(visible)] = True
    return index, mask


class NativeLlamaRunner:
    """Forward of a Llama-architecture ``model`` (batch size 1) over a preallocated KV cache.

    The cache holds ``length`` entries; ``forward`` appends, ``keep_entries`` truncates and
    compacts (the adapter's rollback and commit).
    """

    def __init__(self, model, initial_capacity: int = MIN_CAPACITY, prepack: bool | None = None):
        reason = supports(model)
        if reason is not None:
            raise ConfigError(f"cannot run this model natively: {reason}; use the transformers runner")
        self.model = model
        body = model.model
        config = model.config
        self.layers = list(body.layers)
        attention = self.layers[0].self_attn
        self.head_dim = int(attention.head_dim)
        self.num_heads = int(config.num_attention_heads)
        self.num_kv_heads = int(config.num_key_value_heads)
        self.scaling = float(attention.scaling)
        self.param = next(model.parameters())
        if prepack is None:
            prepack = _can_prepack(self.param.dtype, self.param.device)
        self.prepacked = bool(prepack)
        with torch.no_grad():
            self.linears = [
                [_Linear(module, self.prepacked) for module in (
                    layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.self_attn.o_proj,
                    layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj)]
                for layer in self.layers
            ]
            head = model.lm_head
            self.head = _Linear(head, self.prepacked) if type(head) is torch.nn.Linear else None
        self.kv = KVBuffers(len(self.layers), self.num_kv_heads, self.head_dim, self.param, initial_capacity)
        self._fused: list[tuple[_FusedLinear, _FusedLinear]] | None = None  # built by ``fused_linears``
        self._fused_source: NativeLlamaRunner | None = None  # ``share_weights_from``'s runner, whose set is used
        self.length = 0  # valid cache entries
        # batch-invariant mode (``models.row_shape``): None = every forward in one piece, as given
        self.row_shape = None
        # a bf16 / fp16 query row alone attends by float32 products, not the slow flash kernel
        # (``models.attention``); False only to measure the difference (benchmarks/single_query_attention.py)
        self.single_query_path = True
        # opt-in feature capture (EAGLE-3 heads): HF hidden_states indices whose states (the
        # inputs of those decoder layers) every forward also returns in ``last_features``
        self.feature_layers: tuple[int, ...] | None = None
        self.last_features: torch.Tensor | None = None

    def share_weights_from(self, other: "NativeLlamaRunner") -> bool:
        """Multiply with ``other``'s oneDNN-packed weights and free this runner's own packed copy.

        Packed weights are read-only after construction, so runners of the SAME model (e.g. one per
        server worker, each with its own KV cache) can share one set instead of one copy each.
        Returns whether anything was shared: False unless both runners prepack and run one model
        (unpacked runners already multiply with the module's own weights).
        """
        if not (self.prepacked and other.prepacked) or self.model is not other.model:
            return False
        self.linears, self.head = other.linears, other.head
        return self.share_fused_from(other)

    def share_fused_from(self, other: "NativeLlamaRunner") -> bool:
        """Use ``other``'s stacked q|k|v and gate|up products (``fused_linears``), packed or not: they
        are read-only once built, so runners of the SAME model (batch replicas) need one set. Returns
        whether they now share (False for another model)."""
        if self.model is not other.model:
            return False
        self._fused, self._fused_source = None, other
        return True

    def fused_linears(self) -> list[tuple["_FusedLinear", "_FusedLinear"]]:
        """Per layer, (q|k|v, gate|up): the products of the batched runner (``models.batch_runner``),
        built at the first call, then kept (shared with runners that ``share_weights_from`` or
        ``share_fused_from`` this one).
        A second copy of those weights (about 70 % of a layer's), paid only once batched forwards run:
        one call per stacked product instead of three and two is ~8 % of a batched forward
        (B = 4 trees of 5 nodes, bf16). The single-sequence forward keeps the separate products (the
        batch-invariant mode's measured row shapes are properties of those)."""
        if self._fused_source is not None:
            return self._fused_source.fused_linears()
        if self._fused is None:
            with torch.no_grad():
                self._fused = [(
                    _FusedLinear((layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj), self.prepacked),
                    _FusedLinear((layer.mlp.gate_proj, layer.mlp.up_proj), self.prepacked),
                ) for layer in self.layers]
        return self._fused

    def reset(self) -> None:
        self.length = 0

    def seq_length(self) -> int:
        return self.length

    @torch.no_grad()
    def forward(self, input_ids: list[int], positions: list[int], allowed: torch.Tensor | None, keep: int):
        """Append len(input_ids) cache entries and return the float32 CPU logits of the last ``keep``.

        allowed: bool (n, length + n), True where input i may attend to cache entry j; None means
        plain causal attention over the whole cache (a prefill, or a single query token).
        Returns (keep, V). With ``feature_layers`` set, ``last_features`` becomes the
        (n, len(feature_layers) * hidden) states of every input (model dtype and device).
        With ``row_shape`` set (batch-invariant mode, ``models.row_shape``) the forward runs as
        chunks of that shape; same function, rows independent of how the tokens were grouped.
        """
        n = len(input_ids)
        start, end = self.length, self.length + n
        # A prefill (causal, empty cache) is the same forward in every run of a prompt, shaped or not:
        # it runs unshaped (per-row attention over n rows would gather n^2 keys).
        if self.row_shape is not None and not (allowed is None and start == 0):
            return self._forward_shaped(input_ids, positions, allowed, keep)
        self.kv.reserve(end, used=start)
        device = self.param.device
        if allowed is not None:
            mask = allowed.to(device)[None, None]
            causal = False
        else:
            mask = None
            causal = n > 1 and start == 0  # with earlier entries a causal mask would be misaligned
            if n > 1 and start > 0:
                mask = torch.ones(n, end, dtype=torch.bool, device=device).tril(start)[None, None]
        hidden, features = self._layers(input_ids, positions, mask, causal, end)
        self.length = end
        self.last_features = features
        return self.output_logits(hidden[:, -keep:])

    def _forward_shaped(self, input_ids: list[int], positions: list[int], allowed: torch.Tensor | None, keep: int):
        """``forward`` in chunks of ``row_shape``: each chunk of r <= max_rows real rows is padded
        with dummy rows to min_rows (dummies last, with no attention of their own, never seen by a
        real row, dropped after), and the output layer runs over the whole padded chunk, so each product has a
        shape of the invariant kernel class. Attention runs row by row over each row's own visible keys
        gathered in position order (``_row_keys``, ``_row_attention``): a tree node then sees the same
        key layout as the token scored alone (in place, a tree puts its ancestors' keys apart, and bf16
        dot products that pair neighbouring keys then round differently), up to a multiple of key_align."""
        shape = self.row_shape
        n = len(input_ids)
        base = self.length
        if allowed is None:
            allowed = torch.ones(n, base + n, dtype=torch.bool).tril(base)
        logits, features = [], []
        for first, last in shape.chunks(n):
            real = last - first
            rows = shape.padded(real)
            start = base + first
            key_end = shape.key_length(start + rows)
            self.kv.reserve(key_end + 1, used=start)  # entry key_end: a zeroed key for the padding
            row_keys, mask = _row_keys(allowed[first:last, : start + real], key_end)
            chunk_ids = input_ids[first:last] + [input_ids[last - 1]] * (rows - real)
            chunk_positions = positions[first:last] + [positions[last - 1]] * (rows - real)
            device = self.param.device
            hidden, captured = self._layers(chunk_ids, chunk_positions, mask.to(device), False, key_end + 1, row_keys.to(device))
            self.length = start + real  # the dummies' entries are dropped (overwritten by the next chunk)
            kept = max(0, last - max(first, n - keep))  # rows of this chunk among the last ``keep``
            if kept:
                logits.append(self.output_logits(hidden)[real - kept : real])
            if captured is not None:
                features.append(captured[:real])
        self.last_features = torch.cat(features) if features else None
        return torch.cat(logits)

    def _layers(self, input_ids: list[int], positions: list[int], mask, causal: bool, key_end: int, row_keys=None):
        """The decoder layers over m inputs written to cache entries [length, length + m), attending to
        keys [0, key_end) under ``mask`` (bool (1, 1, m, key_end) or None) / ``causal``; entries in
        [length + m, key_end) are zeroed (masked keys must hold no NaN: 0 * NaN = NaN).
        row_keys: long (m, L) cache entries each input attends to (``_row_attention``; ``mask`` then
        bool (m, L)). Returns (hidden (1, m, hidden), features (m, F) or None)."""
        n = len(input_ids)
        start, end = self.length, self.length + n
        device = self.param.device
        body = self.model.model
        hidden = body.embed_tokens(torch.tensor([input_ids], device=device))
        cos, sin = body.rotary_emb(hidden, torch.tensor([positions], device=device))
        cos, sin = cos[:, None], sin[:, None]  # (1, 1, n, head_dim)
        capture = self.feature_layers
        captured: dict[int, torch.Tensor] = {}
        # one bf16 / fp16 query row over the whole cache: ``models.attention`` instead of the flash kernel
        single_row = (row_keys is None and mask is None and not causal and self.single_query_path
                      and takes_single_query_path(n, hidden.dtype, device))
        for index, (layer, linears, key_cache, value_cache) in enumerate(zip(self.layers, self.linears, self.kv.keys, self.kv.values)):
            if capture is not None and index in capture:
                captured[index] = hidden[0]  # the input of decoder layer ``index`` = HF hidden_states[index]
            q_proj, k_proj, v_proj, o_proj = linears[:4]
            x = _rms_norm(hidden, layer.input_layernorm)
            q = q_proj(x).view(1, n, self.num_heads, self.head_dim).transpose(1, 2)
            k = k_proj(x).view(1, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
            v = v_proj(x).view(1, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
            key_cache[:, :, start:end] = _rotate(k, cos, sin)
            value_cache[:, :, start:end] = v
            if key_end > end:
                key_cache[:, :, end:key_end] = 0
                value_cache[:, :, end:key_end] = 0
            q = _rotate(q, cos, sin)
            if single_row:
                out = single_query_attention(q, key_cache[:, :, :key_end], value_cache[:, :, :key_end], self.scaling).transpose(1, 2)
            elif row_keys is None:
                out = F.scaled_dot_product_attention(
                    q, key_cache[:, :, :key_end], value_cache[:, :, :key_end], attn_mask=mask, is_causal=causal,
                    scale=self.scaling, enable_gqa=self.num_heads != self.num_kv_heads,
                ).transpose(1, 2)
            else:  # real rows only: a dummy row's attention is never read (zeros keep the shape)
                out = q.new_zeros(n, self.num_heads, self.head_dim)
                real = row_keys.shape[0]
                out[:real] = self._row_attention(q[0, :, :real].transpose(0, 1), key_cache[0], value_cache[0], row_keys, mask)
            hidden = hidden + o_proj(out.reshape(1, n, self.num_heads * self.head_dim))
            hidden = mlp_residual(hidden, layer, linears)
        features = None if capture is None else torch.cat([captured[i] for i in capture], dim=-1)
        return hidden, features

    def _row_attention(self, q, key_cache, value_cache, row_keys, mask) -> torch.Tensor:
        """Attention of each row over its own gathered keys, in float32: q (m, heads, head_dim);
        key_cache / value_cache (kv heads, capacity, head_dim); row_keys long (m, L); mask bool (m, L).
        One row at a time (batched over kv heads only): a batched product over the rows rounds
        differently with their number (measured in float32), and a row's result must not depend on
        the forward it is in. Returns (m, heads, head_dim)."""
        groups = self.num_heads // self.num_kv_heads  # query heads per kv head, as transformers' repeat_kv
        keys = key_cache.transpose(0, 1)[row_keys].float()  # (m, L, kv heads, head_dim)
        values = value_cache.transpose(0, 1)[row_keys].float()
        queries = q.float().contiguous()
        rows = []
        for row in range(q.shape[0]):
            query = queries[row].view(self.num_kv_heads, groups, self.head_dim)
            scores = torch.matmul(query, keys[row].permute(1, 2, 0)) * self.scaling  # (kv heads, groups, L)
            scores = scores.masked_fill(~mask[row], float("-inf"))
            rows.append(torch.matmul(torch.softmax(scores, dim=-1), values[row].transpose(0, 1)))  # (kvh, groups, hd)
        return torch.stack(rows).reshape(q.shape[0], self.num_heads, self.head_dim).to(q.dtype)

    def output_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm and output layer on hidden states (1, k, hidden): float32 CPU logits (k, V)."""
        hidden = _rms_norm(hidden, self.model.model.norm)
        head = self.model.lm_head
        if self.head is None or head._forward_hooks or head._forward_pre_hooks:
            logits = head(hidden)  # a module call: its hooks fire (and a non-Linear head works)
        else:
            logits = self.head(hidden)
        return logits[0].float().cpu()

    @torch.no_grad()
    def keep_entries(self, length: int, moved: Sequence[int] = ()) -> None:
        """Keep cache entries [0, length) followed by the entries at indices ``moved`` (copied down)."""
        self.length = self.kv.move_entries(0, length, moved)
