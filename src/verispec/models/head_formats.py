"""EAGLE-3 head checkpoints in the formats other engines load (SGLang, vLLM speculators).

``export_head(head, out_dir, format, ...)`` writes ``DIR/config.json`` + ``DIR/model.safetensors``:

``format="eagle3"`` -- SGLang's ``LlamaForCausalLMEagle3`` (python/sglang/srt/models/llama_eagle3.py,
    the layout of SafeAILab EAGLE-3 and SpecForge checkpoints such as yuhuili/EAGLE3-LLaMA3.1-Instruct-8B):
    a LlamaConfig-style ``config.json`` (``architectures: ["LlamaForCausalLMEagle3"]``,
    ``num_hidden_layers: 1``, ``vocab_size`` = target V, ``draft_vocab_size`` D, ``target_hidden_size``,
    ``eagle_config.eagle_aux_hidden_state_layer_ids``) and tensors ``fc.weight``, ``midlayer.*``,
    ``norm.weight``, ``lm_head.weight``, ``d2t`` (int64 offsets: target id = d + d2t[d]) and ``t2d``
    (bool (V,)). SGLang's loader maps a name ``x`` to ``model.x`` and folds q/k/v and gate/up itself.
    Layer ids: SGLang's ``set_eagle3_layers_to_capture`` captures ``[i + 1 for i in layer_ids]``,
    i.e. its ``eagle_config`` ids count *outputs* of decoder layers (SpecForge's default
    ``(1, N//2 - 1, N - 4)``); verispec's ``aux_layer_ids`` are HF ``hidden_states`` indices (layer
    *inputs*, ``(2, N//2, N - 3)``), so the file holds ``aux_layer_ids - 1``. SGLang's layer (as
    read) normalises the hidden input after taking the residual: a ``norm_before_residual`` head is
    exported with the flag recorded and a warning (SpecForge and some forks read it; vLLM does).

``format="speculators"`` -- vLLM's ``speculators`` format (vllm-project/speculators
    ``Eagle3SpeculatorConfig`` / ``Eagle3DraftModel``; read by vLLM's ``SpeculatorsConfig`` and
    ``update_eagle3`` in vllm/transformers_utils/configs/speculators/, weights by
    vllm/model_executor/models/llama_eagle3.py): ``speculators_model_type: "eagle3"``,
    ``transformer_layer_config`` (a LlamaConfig dict: vocab_size V, one layer), top-level
    ``draft_vocab_size``, ``target_hidden_size``, ``norm_before_residual`` (written explicitly:
    vLLM assumes True when it is absent, speculators False), ``eagle_aux_hidden_state_layer_ids``
    (vLLM captures the input of decoder layer i for id i: the same numbers as verispec's),
    ``speculators_config.proposal_methods[0].speculative_tokens`` and
    ``speculators_config.verifier.name_or_path``; tensors ``layers.0.*`` instead of ``midlayer.*``,
    plus ``fc.weight``, ``norm.weight``, ``lm_head.weight``, ``d2t``, ``t2d``.

Neither export holds ``embed_tokens.weight``: the head uses the target's input embedding, which
vLLM shares from the target when the draft has none (its loader skips ``embed_tokens`` then) and
SGLang's EAGLE worker always shares for EAGLE-3 (``set_embed``). ``draft_vocab_size`` is always
written, even for a full-vocabulary head: SGLang replaces ``lm_head`` by the target's when it is absent.

``load_any_head(dir, target_config)`` reads verispec's native format (``models.eagle_head.save_head``)
and both formats above, including published checkpoints: ``model.``-prefixed names, ``midlayer.`` or
``layers.0.`` names, ``embed_tokens.weight`` (checked for shape, then ignored), no ``d2t``/``t2d``
(a full-vocabulary head), a ``d2t`` whose target ids are not increasing (the ``lm_head`` rows are
permuted to increasing order: the same distribution), missing layer ids (EAGLE-3's default for the
target's layer count). What the head's forward cannot reproduce exactly is refused with a
ConfigError: rope scaling, more than one decoder layer, biases, tied embeddings, other activations,
speculators' ``norm_before_fc`` / ``fc_norm`` / ``norm_output`` (speculators 0.9.0's Eagle3SpeculatorConfig).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch

from verispec.errors import ConfigError
from verispec.models.eagle_head import (
    HEAD_CONFIG_FILE,
    Eagle3Head,
    HeadConfig,
    default_aux_layer_ids,
    is_head_dir,
    load_head,
)

FORMATS = ("eagle3", "speculators")
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
EAGLE3_ARCHITECTURE = "LlamaForCausalLMEagle3"
SPECULATORS_ARCHITECTURE = "Eagle3Speculator"
SHIPPED_HEAD_DIR = Path(__file__).resolve().parent.parent / "assets" / "eagle3_head_smollm2"
# tensors published heads carry that the head does not use (speculators' training-only verifier
# copies); embed_tokens.weight is handled separately (shape check)
_IGNORED_TENSORS = ("verifier_norm.weight", "verifier_lm_head.weight")
_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


# ------------------------------------------------------------------------------ export
def _layer_config(config: HeadConfig) -> dict:
    """The decoder layer's LlamaConfig fields, shared by both formats."""
    return {
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": 1,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
    }


