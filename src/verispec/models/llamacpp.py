"""A GGUF model run by llama.cpp behind the engine's adapter contract (docs/llamacpp.md).

``LlamaCppAdapter`` offers what ``models.hf.HFModelAdapter`` offers the engine (reset / extend /
score / rollback / commit / append_committed, ``vocab_size``, ``max_context``, ``committed_len``),
through llama-cpp-python's LOW-LEVEL API (``llama_cpp.llama_decode`` on a ``llama_batch``): the
high-level ``Llama`` class puts every token on one sequence and cannot score a tree.

The KV cache is llama.cpp's *unified* cache (``kv_unified``): one buffer whose cells carry a set
of sequence ids; a token attends to the cells that carry its first sequence id at positions up to
its own. A draft tree is laid out as one sequence per root-to-leaf path:

* sequence 0 is the committed text; it also carries the first path of every round, so plain
  decoding (a tree of one node) never touches another sequence;
* every other path gets the next free id; its cached ancestors (committed text included) are
  tagged with it by ``llama_memory_seq_cp``, which in a unified cache only adds the id to the
  cells' sets (no data is copied); a node shared by several paths is ONE batch entry carrying all
  their ids, at position ``committed_len + depth``;
* the whole tree is one ``llama_decode`` (split into ``n_batch`` chunks only beyond that size),
  with logits requested for the tree nodes only (committed tokens still pending ride along
  without logits).

Cells stay in position order. llama.cpp's attention is only exact when the cache's cells hold
increasing positions (measured with llama-cpp-python 0.3.36: a committed token whose cell lies
after the next token's gave logits off by up to 1.1 on the default target, with and without flash
attention, F16 or F32 cache). A tree's cells are written in node order, and a node's ancestors
always have smaller numbers, so inside a tree forward every visible cell is in order. Commit
therefore keeps the root and the longest start of the accepted path that is the chain of nodes
1, 2, ..., j (cells right after the root's; in particular the whole first path, which is sequence
0), frees every other cell (``llama_memory_seq_rm`` of sequence 0 beyond them, then
``llama_memory_seq_keep(0)``), and leaves the rest of the accepted path in the pending tail: it
is computed again, in order, inside the next round's forward (no extra ``llama_decode`` call).
Re-tagging the accepted cells instead (``seq_cp`` to sequence 0) would cost nothing but breaks
that order whenever the path skips a node. Rollback is the same ``seq_rm`` from the round's root.

Numerics: a forward of at most 63 tokens gives rows bit-identical to scoring each node alone
(``BATCH_INVARIANT_TOKENS``, measured on this build and CPU), so with cells in position order a
tree's rows equal plain decoding's exactly and greedy speculative output equals greedy plain
output token for token (tests/models/test_llamacpp.py). Longer round forwards are split. The
prompt's prefill (``reset``) runs in batches of up to ``PREFILL_BATCH`` tokens: it is the same for
plain and speculative decoding, so their rows still agree; a fresh prefill of a longer text
(prompt and generated tokens at once) may differ from them in the last bits. Flash
attention is llama.cpp's choice (on for CPUs); with it off the non-flash path is not
batch-invariant on the F16 cache.

Draft heads (EAGLE-3) read the target's hidden states, which this adapter does not return: they
are refused with a clear error.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from verispec.errors import ConfigError
from verispec.models.llamacpp_context import KV_TYPES, ContextSettings
from verispec.models.tree_round import ROOT, RoundState, check_commit_path, check_prompt, place_nodes

LLAMACPP_VERSION = "0.3.36"  # pinned in pyproject's ``llamacpp`` extra: its C API was renamed twice in a year
INSTALL_HINT = "pip install 'verispec[llamacpp]' (or `make setup-llamacpp`)"
# the low-level functions this adapter calls; a llama-cpp-python without them has another C API
REQUIRED_API = (
    "llama_model_load_from_file", "llama_init_from_model", "llama_get_memory", "llama_batch_init",
    "llama_decode", "llama_get_logits", "llama_memory_seq_rm", "llama_memory_seq_cp",
    "llama_memory_seq_keep", "llama_memory_clear", "llama_model_get_vocab", "llama_vocab_n_tokens",
)
DEFAULT_MAX_CONTEXT = 8192
# Forwards of at most 63 tokens give bit-identical rows whatever the batch (llama-cpp-python 0.3.36,
# CPU build, AMD EPYC Zen 4, Q4_1 default target: a node scored in a tree of 63 equals it scored
# alone); from 64 tokens on llama.cpp switches to other matrix kernels and rows move by up to ~3
# logits. Trees and the committed tokens riding along with them are therefore fed in chunks of 63,
# which keeps greedy speculative decoding token-for-token equal to plain decoding.
BATCH_INVARIANT_TOKENS = 63
# The prompt's prefill is the same in plain and speculative decoding, so it may use the large
# batches llama.cpp's prefill is fast with (llama.cpp's own default n_ubatch): the rows after it are
# then those of a fresh prefill of the same prompt, and every later forward stays below 64 tokens.
PREFILL_BATCH = 512
DEFAULT_SEQ_MAX = 64
# llama-cpp-python 0.3.36 built with GGML_NATIVE on an Intel Xeon with AMX (2026-11-26): with llama.cpp's
# extra weight buffers on (its default), the AMX buffer type repacks the Q4_1 / Q4_K weights of the
# default target and of Gemma 3 270M, and the first llama_decode then crashes the process
# (segmentation fault, in llama-cpp-python's own Llama too). The adapter keeps them off where the
# build reports AMX; elsewhere they stay on (the CPU repack gives the fast Q4_0 / Q4_K kernels).
AMX_FEATURE = "AMX_INT8 = 1"  # one sequence per root-to-leaf path (sequence 0 carries the first): the engine's K limit


def llamacpp_available() -> str | None:
    """None when llama-cpp-python can be imported, else why not (the reason tests skip with)."""
    if importlib.util.find_spec("llama_cpp") is None:
        return f"the llamacpp backend needs the optional llama-cpp-python package: {INSTALL_HINT}"
    return None


def import_llama_cpp():
    """The ``llama_cpp`` module, with its low-level API checked; a ConfigError saying how to install
    the pinned version otherwise."""
    reason = llamacpp_available()
    if reason is not None:
        raise ConfigError(reason)
    import llama_cpp

    missing = [name for name in REQUIRED_API if not hasattr(llama_cpp, name)]
    if missing:
        raise ConfigError(
            f"llama-cpp-python {getattr(llama_cpp, '__version__', '?')} lacks {', '.join(missing)} (its C API was "
            f"renamed); install the pinned version: pip install 'llama-cpp-python=={LLAMACPP_VERSION}' or {INSTALL_HINT}"
        )
    return llama_cpp


def default_extra_buffers(lib) -> bool:
    """Whether llama.cpp's extra (repacked) weight buffers are safe to use with this build: not
    where it reports AMX (see AMX_FEATURE)."""
    return AMX_FEATURE not in lib.llama_print_system_info().decode("utf-8", "replace")


def gguf_architecture(path: Path) -> str:
    """``general.architecture`` of a GGUF file, read from its header (the weights stay on disk).

    ConfigError when the file is missing or is not a GGUF file.
    """
    if not path.is_file():
        raise ConfigError(f"GGUF file {str(path)!r} does not exist; give the path of a .gguf model file")
    with path.open("rb") as handle:
        if handle.read(4) != b"GGUF":
            raise ConfigError(f"{str(path)!r} is not a GGUF file (no GGUF magic); give a .gguf model file")
    from gguf import GGUFReader

    try:
        field = GGUFReader(path).fields.get("general.architecture")
    except (ValueError, IndexError, OSError) as error:
        raise ConfigError(f"GGUF file {str(path)!r} is corrupt or truncated ({error}); re-download or re-convert it") from None
    if field is None:
        raise ConfigError(f"GGUF file {str(path)!r} has no general.architecture entry; it is not a model file")
    return bytes(field.parts[field.data[0]]).decode("utf-8", "replace")


def _known_architectures() -> set[str]:
    """Architectures the gguf package (the format's reference writer) names; llama.cpp knows about these."""
    from gguf.constants import MODEL_ARCH_NAMES

    return set(MODEL_ARCH_NAMES.values())


def is_gguf_source(model) -> bool:
    """Whether ``model`` names a GGUF file (a str or path ending in .gguf)."""
    return isinstance(model, (str, os.PathLike)) and str(model).lower().endswith(".gguf")


def gguf_of_target(name: str | os.PathLike | None) -> Path:
    """The GGUF file of a target name: None / "default" (the shipped SmolLM2-135M-Instruct Q4_1),
    "gemma3-270m" (the optional Gemma extra's Q4_K_M, assembled once into the cache), or a path."""
    if name is None or str(name) == "default":
        from verispec.models.default import GGUF_FILE, gguf_dir

        return gguf_dir() / GGUF_FILE
    if str(name) == "gemma3-270m":
        from verispec.models.gemma import gemma_gguf_path

        return gemma_gguf_path()
    path = Path(name).expanduser()
    if not is_gguf_source(path):
        raise ConfigError(
            f"backend 'llamacpp' runs GGUF files; {str(name)!r} is not a .gguf path (give a .gguf file, 'default' "
            "or 'gemma3-270m', or use backend 'auto' for a Hugging Face model directory)"
        )
    return path


def load_gguf_tokenizer(name: str | os.PathLike | None):
    """The Hugging Face tokenizer of a llama.cpp target (``gguf_of_target`` names), with its chat
    format: the default target's and Gemma's as their torch loaders give them, any other GGUF's
    read from the file by transformers."""
    if name is None or str(name) == "default":
        from verispec.models.default import load_default_tokenizer

        return load_default_tokenizer()
    from transformers import AutoTokenizer

    if str(name) == "gemma3-270m":
        return _gemma_tokenizer()
    path = gguf_of_target(name)
    gguf_architecture(path)  # a missing or non-GGUF file: a clear error before transformers reads it
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)


