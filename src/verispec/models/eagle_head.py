"""EAGLE-3 draft heads: one decoder layer that reads the target's own hidden states.

Layout (EAGLE-3, Li et al. 2025; the checkpoint layout SGLang's ``LlamaForCausalLMEagle3`` and
vLLM's ``speculators`` load, see ``models.head_formats``):

    features   (n, 3 * H_t)  the target's hidden states at three depths: HF ``hidden_states[i]``
                             for i in ``aux_layer_ids`` (the inputs of decoder layers 2, N//2, N-3;
                             for SmolLM2's 30 layers 2, 15, 27), concatenated
    fc         3 * H_t -> H  (no bias) projects them to the head's width
    embeds     (n, H)        the target's input embedding of the *next* token (frozen, not stored)
    midlayer   one Llama decoder layer whose attention reads
               cat(input_layernorm(embeds), hidden_norm(hidden)) (2H -> q/k/v), residual = hidden
               (or hidden_norm(hidden) when ``norm_before_residual``), then the usual MLP block
    norm, lm_head  H -> draft vocabulary D (the most frequent target tokens);
               ``draft_to_target[d]`` is the target id of draft token d (SGLang's ``d2t`` stores the
               offset draft_to_target[d] - d), ``t2d`` marks the target ids inside D.

The pre-norm output ``out`` of a step is the head's own prediction of the next target feature:
deeper draft steps feed it back in place of the projected features (no fc), as at decode time.

Alignment. Entry j of the head's sequence pairs the target feature of position j with the token at
position j + 1 and sits at RoPE position j; its logits predict the token at j + 2. With committed
tokens x_0..x_t and the pending root x_{t+1}: entries 0..t use target features, entry t is the
depth-1 query, and the depth-d query is entry t + d - 1, fed the head's output of its parent entry
and the embedding of the drafted token at depth d - 1.

q = 0 outside D exactly (``target_logits`` puts -inf there), so every lossless rule stays exact.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from verispec.errors import ConfigError
from verispec.models.attention import single_query_attention, takes_single_query_path

HEAD_CONFIG_FILE = "verispec_head.json"
HEAD_WEIGHTS_FILE = "head.safetensors"


def default_aux_layer_ids(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's feature depths for a target with ``num_layers`` decoder layers: the inputs of
    layers 2, N // 2 and N - 3 (= HF ``hidden_states`` indices; 2, 15, 27 for N = 30)."""
    if num_layers < 5:
        raise ConfigError(f"EAGLE-3 features need a target with at least 5 layers, got {num_layers}")
    return (2, num_layers // 2, num_layers - 3)


@dataclass(frozen=True)
class HeadConfig:
    """Shapes of a head. ``target_hidden_size`` H_t, ``hidden_size`` H (the decoder layer's width),
    ``vocab_size`` the target's V, ``draft_vocab_size`` D <= V."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    aux_layer_ids: tuple[int, ...]
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    norm_before_residual: bool = False
    extra: dict = field(default_factory=dict)  # provenance (target name, training recipe)

    def __post_init__(self):
        if not 0 < self.draft_vocab_size <= self.vocab_size:
            raise ConfigError(f"draft_vocab_size must be in [1, {self.vocab_size}], got {self.draft_vocab_size}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of num_key_value_heads "
                f"{self.num_key_value_heads}"
            )
        object.__setattr__(self, "aux_layer_ids", tuple(int(i) for i in self.aux_layer_ids))

    @classmethod
    def for_target(cls, target_config, draft_vocab_size: int, aux_layer_ids=None, **overrides) -> HeadConfig:
        """A head as wide as ``target_config`` (a transformers LlamaConfig-like config): the EAGLE-3
        default (one decoder layer of the target's shape)."""
        heads = int(target_config.num_attention_heads)
        hidden = int(target_config.hidden_size)
        rope = getattr(target_config, "rope_parameters", None) or {}
        theta = rope.get("rope_theta", getattr(target_config, "rope_theta", 10000.0))
        values = dict(
            hidden_size=hidden,
            intermediate_size=int(target_config.intermediate_size),
            num_attention_heads=heads,
            num_key_value_heads=int(getattr(target_config, "num_key_value_heads", heads)),
            head_dim=int(getattr(target_config, "head_dim", None) or hidden // heads),
            vocab_size=int(target_config.vocab_size),
            draft_vocab_size=int(draft_vocab_size),
            target_hidden_size=hidden,
            aux_layer_ids=tuple(aux_layer_ids or default_aux_layer_ids(int(target_config.num_hidden_layers))),
            rms_norm_eps=float(target_config.rms_norm_eps),
            rope_theta=float(theta),
            max_position_embeddings=int(target_config.max_position_embeddings),
        )
        values.update(overrides)
        return cls(**values)

    def to_dict(self) -> dict:
        values = asdict(self)
        values["aux_layer_ids"] = list(self.aux_layer_ids)
        return values

    @classmethod
    def from_dict(cls, values: dict) -> HeadConfig:
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown head config keys {unknown}; expected a subset of {sorted(known)}")
        return cls(**values)


class _RMSNorm(nn.Module):
    """transformers' LlamaRMSNorm (normalise in float32, scale in the input dtype)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Default (unscaled) RoPE, transformers' rotate_half convention.
    x (B, heads, n, head_dim), positions (B, n) int."""
    head_dim = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=x.device) / head_dim))
    angles = positions.to(torch.float32)[..., None] * inv_freq  # (B, n, head_dim / 2)
    emb = torch.cat((angles, angles), dim=-1)[:, None]  # (B, 1, n, head_dim)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    half = head_dim // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class _Attention(nn.Module):
    def __init__(self, config: HeadConfig):
        super().__init__()
        width = 2 * config.hidden_size
        self.q_proj = nn.Linear(width, config.num_attention_heads * config.head_dim, bias=False)
        self.k_proj = nn.Linear(width, config.num_key_value_heads * config.head_dim, bias=False)
        self.v_proj = nn.Linear(width, config.num_key_value_heads * config.head_dim, bias=False)
        self.o_proj = nn.Linear(config.num_attention_heads * config.head_dim, config.hidden_size, bias=False)