def export_config(config: HeadConfig, format: str, verifier_name_or_path: str | None = None,
                  speculative_tokens: int = 3, dtype_name: str = "float32") -> dict:
    """The ``config.json`` dictionary of ``format`` for a head of ``config``."""
    _check_format(format)
    if format == "eagle3":
        values = {"architectures": [EAGLE3_ARCHITECTURE], **_layer_config(config)}
        values.update(
            draft_vocab_size=config.draft_vocab_size,
            target_hidden_size=config.target_hidden_size,
            norm_before_residual=config.norm_before_residual,
            eagle_config={
                "use_aux_hidden_state": True,
                # SGLang counts decoder-layer outputs: HF hidden_states index - 1 (module docstring)
                "eagle_aux_hidden_state_layer_ids": [i - 1 for i in config.aux_layer_ids],
            },
            torch_dtype=dtype_name,
            verispec_extra=config.extra,
        )
        return values
    if speculative_tokens < 1:
        raise ConfigError(f"speculative_tokens must be >= 1, got {speculative_tokens}")
    return {
        "architectures": [SPECULATORS_ARCHITECTURE],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": _layer_config(config),
        "draft_vocab_size": config.draft_vocab_size,
        "target_hidden_size": config.target_hidden_size,
        "norm_before_residual": config.norm_before_residual,
        "norm_before_fc": False,
        "fc_norm": False,
        "norm_output": False,
        "eagle_aux_hidden_state_layer_ids": list(config.aux_layer_ids),
        "embed_requires_grad": False,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{
                "proposal_type": "greedy",
                "speculative_tokens": int(speculative_tokens),
                "verifier_accept_k": 1,
                "accept_tolerance": 0.0,
            }],
            "verifier": {"name_or_path": verifier_name_or_path, "architectures": ["LlamaForCausalLM"]},
        },
        "torch_dtype": dtype_name,
        "verispec_extra": config.extra,
    }