def _gemma_tokenizer():
    """Gemma 3 270M's tokenizer with its chat format. Reading it from the GGUF takes transformers
    ~45 s (262k tokens, measured on a loaded 2-core Xeon), so it is saved once beside the GGUF
    (``tokenizer/``) and read from there (or from the torch target's converted cache) later."""
    from transformers import AutoTokenizer

    from verispec.models.gemma import cache_dir, gemma_gguf_path, set_chat_format
    from verispec.models.loading import staged_directory

    path = gemma_gguf_path()
    saved = path.parent / "tokenizer"
    folder = next((f for f in (saved, cache_dir()) if (f / "tokenizer_config.json").is_file()), None)
    if folder is not None:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    else:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
        try:
            with staged_directory(saved) as staging:
                tokenizer.save_pretrained(staging)
        except OSError:  # another process saved it first, or the cache is read-only: read from the GGUF next time
            pass
    set_chat_format(tokenizer)
    return tokenizer


def load_llamacpp_adapter(model, backend: str = "llamacpp", **options) -> "LlamaCppAdapter":
    """A ``LlamaCppAdapter`` of a GGUF path or target name (``gguf_of_target``); ``options`` go to
    the adapter. A transformers model or another backend with a GGUF file is a ConfigError."""
    if backend not in ("auto", "llamacpp"):
        raise ConfigError(f"GGUF file {str(model)!r} runs on backend 'llamacpp' (or 'auto'), not {backend!r}")
    if model is not None and not isinstance(model, (str, os.PathLike)):
        raise ConfigError(
            f"backend 'llamacpp' runs GGUF files, not a {type(model).__name__}; give the target as a .gguf path, "
            "'default' or 'gemma3-270m', or use backend 'auto' for a transformers model"
        )
    return LlamaCppAdapter(gguf_of_target(model), **options)