class _MLP(nn.Module):
    def __init__(self, config: HeadConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _MidLayer(nn.Module):
    def __init__(self, config: HeadConfig):
        super().__init__()
        self.input_layernorm = _RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.hidden_norm = _RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = _Attention(config)
        self.post_attention_layernorm = _RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = _MLP(config)


@dataclass
class StepOutput:
    """One head step over n entries: ``out`` (B, n, H) the pre-norm output (the next step's input
    hidden), ``keys``/``values`` (B, kv_heads, n, head_dim) the new entries' attention keys/values
    (RoPE applied), for a cache."""

    out: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor


class Eagle3Head(nn.Module):
    """The head's parameters and its forward. The target's input embedding is passed in
    (``embed_tokens``, frozen, not part of the head's checkpoint)."""

    def __init__(self, config: HeadConfig, draft_to_target: torch.Tensor | None = None):
        super().__init__()
        self.config = config
        self.fc = nn.Linear(len(config.aux_layer_ids) * config.target_hidden_size, config.hidden_size, bias=False)
        self.midlayer = _MidLayer(config)
        self.norm = _RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        if draft_to_target is None:
            draft_to_target = torch.arange(config.draft_vocab_size)
        self.register_buffer("draft_to_target", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.set_draft_vocabulary(draft_to_target)

    def set_draft_vocabulary(self, draft_to_target: torch.Tensor) -> None:
        """draft_to_target (D,): distinct target ids in [0, V), increasing (the order SGLang's d2t
        offsets assume, so that d2t[d] = draft_to_target[d] - d >= 0)."""
        ids = torch.as_tensor(draft_to_target, dtype=torch.long).flatten()
        config = self.config
        if ids.numel() != config.draft_vocab_size:
            raise ConfigError(f"draft_to_target has {ids.numel()} ids, the head's draft vocabulary {config.draft_vocab_size}")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= config.vocab_size):
            raise ConfigError(f"draft_to_target ids must lie in [0, {config.vocab_size}), got [{int(ids.min())}, {int(ids.max())}]")
        if ids.numel() > 1 and not bool((ids[1:] > ids[:-1]).all()):
            raise ConfigError("draft_to_target must be strictly increasing (distinct target ids in order)")
        self.draft_to_target.copy_(ids.to(self.draft_to_target.device))

    @property
    def t2d(self) -> torch.Tensor:
        """(V,) bool: True for the target ids inside the draft vocabulary."""
        mask = torch.zeros(self.config.vocab_size, dtype=torch.bool, device=self.draft_to_target.device)
        mask[self.draft_to_target] = True
        return mask

    @property
    def d2t(self) -> torch.Tensor:
        """(D,) int64: SGLang / EAGLE-3 offsets, target id = d + d2t[d]."""
        return self.draft_to_target - torch.arange(self.config.draft_vocab_size, device=self.draft_to_target.device)

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """(..., 3 H_t) target features -> (..., H) the midlayer's input hidden."""
        return self.fc(features)

    def step(
        self,
        hidden: torch.Tensor,
        embeds: torch.Tensor,
        positions: torch.Tensor,
        past_keys: torch.Tensor | None = None,
        past_values: torch.Tensor | None = None,
        allowed: torch.Tensor | None = None,
    ) -> StepOutput:
        """The midlayer over n new entries.

        hidden (B, n, H): projected features or the head's own earlier ``out``; embeds (B, n, H):
        target embeddings of the entries' tokens; positions (B, n) RoPE positions;
        past_keys/values (B, kv_heads, m, head_dim) entries attended besides the new ones;
        allowed: bool (B or 1, n, m + n), True where entry i may attend to column j (past first,
        then the new entries); None = every past entry plus causal among the new ones.
        """
        config = self.config
        layer = self.midlayer
        batch, n, _ = hidden.shape
        x = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(hidden)], dim=-1)
        residual = layer.hidden_norm(hidden) if config.norm_before_residual else hidden
        attn = layer.self_attn
        q = attn.q_proj(x).view(batch, n, config.num_attention_heads, config.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(batch, n, config.num_key_value_heads, config.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(batch, n, config.num_key_value_heads, config.head_dim).transpose(1, 2)
        q, k = _rope(q, positions, config.rope_theta), _rope(k, positions, config.rope_theta)
        all_k = k if past_keys is None else torch.cat([past_keys, k], dim=2)
        all_v = v if past_values is None else torch.cat([past_values, v], dim=2)
        past = 0 if past_keys is None else past_keys.shape[2]
        if allowed is None:
            allowed = torch.ones(n, past + n, dtype=torch.bool, device=hidden.device).tril(past)[None]
        if batch == 1 and takes_single_query_path(n, q.dtype, q.device):  # one draft step of one sequence (models.attention)
            attended = single_query_attention(q, all_k, all_v, config.head_dim**-0.5, allowed[0, 0])
        else:
            attended = F.scaled_dot_product_attention(
                q, all_k, all_v, attn_mask=allowed[:, None], scale=config.head_dim**-0.5,
                enable_gqa=config.num_attention_heads != config.num_key_value_heads,
            )
        hidden = residual + attn.o_proj(attended.transpose(1, 2).reshape(batch, n, -1))
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return StepOutput(hidden, k, v)

    def draft_logits(self, out: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., D) logits over the draft vocabulary."""
        return self.lm_head(self.norm(out))

    def target_logits(self, out: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., V) float32 logits over the target vocabulary, -inf outside the draft
        vocabulary (so q = 0 there exactly after any softmax)."""
        sub = self.draft_logits(out).float()
        full = sub.new_full((*sub.shape[:-1], self.config.vocab_size), float("-inf"))
        full[..., self.draft_to_target] = sub
        return full

    def unrolled(self, features: torch.Tensor, embeds: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Training-time test (EAGLE-3): ``steps`` self-fed passes over whole sequences, each query
        seeing exactly what it sees at decode time at that draft depth.

        features (B, n, 3 H_t): target features of positions 0..n-1; embeds (B, n, H): embeddings
        of the tokens at positions 1..n (entry j pairs feature j with token j + 1).
        Returns ``steps`` tensors (B, n, D): step k's logits at entry j are the depth-k prediction
        of the token at j + 2 for a round whose root feature is j - k + 1 (entries j < k - 1 of
        step k have no such round and must be masked out of a loss).

        Step k at entry j attends to step-1 (target-feature) keys at entries <= j - k + 1 and to
        the step-s key at entry j - k + s for s = 2..k (its own drafted ancestors), and its input
        hidden is step k - 1's output at entry j - 1.
        """
        batch, n, _ = features.shape
        device = features.device
        positions = torch.arange(n, device=device).expand(batch, n)
        index = torch.arange(n, device=device)
        hidden = self.project(features)
        keys, values, outputs = [], [], []
        for k in range(1, steps + 1):
            if k > 1:
                # entry j is fed step k - 1's output at entry j - 1 (its parent); entry 0 has none
                hidden = torch.cat([torch.zeros_like(hidden[:, :1]), outputs[-1][:, :-1]], dim=1)
            blocks = [index[None, :] <= (index[:, None] - k + 1)]  # step-1 keys: the committed context
            for s in range(2, k + 1):
                blocks.append(index[None, :] == (index[:, None] - k + s))
            allowed = torch.cat(blocks, dim=1)
            # rows with no admissible key (j < k - 1) would give NaN: let them see themselves
            allowed[:, -n:] |= torch.eye(n, dtype=torch.bool, device=device) & ~allowed.any(1, keepdim=True)
            past_k = torch.cat(keys, dim=2) if keys else None
            past_v = torch.cat(values, dim=2) if values else None
            if k == 1:
                result = self.step(hidden, embeds, positions, None, None, allowed[None])
            else:
                result = self.step(hidden, embeds, positions, past_k, past_v, allowed[None])
            keys.append(result.keys)
            values.append(result.values)
            outputs.append(result.out)
        return [self.draft_logits(out) for out in outputs]


# ------------------------------------------------------------------------------- saving


def save_head(head: Eagle3Head, directory: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write ``verispec_head.json`` and ``head.safetensors`` (weights + ``draft_to_target``)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, tensor in head.state_dict().items():
        tensor = tensor.detach().cpu()
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        tensors[name] = tensor.contiguous()
    tmp = directory / (HEAD_WEIGHTS_FILE + ".tmp")
    save_file(tensors, str(tmp))
    tmp.replace(directory / HEAD_WEIGHTS_FILE)
    (directory / HEAD_CONFIG_FILE).write_text(json.dumps(head.config.to_dict(), indent=2) + "\n")
    return directory


def is_head_dir(directory: str | Path) -> bool:
    return (Path(directory) / HEAD_CONFIG_FILE).is_file()


def load_head(directory: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> Eagle3Head:
    """A head written by ``save_head`` (for EAGLE-3 / speculators checkpoints see
    ``models.head_formats.load_any_head``)."""
    from safetensors.torch import load_file

    directory = Path(directory)
    if not is_head_dir(directory):
        raise ConfigError(f"{str(directory)!r} is not a verispec head directory (no {HEAD_CONFIG_FILE})")
    config = HeadConfig.from_dict(json.loads((directory / HEAD_CONFIG_FILE).read_text()))
    head = Eagle3Head(config)
    state = load_file(str(directory / HEAD_WEIGHTS_FILE))
    missing, unexpected = head.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ConfigError(f"head checkpoint {str(directory)!r}: missing {missing}, unexpected {unexpected}")
    return head.to(device=device, dtype=dtype).eval()


@torch.no_grad()
def target_features(target, input_ids: torch.Tensor, aux_layer_ids, attention_mask: torch.Tensor | None = None):
    """Teacher-forced features and logits of a transformers causal LM (the reference the engine's
    runners must match): input_ids (B, n) -> (features (B, n, len(aux) * H_t) float32,
    logits (B, n, V) float32). features[:, j] = cat_i HF ``hidden_states[i][:, j]`` for i in
    ``aux_layer_ids`` (the inputs of those decoder layers)."""
    out = target(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
    states = out.hidden_states
    last = len(states) - 2  # states[-1] has the final norm applied: not a layer input
    for i in aux_layer_ids:
        if not 0 <= int(i) <= last:
            raise ConfigError(f"aux layer id {i} is outside the target's layer inputs [0, {last}]")
    features = torch.cat([states[int(i)].float() for i in aux_layer_ids], dim=-1)
    return features, out.logits.float()