def export_tensors(head: Eagle3Head, format: str, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The head's tensors under ``format``'s names: floating weights (cast to ``dtype`` if given),
    ``d2t`` int64 (D,) offsets and ``t2d`` bool (V,)."""
    _check_format(format)
    tensors = {}
    for name, tensor in head.state_dict().items():
        if name == "draft_to_target":
            continue
        tensor = tensor.detach().cpu()
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        if format == "speculators" and name.startswith("midlayer."):
            name = "layers.0." + name[len("midlayer."):]
        tensors[name] = tensor.contiguous()
    tensors["d2t"] = head.d2t.detach().cpu().to(torch.int64).contiguous()
    tensors["t2d"] = head.t2d.detach().cpu().to(torch.bool).contiguous()
    return tensors


def export_head(head: Eagle3Head, out_dir: str | Path, format: str = "eagle3", verifier_name_or_path: str | None = None,
                speculative_tokens: int = 3, dtype: torch.dtype | None = None) -> Path:
    """Write ``out_dir/config.json`` and ``out_dir/model.safetensors`` in ``format`` ("eagle3" for
    SGLang / EAGLE, "speculators" for vLLM). ``verifier_name_or_path``: the target (HF id or path)
    recorded for vLLM; ``speculative_tokens``: the draft length vLLM defaults to; ``dtype``: cast
    floating weights (None keeps the head's). Returns ``out_dir``."""
    from safetensors.torch import save_file

    _check_format(format)
    if format == "eagle3" and head.config.norm_before_residual:
        # upstream SGLang's EAGLE-3 layer (as read) always keeps the un-normalised residual; SpecForge
        # and some forks read the flag. vLLM's speculators path honours it.
        warnings.warn("this head has norm_before_residual = true: the eagle3 config records it, but SGLang's "
                      "LlamaForCausalLMEagle3 may ignore it; prefer --format speculators for vLLM", stacklevel=2)
    tensors = export_tensors(head, format, dtype)
    weight_dtype = tensors["fc.weight"].dtype
    config = export_config(head.config, format, verifier_name_or_path, speculative_tokens,
                           _DTYPE_NAMES.get(weight_dtype, str(weight_dtype).removeprefix("torch.")))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (WEIGHTS_FILE + ".tmp")
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.replace(out / WEIGHTS_FILE)
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return out


def _check_format(format: str) -> None:
    if format not in FORMATS:
        raise ConfigError(f"unknown head format {format!r}; choose one of {', '.join(FORMATS)}")


# -------------------------------------------------------------------------------- load
def head_format(directory: str | Path) -> str:
    """'native', 'eagle3' or 'speculators' (ConfigError if ``directory`` holds no head)."""
    directory = Path(directory)
    if is_head_dir(directory):
        return "native"
    config_path = directory / CONFIG_FILE
    if not config_path.is_file():
        raise ConfigError(
            f"{str(directory)!r} holds no head checkpoint: expected {HEAD_CONFIG_FILE} (verispec) or "
            f"{CONFIG_FILE} + safetensors (EAGLE-3 / speculators)"
        )
    config = _read_json(config_path)
    if config.get("speculators_model_type") is not None:
        if config["speculators_model_type"] != "eagle3":
            raise ConfigError(f"{str(config_path)!r}: speculators_model_type {config['speculators_model_type']!r} "
                              "is not supported (only 'eagle3')")
        return "speculators"
    architectures = config.get("architectures") or []
    if any("eagle3" in a.lower() for a in architectures) or "draft_vocab_size" in config:
        return "eagle3"
    raise ConfigError(
        f"{str(config_path)!r} is not an EAGLE-3 head: architectures {architectures} (expected "
        f"{EAGLE3_ARCHITECTURE!r} or a speculators config with speculators_model_type 'eagle3')"
    )


def is_any_head_dir(directory: str | Path) -> bool:
    try:
        head_format(directory)
    except ConfigError:
        return False
    return True


def resolve_head_dir(source: str | Path) -> Path:
    """'head' = the shipped head; a head directory (any format); or a training run directory with
    ``best/`` or ``final/`` (best preferred). ConfigError naming what is missing otherwise."""
    if str(source) == "head":
        if not is_any_head_dir(SHIPPED_HEAD_DIR):
            raise ConfigError(
                f"this install ships no trained head (nothing in {SHIPPED_HEAD_DIR}); train one with "
                "`verispec train-head` and pass its run directory, or give a head directory"
            )
        return SHIPPED_HEAD_DIR
    path = Path(source)
    if not path.exists():
        raise ConfigError(f"head {str(source)!r} does not exist: give 'head', a head directory or a training run directory")
    if is_any_head_dir(path):
        return path
    for sub in ("best", "final"):
        if is_any_head_dir(path / sub):
            return path / sub
    raise ConfigError(
        f"{str(source)!r} is neither a head directory ({HEAD_CONFIG_FILE}, or {CONFIG_FILE} + {WEIGHTS_FILE}) "
        "nor a training run with best/ or final/ holding one"
    )


def load_any_head(directory: str | Path, target_config=None, dtype: torch.dtype = torch.float32,
                  device: str | torch.device = "cpu", target_embedding: torch.Tensor | None = None) -> Eagle3Head:
    """A head from ``directory`` in any supported format (see the module docstring).

    target_config: the target's transformers config; needed when the checkpoint names no layer ids
    (EAGLE-3's default for its layer count), and checked against the head (vocabulary, hidden size,
    layer ids) when given. target_embedding (V, H): compared with a checkpoint's ``embed_tokens``
    (a warning when they differ: the head then runs on the target's embedding, as vLLM does).
    """
    directory = Path(directory)
    kind = head_format(directory)
    if kind == "native":
        head = load_head(directory, dtype=torch.float32)
    else:
        raw = _read_json(directory / CONFIG_FILE)
        config = (_config_from_speculators if kind == "speculators" else _config_from_eagle3)(raw, target_config, directory)
        head = _head_from_tensors(config, _read_tensors(directory), directory, target_embedding)
    if target_config is not None:
        check_head_matches_target(head.config, target_config)
    return head.to(device=device, dtype=dtype).eval()


def load_head_for_target(source: str | Path, target, dtype: torch.dtype | None = None,
                         device: str | torch.device | None = None) -> Eagle3Head:
    """The head named by ``source`` ('head', a head directory in any format, or a training run)
    for the transformers model ``target``: checked against its config and input embedding, in the
    target's dtype and device unless given (what ``draft="head"`` / ``--draft DIR`` need)."""
    weight = target.get_input_embeddings().weight
    return load_any_head(resolve_head_dir(source), target.config, dtype=dtype or weight.dtype,
                         device=device or weight.device, target_embedding=weight)


def check_head_matches_target(config: HeadConfig, target_config) -> None:
    """ConfigError unless the head's vocabulary, feature width and feature layer ids fit the target.

    target_config: the target's transformers config (a multimodal one is read through its decoder
    text config) or any object with vocab_size, hidden_size and num_hidden_layers. The one check of
    a head against its target: ``load_any_head`` and ``engine.head_drafter.HeadDrafter`` use it.
    """
    if hasattr(target_config, "get_text_config"):
        target_config = target_config.get_text_config(decoder=True)
    vocab = int(target_config.vocab_size)
    if config.vocab_size != vocab:
        raise ConfigError(
            f"head vocabulary {config.vocab_size} != target vocabulary {vocab}: the head was trained for another "
            "target; use a head trained for this target (`verispec train-head --target ...`)"
        )
    hidden = int(target_config.hidden_size)
    if config.target_hidden_size != hidden:
        raise ConfigError(f"head reads target features of width {config.target_hidden_size}, the target's hidden size "
                          f"is {hidden}: the head was trained for another target; use a head trained for this target")
    layers = int(target_config.num_hidden_layers)
    bad = [i for i in config.aux_layer_ids if not 0 <= i <= layers - 1]
    if bad:
        raise ConfigError(f"head feature layer ids {list(config.aux_layer_ids)} include {bad}, outside the target's "
                          f"layer inputs [0, {layers - 1}] (the target has {layers} layers): the head was trained "
                          "for another target; use a head trained for this target")


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ConfigError(f"{str(path)!r} is not valid JSON: {error}") from error


def _read_tensors(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        bins = sorted(directory.glob("pytorch_model*.bin"))
        if not bins:
            raise ConfigError(f"{str(directory)!r} has a {CONFIG_FILE} but no weights ({WEIGHTS_FILE} or pytorch_model.bin)")
        files = bins
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        part = load_file(str(path)) if path.suffix == ".safetensors" else torch.load(path, map_location="cpu", weights_only=True)
        for name, tensor in part.items():
            if name in tensors:
                raise ConfigError(f"tensor {name!r} appears in more than one weight file of {str(directory)!r}")
            tensors[name] = tensor
    return tensors


def _rope_theta(layer: dict, where: Path) -> float:
    """rope_theta of a LlamaConfig dict; ConfigError for any scaled RoPE (the head implements only
    the default rotary embedding)."""
    scaling = layer.get("rope_scaling")
    parameters = layer.get("rope_parameters")
    theta = layer.get("rope_theta")
    for spec in (scaling, parameters):
        if isinstance(spec, dict):
            kind = spec.get("rope_type", spec.get("type", "default"))
            if kind not in (None, "default"):
                raise ConfigError(
                    f"{str(where)!r}: rope scaling {spec} is not supported (verispec's head implements the default "
                    "rotary embedding only); this head cannot be run exactly"
                )
            theta = spec.get("rope_theta", theta)
        elif spec is not None:
            raise ConfigError(f"{str(where)!r}: unreadable rope settings {spec!r}")
    return float(theta if theta is not None else 10000.0)


def _common_layer_fields(layer: dict, where: Path) -> dict:
    """HeadConfig fields from a LlamaConfig-style dict, refusing what the head cannot compute."""
    try:
        hidden = int(layer["hidden_size"])
        heads = int(layer["num_attention_heads"])
        intermediate = int(layer["intermediate_size"])
        vocab = int(layer["vocab_size"])
    except KeyError as error:
        raise ConfigError(f"{str(where)!r}: the head config lacks {error.args[0]!r}") from error
    layers = int(layer.get("num_hidden_layers", 1))
    if layers != 1:
        raise ConfigError(f"{str(where)!r}: {layers} decoder layers; verispec's head has exactly one (EAGLE-3's midlayer)")
    activation = layer.get("hidden_act", "silu")
    if activation != "silu":
        raise ConfigError(f"{str(where)!r}: hidden_act {activation!r} is not supported (only 'silu')")
    for flag in ("attention_bias", "mlp_bias", "bias"):
        if layer.get(flag):
            raise ConfigError(f"{str(where)!r}: {flag} = true is not supported (the head's linear layers have no bias)")
    if layer.get("tie_word_embeddings"):
        raise ConfigError(f"{str(where)!r}: tie_word_embeddings = true (lm_head shared with the embedding) is not supported")
    return dict(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_attention_heads=heads,
        num_key_value_heads=int(layer.get("num_key_value_heads") or heads),
        head_dim=int(layer.get("head_dim") or hidden // heads),
        vocab_size=vocab,
        rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)),  # LlamaConfig's default
        rope_theta=_rope_theta(layer, where),
        max_position_embeddings=int(layer.get("max_position_embeddings", 2048)),
    )


def _default_layer_ids(target_config, where: Path) -> tuple[int, ...]:
    if target_config is None:
        raise ConfigError(
            f"{str(where)!r} names no feature layer ids; give the target (target_config, or --target on the "
            "command line): its layer count fixes EAGLE-3's default, the inputs of layers 2, N//2, N-3"
        )
    return default_aux_layer_ids(int(target_config.num_hidden_layers))


def _refuse_feature_norms(raw: dict, where: Path) -> None:
    """speculators' optional extra norms (0.9: norm_before_fc, fc_norm, norm_output) change the
    forward; the head has none of them."""
    meanings = {"norm_before_fc": "an RMSNorm over the concatenated features before fc",
                "fc_norm": "an RMSNorm on each feature before fc",
                "norm_output": "post-norm states fed back across draft steps"}
    for flag, meaning in meanings.items():
        if raw.get(flag):
            raise ConfigError(f"{str(where)!r}: {flag} = true ({meaning}) is not supported by verispec's head")


def _config_from_eagle3(raw: dict, target_config, where: Path) -> HeadConfig:
    fields = _common_layer_fields(raw, where)
    _refuse_feature_norms(raw, where)
    eagle = raw.get("eagle_config") or {}
    if eagle.get("use_aux_hidden_state") is False:
        raise ConfigError(f"{str(where)!r}: use_aux_hidden_state = false (an EAGLE-1-style head) is not supported")
    if eagle.get("eagle_aux_hidden_state_layer_ids"):
        aux = tuple(int(i) + 1 for i in eagle["eagle_aux_hidden_state_layer_ids"])  # SGLang: outputs of layer i
    elif raw.get("eagle_aux_hidden_state_layer_ids") or raw.get("aux_hidden_state_layer_ids"):
        # top-level ids: vLLM's convention (the input of layer i), as its config adapter reads them
        aux = tuple(int(i) for i in raw.get("eagle_aux_hidden_state_layer_ids") or raw["aux_hidden_state_layer_ids"])
    else:
        aux = _default_layer_ids(target_config, where)
    draft_vocab = raw.get("draft_vocab_size")
    return HeadConfig(
        **fields,
        draft_vocab_size=int(draft_vocab if draft_vocab is not None else fields["vocab_size"]),
        target_hidden_size=int(raw.get("target_hidden_size") or fields["hidden_size"]),
        aux_layer_ids=aux,
        norm_before_residual=bool(raw.get("norm_before_residual", False)),  # SGLang's layer: norm after residual
        extra=dict(raw.get("verispec_extra") or {}),
    )


def _config_from_speculators(raw: dict, target_config, where: Path) -> HeadConfig:
    layer = raw.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise ConfigError(f"{str(where)!r}: a speculators config needs a transformer_layer_config dictionary")
    fields = _common_layer_fields(layer, where)
    _refuse_feature_norms(raw, where)
    if "norm_before_residual" not in raw:
        raise ConfigError(
            f"{str(where)!r}: norm_before_residual is absent (vLLM assumes true, the speculators library false); "
            "add it to config.json explicitly"
        )
    ids = raw.get("eagle_aux_hidden_state_layer_ids") or raw.get("aux_hidden_state_layer_ids")
    aux = tuple(int(i) for i in ids) if ids else _default_layer_ids(target_config, where)
    draft_vocab = raw.get("draft_vocab_size")
    return HeadConfig(
        **fields,
        draft_vocab_size=int(draft_vocab if draft_vocab is not None else fields["vocab_size"]),
        target_hidden_size=int(raw.get("target_hidden_size") or fields["hidden_size"]),
        aux_layer_ids=aux,
        norm_before_residual=bool(raw["norm_before_residual"]),
        extra=dict(raw.get("verispec_extra") or {}),
    )


def _head_from_tensors(config: HeadConfig, tensors: dict[str, torch.Tensor], where: Path,
                       target_embedding: torch.Tensor | None) -> Eagle3Head:
    """Rename, validate and load ``tensors`` into an Eagle3Head of ``config``."""
    state: dict[str, torch.Tensor] = {}
    d2t = t2d = None
    for name, tensor in tensors.items():
        name = name.removeprefix("model.")
        if name.startswith("layers.0."):
            name = "midlayer." + name[len("layers.0."):]
        elif name.startswith("midlayers.0."):
            name = "midlayer." + name[len("midlayers.0."):]
        if name == "d2t":
            d2t = tensor
        elif name == "t2d":
            t2d = tensor
        elif name == "embed_tokens.weight":
            _check_embedding(tensor, config, where, target_embedding)
        elif name in _IGNORED_TENSORS:
            continue
        elif name == "fc.bias":
            if bool(tensor.ne(0).any()):
                raise ConfigError(f"{str(where)!r}: fc.bias is non-zero; the head's fc has no bias")
        elif name == "input_norm.weight":
            raise ConfigError(f"{str(where)!r}: input_norm.weight (norm_before_fc) is not supported")
        else:
            state[name] = tensor
    draft_to_target = _draft_vocabulary(config, d2t, t2d, where)
    order = torch.argsort(draft_to_target)
    if "lm_head.weight" in state and not torch.equal(order, torch.arange(len(order))):
        # a d2t listing target ids out of order: permute lm_head rows (same distribution, increasing ids)
        state["lm_head.weight"] = state["lm_head.weight"][order]
    head = Eagle3Head(config)
    head.set_draft_vocabulary(draft_to_target[order])
    expected = {name: tensor for name, tensor in head.state_dict().items() if name != "draft_to_target"}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ConfigError(f"{str(where)!r}: tensors missing {missing}, unexpected {unexpected} "
                          f"(expected {sorted(expected)} plus d2t / t2d)")
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise ConfigError(f"{str(where)!r}: tensor {name!r} has shape {tuple(tensor.shape)}, the config implies "
                              f"{tuple(expected[name].shape)}")
    # keep the checkpoint's floating dtype through the load (bit-exact round trips); the caller casts
    head = head.to(dtype=state["fc.weight"].dtype)
    head.load_state_dict({**state, "draft_to_target": head.draft_to_target}, strict=True)
    return head


def _draft_vocabulary(config: HeadConfig, d2t, t2d, where: Path) -> torch.Tensor:
    """(D,) target ids of the draft tokens from d2t offsets (checked against t2d when present)."""
    draft, vocab = config.draft_vocab_size, config.vocab_size
    if d2t is None:
        if draft != vocab:
            raise ConfigError(f"{str(where)!r}: draft_vocab_size {draft} < vocab_size {vocab} but the checkpoint has no d2t map")
        ids = torch.arange(vocab)
    else:
        if d2t.dtype.is_floating_point or d2t.dtype == torch.bool or tuple(d2t.shape) != (draft,):
            raise ConfigError(f"{str(where)!r}: d2t must be integer offsets of shape ({draft},), got {d2t.dtype} {tuple(d2t.shape)}")
        ids = torch.arange(draft) + d2t.to(torch.long)
        if int(ids.min()) < 0 or int(ids.max()) >= vocab:
            raise ConfigError(f"{str(where)!r}: d2t maps draft tokens outside the target vocabulary [0, {vocab})")
        if len(torch.unique(ids)) != draft:
            raise ConfigError(f"{str(where)!r}: d2t maps two draft tokens to one target token")
    if t2d is not None:
        if tuple(t2d.shape) != (vocab,):
            raise ConfigError(f"{str(where)!r}: t2d has shape {tuple(t2d.shape)}, expected ({vocab},)")
        expected = torch.zeros(vocab, dtype=torch.bool)
        expected[ids] = True
        if not torch.equal(t2d.to(torch.bool), expected):
            raise ConfigError(f"{str(where)!r}: t2d does not mark exactly the target ids d2t maps to")
    return ids


def _check_embedding(tensor: torch.Tensor, config: HeadConfig, where: Path, target_embedding) -> None:
    if tuple(tensor.shape) != (config.vocab_size, config.hidden_size):
        raise ConfigError(f"{str(where)!r}: embed_tokens.weight has shape {tuple(tensor.shape)}, expected "
                          f"({config.vocab_size}, {config.hidden_size}) (the target's embedding)")
    if target_embedding is not None:
        if tuple(target_embedding.shape) != tuple(tensor.shape):
            raise ConfigError(f"{str(where)!r}: embed_tokens.weight {tuple(tensor.shape)} does not match the target's "
                              f"embedding {tuple(target_embedding.shape)}")
        if not torch.allclose(tensor.float(), target_embedding.detach().float().cpu(), atol=1e-2, rtol=1e-2):
            warnings.warn(f"{where}: the checkpoint's embed_tokens differ from the target's; the head runs on the "
                          "target's embedding (as vLLM does when it shares them)", stacklevel=3)