class LlamaCppAdapter(RoundState):
    """A GGUF model run by llama.cpp, with the ``HFModelAdapter`` contract (see the module docstring).

    gguf_path: the .gguf file; n_ctx: context length in tokens (default: the model's training
    context, at most 8192); n_threads: CPU threads (default: torch's thread count, so that both
    backends run on the same threads); n_seq_max: sequence ids of the context = the widest
    tree (root-to-leaf paths) a round may score; n_batch: tokens per ``llama_decode`` of a round
    (larger trees are split; the default keeps every round's forward batch-invariant, see
    BATCH_INVARIANT_TOKENS); prefill_batch: tokens per ``llama_decode`` of the prompt's prefill
    (``reset``; PREFILL_BATCH: fast, and the same for plain and speculative decoding); kv_type: "f16" (llama.cpp's default) or "f32" KV cache;
    flash_attn: None (llama.cpp's choice: on for CPUs), True or False (float32 attention: with an
    F32 GGUF and kv_type "f32" the logits then equal torch's within ~1e-6, against ~3e-4 with it on);
    extra_buffers: llama.cpp's repacked weight buffers (None: on, except where the build has AMX,
    whose buffer crashes llama.cpp here, see AMX_FEATURE).
    """

    backend = "llamacpp"
    # the engine's cost-model prior (n, cost relative to one token): llama.cpp's quantized CPU
    # kernels make a forward's cost grow nearly linearly with its tokens (default target, 1 thread:
    # 1 / 1.8 / 3.0 / 5.1 / 9.6 for n = 1 / 2 / 4 / 8 / 16 on a Zen 4 CPU, 8.5 at n = 16 on an Intel
    # Xeon); the online model learns the machine's own curve from there
    cost_prior = ((1, 1.0), (2, 1.8), (4, 3.0), (8, 5.1), (16, 9.6))
    # the token trees' acceptance prior (AcceptanceEstimates.prior_scale): with forwards this
    # steep, a tree node pays only when it is accepted ~80% of the time, so a fresh decoder drafts
    # nothing until the shadow trials of its root-only rounds have shown a class is (docs/llamacpp.md)
    acceptance_prior_scale = 0.0
    # token trees rest after 2 root-only rounds and propose every 16th (engine.drafters.TokenTreeDrafter
    # ``rest``): a root-only round's candidate work is ~9% of a plain step here; chosen on the tuning
    # prompts (2/16 0.968x plain, 8/8 0.951x, 4/16 0.948x; benchmarks/llamacpp_prior.py --tuning)
    rest_after = 2
    rest_wake_every = 16
    features_supported = False  # no hidden states: draft heads are refused
    feature_layers = None

    def __init__(
        self,
        gguf_path: str | os.PathLike,
        n_ctx: int | None = None,
        n_threads: int | None = None,
        n_seq_max: int = DEFAULT_SEQ_MAX,
        n_batch: int = BATCH_INVARIANT_TOKENS,
        prefill_batch: int = PREFILL_BATCH,
        kv_type: str = "f16",
        flash_attn: bool | None = None,
        extra_buffers: bool | None = None,
    ):
        self._model = self._ctx = self._batch = None
        self._llama = import_llama_cpp()
        lib = self._llama
        self.path = Path(gguf_path).expanduser()
        self.architecture = gguf_architecture(self.path)
        if kv_type not in KV_TYPES:
            raise ConfigError(f"kv_type must be one of {', '.join(KV_TYPES)}, got {kv_type!r}")
        if not 1 <= int(n_seq_max) <= lib.llama_max_parallel_sequences():
            raise ConfigError(
                f"n_seq_max must lie in [1, {lib.llama_max_parallel_sequences()}] (llama.cpp's limit), got {n_seq_max}"
            )
        if int(n_batch) < 1 or int(prefill_batch) < 1:
            raise ConfigError(f"n_batch and prefill_batch must be >= 1, got {n_batch} and {prefill_batch}")
        threads = torch.get_num_threads() if n_threads is None else int(n_threads)
        if threads < 1:
            raise ConfigError(f"n_threads must be >= 1, got {n_threads}")
        self.n_threads = threads

        from llama_cpp import _logger

        _logger.set_verbose(False)  # llama.cpp's load chatter off; its errors still reach stderr
        lib.llama_backend_init()
        model_params = lib.llama_model_default_params()
        model_params.n_gpu_layers = 0
        model_params.use_extra_bufts = default_extra_buffers(lib) if extra_buffers is None else bool(extra_buffers)
        self.extra_buffers = bool(model_params.use_extra_bufts)
        self._model = lib.llama_model_load_from_file(str(self.path).encode(), model_params)
        if not self._model:
            if self.architecture not in _known_architectures():
                raise ConfigError(
                    f"llama.cpp cannot load {str(self.path)!r}: unknown architecture {self.architecture!r}; "
                    "use a GGUF of an architecture llama.cpp supports, or backend 'auto' with a Hugging Face model"
                )
            raise ConfigError(
                f"llama.cpp could not load {str(self.path)!r} (architecture {self.architecture!r}; its error is "
                f"printed above): the file is corrupt, incomplete, or needs a newer llama.cpp than {LLAMACPP_VERSION}"
            )
        train_context = int(lib.llama_model_n_ctx_train(self._model))
        context = min(train_context, DEFAULT_MAX_CONTEXT) if n_ctx is None else int(n_ctx)
        if not 1 < context <= max(train_context, 2):
            raise ConfigError(f"n_ctx must lie in [2, {train_context}] (the model's training context), got {n_ctx}")
        round_batch = min(int(n_batch), context)
        self.settings = ContextSettings.choose(context, round_batch, int(prefill_batch), int(n_seq_max), threads, kv_type, flash_attn)
        params = lib.llama_context_default_params()
        self.settings.fill(lib, params)
        self.context_params = params  # copied by a batch's shared context (models.llamacpp_batch)
        self._ctx = lib.llama_init_from_model(self._model, params)
        if not self._ctx:
            raise ConfigError(
                f"llama.cpp could not create a context of {context} tokens for {str(self.path)!r} (its error is "
                "printed above); use a smaller n_ctx"
            )
        self._memory = lib.llama_get_memory(self._ctx)
        self.vocab_size: int = int(lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self._model)))
        # llama.cpp rounds its cache up (to 256 cells); positions stay within the context asked for
        self.max_context: int = min(context, int(lib.llama_n_ctx(self._ctx)))
        vocab = lib.llama_model_get_vocab(self._model)
        # the GGUF's end-of-sequence / end-of-turn tokens (-1 when absent), joined to the tokenizer's EOS
        self.eos_token_ids = tuple(sorted({int(t) for t in (lib.llama_vocab_eos(vocab), lib.llama_vocab_eot(vocab)) if t >= 0}))
        self.n_seq_max = int(n_seq_max)
        self.n_batch = round_batch
        self.prefill_batch = min(int(prefill_batch), context)
        self._batch = lib.llama_batch_init(self.prefill_batch, 0, self.n_seq_max)
        self._cached_len = 0  # committed tokens whose cells are in the cache (sequence 0)
        self._tokens: list[int] = []  # committed tokens, pending root last
        self._clear_tree()

    # ----------------------------------------------------------------- state

    def set_threads(self, n_threads: int) -> None:
        """Run later forwards on ``n_threads`` CPU threads."""
        self.n_threads = int(n_threads)
        self._llama.llama_set_n_threads(self._ctx, self.n_threads, self.n_threads)

    def _clear_tree(self) -> None:
        self._node_tokens: list[int] = []
        self._node_parents: list[int] = []
        self._node_depths: list[int] = []
        self._node_ancestors: list[list[int]] = []
        self._node_seq: list[int] = []  # one sequence id whose path runs through the node
        self._has_children: list[bool] = []
        self._seq_tip: dict[int, int] = {}  # sequence id -> deepest node on it
        self._next_seq = 1

    # -------------------------------------------------------------- features

    def enable_features(self, layer_ids) -> None:
        raise ConfigError(
            "the llamacpp backend does not return hidden states, which draft heads read; use backend 'auto', "
            "'native' or 'transformers' with a head, or another draft (tree, ngram, a draft model)"
        )

    def disable_features(self) -> None:
        pass

    # ------------------------------------------------------------- llama.cpp

    def _decode(self, tokens: Sequence[int], positions: Sequence[int], seqs: Sequence[Sequence[int]], logits: Sequence[bool],
                chunk: int | None = None) -> np.ndarray:
        """One logical ``llama_decode`` over the entries (in chunks of ``chunk``, default n_batch);
        the float32 logits of the entries with ``logits`` set, in order, (n, V)."""
        lib, batch = self._llama, self._batch
        chunk = chunk or self.n_batch
        rows = []
        for start in range(0, len(tokens), chunk):
            end = min(start + chunk, len(tokens))
            outputs = 0
            for i in range(start, end):
                j = i - start
                batch.token[j] = tokens[i]
                batch.pos[j] = positions[i]
                ids = seqs[i]
                batch.n_seq_id[j] = len(ids)
                seq_slot = batch.seq_id[j]
                for k, seq in enumerate(ids):
                    seq_slot[k] = seq
                batch.logits[j] = bool(logits[i])
                outputs += bool(logits[i])
            batch.n_tokens = end - start
            status = lib.llama_decode(self._ctx, batch)
            if status != 0:
                raise ConfigError(
                    f"llama_decode failed with status {status} on {end - start} tokens (1: no room in the "
                    f"context of {self.max_context} tokens, -1: invalid batch); use a shorter prompt or a smaller tree"
                )
            if outputs:
                pointer = lib.llama_get_logits(self._ctx)
                rows.append(np.ctypeslib.as_array(pointer, shape=(outputs, self.vocab_size)).copy())
        if not rows:
            return np.zeros((0, self.vocab_size), dtype=np.float32)
        return rows[0] if len(rows) == 1 else np.concatenate(rows)

    def _tag(self, source: int, target: int, end: int) -> None:
        """Add sequence ``target`` to the cells of ``source`` at positions < end (no data copied)."""
        self._llama.llama_memory_seq_cp(self._memory, source, target, -1, end)

    def _drop_from(self, position: int) -> None:
        """Free every cell at ``position`` and beyond, and every sequence other than 0."""
        self._llama.llama_memory_seq_rm(self._memory, 0, position, -1)
        if self._next_seq > 1:
            self._llama.llama_memory_seq_keep(self._memory, 0)

    # ------------------------------------------------------------------- API

    def reset(self, prompt_ids: Sequence[int]) -> None:
        """Start a sequence: prefill prompt_ids[:-1]; prompt_ids[-1] becomes the pending root."""
        prompt = check_prompt(prompt_ids, self.max_context)
        self._check_tokens(prompt)
        self._llama.llama_memory_clear(self._memory, True)
        self._tokens = prompt
        self._cached_len = 0
        self._clear_tree()
        if len(prompt) > 1:
            body = prompt[:-1]
            self._decode(body, range(len(body)), [(0,)] * len(body), [False] * len(body), chunk=self.prefill_batch)
            self._cached_len = len(body)

    def _check_tokens(self, tokens: Sequence[int]) -> None:
        bad = [t for t in tokens if not 0 <= t < self.vocab_size and t != -1]
        if bad:
            raise ConfigError(
                f"token ids {bad[:5]} lie outside [0, {self.vocab_size}), the vocabulary of {self.path.name}; "
                "encode with this model's tokenizer"
            )

    def extend(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """Append tree nodes and return their next-token logits, (len(tokens), V) float32 CPU, in
        ONE forward (see ``HFModelAdapter.extend`` for the node numbering)."""
        if len(tokens) == len(parents) == 0:
            return torch.empty(0, self.vocab_size)
        first = self.num_nodes
        tokens, parents, depths, ancestors = place_nodes(
            tokens, parents, first, self._tokens[-1], lambda node: (self._node_depths[node], self._node_ancestors[node])
        )
        self._check_tokens(tokens)
        deepest = self.committed_len + max(depths)
        if deepest >= self.max_context:
            raise ConfigError(
                f"position {deepest} exceeds the llama.cpp context of {self.max_context} tokens; use a shorter "
                "prompt or fewer max_new_tokens / a shallower draft, or a larger n_ctx"
            )
        tail = self._tokens[self._cached_len : -1] if first == ROOT else []
        positions = list(range(self._cached_len, self.committed_len)) + [self.committed_len + d for d in depths]
        wanted = [False] * len(tail) + [True] * len(tokens)
        try:
            entry_seqs = self._assign_sequences(first, parents, ancestors, tail_entries=len(tail))
            logits = self._decode(tail + tokens, positions, entry_seqs, wanted)
        except ConfigError:  # the whole round is dropped, with its sequence tags and any chunk already decoded
            self._drop_from(self._cached_len)
            self._clear_tree()
            raise
        self._cached_len += len(tail)
        self._node_tokens += tokens
        self._node_parents += parents
        self._node_depths += depths
        self._node_ancestors += ancestors
        return torch.from_numpy(logits)

    def _assign_sequences(self, first: int, parents: list[int], ancestors: list[list[int]], tail_entries: int) -> list[list[int]]:
        """Sequence ids of every batch entry (tail entries first, then the new nodes).

        A node continues its parent's sequence when the parent is the tip of it (no child yet);
        otherwise it opens a new sequence: the parent's cached ancestors are tagged with it now
        (``_tag``) and the new entries on its root path carry it in the batch.
        """
        tail = [[0] for _ in range(tail_entries)]
        entries: list[list[int]] = []
        for i, parent in enumerate(parents):
            node = first + i
            self._has_children.append(False)
            if node == ROOT:
                seq = 0
            else:
                parent_seq = self._node_seq[parent]
                if not self._has_children[parent] and self._seq_tip[parent_seq] == parent:
                    seq = parent_seq
                else:
                    # cached cells of the parent's sequence up to the parent's position (depth len - 2)
                    seq = self._open_sequence(parent_seq, self.committed_len + len(ancestors[i]) - 1)
                    for ancestor in ancestors[i][:-1]:
                        if ancestor >= first:
                            entries[ancestor - first].append(seq)
                    for entry in tail:
                        entry.append(seq)
                self._has_children[parent] = True
            self._node_seq.append(seq)
            self._seq_tip[seq] = node
            entries.append([seq])
        return tail + entries

    def _open_sequence(self, parent_seq: int, end: int) -> int:
        """A new sequence id sharing the cached cells of ``parent_seq`` at positions < end."""
        seq = self._next_seq
        if seq >= self.n_seq_max:
            raise ConfigError(
                f"the draft tree has more than {self.n_seq_max} root-to-leaf paths, the sequence limit of this "
                f"llama.cpp context (n_seq_max={self.n_seq_max}); use a narrower tree or create the adapter with a "
                f"larger n_seq_max (at most {self._llama.llama_max_parallel_sequences()})"
            )
        self._next_seq += 1
        self._tag(parent_seq, seq, end)
        return seq

    def score(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """Drop this round's speculative nodes, then ``extend`` from the root (one forward)."""
        self.rollback()
        return self.extend(tokens, parents)

    def rollback(self) -> None:
        """Drop this round's speculative tree (root included); the committed state is unchanged."""
        if self.num_nodes:
            self._drop_from(self.committed_len)
            self._clear_tree()

    def commit(self, path: Sequence[int], next_token: int) -> None:
        """Commit the root and the nodes of ``path``, then make ``next_token`` the pending root.

        The cache keeps the root and the longest start of the path that is the chain of nodes
        1, 2, ..., j (their cells directly follow the root's, in position order); every other cell
        is freed, and the rest of the path waits in the pending tail, computed by the next forward
        (see the module docstring: llama.cpp's attention needs cells in position order).
        """
        path = check_commit_path(path, self.num_nodes, self._node_parents)
        if not self.num_nodes:
            self._tokens.append(int(next_token))
            return
        kept = 0
        while kept < len(path) and path[kept] == kept + 1:
            kept += 1
        end = self.committed_len + kept + 1
        self._drop_from(end)
        self._tokens += [self._node_tokens[n] for n in path] + [int(next_token)]
        self._cached_len = end
        self._clear_tree()

    def append_committed(self, tokens: Sequence[int], next_token: int) -> None:
        """Commit the pending root, then ``tokens`` (never scored), then make ``next_token`` the
        root; the new tokens are computed by the next forward."""
        tokens = [int(t) for t in tokens]
        if self.num_nodes:
            self._drop_from(self.committed_len + 1)
            self._cached_len = self.committed_len + 1
            self._clear_tree()
        self._tokens += tokens + [int(next_token)]

    # --------------------------------------------------------------- cleanup

    def close(self) -> None:
        """Free the llama.cpp batch, context and model (also done when the adapter is collected)."""
        lib = getattr(self, "_llama", None)
        if lib is None:
            return
        shared = self.__dict__.pop("shared_batch", None)  # a batch context on this model (models.llamacpp_batch) goes first
        if shared is not None:
            shared.close_context()
        if self._batch is not None:
            lib.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            lib.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            lib.llama_model_free(self._model)
            self._model = None

    def __del__(self):
        self.close()
