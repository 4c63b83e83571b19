"""The benchmark sweep: methods x datasets x K x L x temperature x seeds for one target/draft pair.

For every dataset x temperature x seed, the plain-decoding baseline ``ar`` decodes the prompts
first, then every method x K x L configuration on the same prompts with the same
max_new_tokens and sampling parameters, so speedups compare runs of the same process
(``verispec.bench.metrics``). Prompt ``i`` decodes with seed ``seed * 1_000_000 + i`` in every
configuration. Chain-only methods (``sd``, ``bv``, ``gbv-mod``, ``sprinter``) skip K > 1, and
configurations the engine refuses (its ``ConfigError``) are skipped with the engine's reason.
A short warm-up of every configuration keeps first-call allocations out of the timings.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from verispec.bench.anchor import HF_ASSISTED, HF_PLAIN, anchor_record
from verispec.bench.config import BenchConfig
from verispec.bench.datasets import Dataset, load_dataset
from verispec.bench.metrics import BASELINE, PromptRecord, SummaryRow, config_label, summarize
from verispec.bench.replay import TREES_DIR, TreeRecorder
from verispec.core.tree import DraftScheme
from verispec.engine.decoder import SpeculativeDecoder, _as_adapter, draft_backend
from verispec.errors import ConfigError
from verispec.models.default import fast_dtype_name
from verispec.verify.registry import get_method

WARMUP_TOKENS = 4


@dataclass(frozen=True)
class RunSpec:
    """One speculative configuration of the sweep (temperature and seed vary around it)."""

    method: str
    num_drafts: int
    draft_len: int


@dataclass(frozen=True)
class SkippedConfig:
    method: str
    num_drafts: int
    draft_len: int
    reason: str


@dataclass
class SweepResult:
    """Everything the reports need: the per-prompt records, the summary rows, what was skipped."""

    config: BenchConfig
    records: list[PromptRecord]
    rows: list[SummaryRow]
    skipped: list[SkippedConfig]
    datasets: list[Dataset]
    meta: dict = field(default_factory=dict)
    recordings: list[Path] = field(default_factory=list)


def prompt_seed(seed: int, index: int) -> int:
    """Seed of prompt ``index`` under sweep seed ``seed`` (the same in every configuration)."""
    return int(seed) * 1_000_000 + int(index)


def _is_neural(draft) -> bool:
    from verispec.engine.head_drafter import is_head_source  # a draft head is built by the decoder, on the target
    from verispec.models.llamacpp import is_gguf_source

    if is_gguf_source(draft):  # a GGUF draft model, opened once on llama.cpp
        return True
    return draft is not None and not isinstance(draft, str) and not hasattr(draft, "begin_round") and not is_head_source(draft)


class Sweep:
    """Runs one BenchConfig on a loaded target (HF model or adapter), tokenizer and draft
    (``"ngram"``, an HF model / adapter, or any Drafter)."""

    def __init__(self, config: BenchConfig, target, tokenizer, draft="ngram", datasets: Sequence[Dataset] | None = None):
        self.config = config
        self.target = _as_adapter(target, backend=config.backend)
        self.tokenizer = tokenizer
        self.draft = _as_adapter(draft, backend=draft_backend(config.backend, draft)) if _is_neural(draft) else draft
        if config.anchor and not _is_neural(draft):
            raise ConfigError(
                "--anchor compares with transformers' assisted generation, which needs a neural draft: "
                "give --draft DIR (a Hugging Face model directory sharing the target's vocabulary)"
            )
        if config.anchor and "llamacpp" in (getattr(self.target, "backend", None), getattr(self.draft, "backend", None)):
            raise ConfigError(
                "--anchor runs transformers' own generate on the torch target and draft, and a model on the llamacpp "
                "backend has none; drop --anchor (benchmarks/backends.py compares with llama-cpp-python's own "
                "generation), or give model directories with --backend auto"
            )
        self.datasets = list(datasets) if datasets is not None else [load_dataset(spec, config.limit) for spec in config.dataset]
        self.eos_ids = sorted(self._eos_ids())
        self.specs, self.skipped = self._plan()

    def _eos_ids(self) -> set[int]:
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if eos is None:
            return set()
        return {int(eos)} if isinstance(eos, int) else {int(e) for e in eos}

    # ----- planning --------------------------------------------------------------------------
    def _decoder(self, method: str, num_drafts: int = 1, draft_len: int = 1, temperature: float = 0.0, callback=None):
        config = self.config
        return SpeculativeDecoder(
            self.target, None if method == BASELINE else self._draft_for(method), tokenizer=self.tokenizer,
            method=method, num_drafts=num_drafts, draft_len=draft_len, temperature=temperature,
            top_k=config.top_k, top_p=config.top_p, max_new_tokens=config.max_new_tokens,
            eos_token_id=self.eos_ids, step_callback=callback,
        )

    def _draft_for(self, method: str):
        """The configured draft; with none configured, token trees for q-free rules (their
        tree_scheme is deterministic) and the n-gram draft for every other rule."""
        if self.draft is not None:
            return self.draft
        return "tree" if get_method(method).tree_scheme is DraftScheme.DETERMINISTIC else "ngram"

    def _plan(self) -> tuple[list[RunSpec], list[SkippedConfig]]:
        methods = list(self.config.methods)
        if self.config.anchor and "sd" not in methods:
            methods.append("sd")  # the anchor table puts verispec's sd beside transformers' assisted generation
        specs, skipped = [], []
        for method in methods:
            for num_drafts in self.config.K:
                for draft_len in self.config.L:
                    if get_method(method).draft == "chain" and num_drafts > 1:
                        skipped.append(SkippedConfig(method, num_drafts, draft_len, f"{method} verifies a single draft path (chain-only): K > 1 skipped"))
                        continue
                    try:
                        self._decoder(method, num_drafts, draft_len, self.config.temperatures[0])
                    except ConfigError as error:
                        skipped.append(SkippedConfig(method, num_drafts, draft_len, str(error)))
                        continue
                    specs.append(RunSpec(method, num_drafts, draft_len))
        return specs, skipped

    def encode(self, dataset: Dataset) -> list[list[int]]:
        from verispec.models.default import encode_prompt

        return [encode_prompt(self.tokenizer, prompt.text, chat=self.config.chat) for prompt in dataset.prompts]

    @property
    def anchor_lens(self) -> list[int]:
        return list(self.config.L) if self.config.anchor else []

    def total_generations(self, prompt_counts: Sequence[int]) -> int:
        anchors = 1 + len(self.anchor_lens) if self.anchor_lens else 0  # hf-generate once, hf-assisted per L
        per_prompt = 1 + len(self.specs) + anchors
        return sum(prompt_counts) * len(self.config.temperatures) * len(self.config.seeds) * per_prompt

    # ----- running ---------------------------------------------------------------------------
    def warmup(self, prompt_ids: list[int]) -> None:
        """A few tokens of every configuration: first-call allocations stay out of the timings."""
        for spec in [RunSpec(BASELINE, 1, 1), *self.specs]:
            decoder = self._decoder(spec.method, spec.num_drafts, spec.draft_len, self.config.temperatures[0])
            decoder.max_new_tokens = min(WARMUP_TOKENS, self.config.max_new_tokens)
            decoder.generate(prompt_ids)
        for draft_len in self.anchor_lens[:1]:
            for method in (HF_PLAIN, HF_ASSISTED):
                self._anchor(method, prompt_ids, "warmup", "warmup", "warmup", 0.0, 0, draft_len, WARMUP_TOKENS)

    def _anchor(self, method, prompt_ids, dataset, category, prompt_id, temperature, seed, draft_len,
                max_new_tokens=None, rng_seed=None):
        return anchor_record(
            method, self.target.model, prompt_ids, dataset=dataset, category=category, prompt_id=prompt_id,
            temperature=temperature, seed=seed, rng_seed=rng_seed, draft_model=self.draft.model, draft_len=draft_len,
            top_k=self.config.top_k, top_p=self.config.top_p,
            max_new_tokens=max_new_tokens or self.config.max_new_tokens, eos_ids=self.eos_ids, tokenizer=self.tokenizer,
        )

    def _decode_prompts(self, decoder, dataset, encoded, temperature, seed, progress, recorder=None) -> list[PromptRecord]:
        records = []
        for index, (prompt, ids) in enumerate(zip(dataset.prompts, encoded)):
            decoder.seed = prompt_seed(seed, index)
            if recorder is not None:
                recorder.current_prompt = prompt.prompt_id
            output = decoder.generate(ids)
            records.append(PromptRecord.from_output(output, dataset.name, prompt.category, prompt.prompt_id, temperature, seed))
            progress.update(1)
        return records

    def run(self) -> SweepResult:
        from tqdm import tqdm

        config = self.config
        encoded = [self.encode(dataset) for dataset in self.datasets]
        records: list[PromptRecord] = []
        recordings: list[Path] = []
        started = time.time()
        if config.warmup:
            self.warmup(encoded[0][0])
        total = self.total_generations([len(e) for e in encoded])
        with tqdm(total=total, desc="verispec bench", unit="gen", disable=not config.progress, dynamic_ncols=True) as progress:
            for dataset, prompts in zip(self.datasets, encoded):
                for temperature in config.temperatures:
                    for seed in config.seeds:
                        progress.set_postfix_str(f"{dataset.name} ar T={temperature:g} seed={seed}")
                        baseline = self._decoder(BASELINE, temperature=temperature)
                        records += self._decode_prompts(baseline, dataset, prompts, temperature, seed, progress)
                        for spec in self.specs:
                            label = config_label(spec.method, spec.num_drafts, spec.draft_len, temperature)
                            progress.set_postfix_str(f"{dataset.name} {label} seed={seed}")
                            recorder = TreeRecorder(config.record_limit, config.record_per_prompt) if config.record else None
                            decoder = self._decoder(spec.method, spec.num_drafts, spec.draft_len, temperature,
                                                    recorder.callback if recorder else None)
                            records += self._decode_prompts(decoder, dataset, prompts, temperature, seed, progress, recorder)
                            if recorder is not None:
                                name = f"{dataset.name}__{label}-s{seed}"
                                meta = {"label": name, "dataset": dataset.name, "method": spec.method, "K": spec.num_drafts,
                                        "L": spec.draft_len, "temperature": temperature, "seed": seed, "tree": None,
                                        "top_k": config.top_k, "top_p": config.top_p, "draft": str(self._draft_for(spec.method)),
                                        "per_prompt": config.record_per_prompt}
                                path = recorder.save(Path(config.out) / TREES_DIR / f"{name}.npz", meta)
                                if path is not None:
                                    recordings.append(path)
                        for draft_len in self.anchor_lens:
                            for method in (HF_PLAIN, HF_ASSISTED):
                                if method == HF_PLAIN and draft_len != self.anchor_lens[0]:
                                    continue  # plain generate does not depend on L
                                progress.set_postfix_str(f"{dataset.name} {method} L={draft_len} seed={seed}")
                                for index, (prompt, ids) in enumerate(zip(dataset.prompts, prompts)):
                                    records.append(self._anchor(method, ids, dataset.name, prompt.category, prompt.prompt_id,
                                                                temperature, seed, draft_len, rng_seed=prompt_seed(seed, index)))
                                    progress.update(1)
        methods = [m for m in dict.fromkeys(s.method for s in self.specs)] + ([HF_PLAIN, HF_ASSISTED] if config.anchor else [])
        meta = self.meta(started)
        return SweepResult(config, records, summarize(records, methods), self.skipped, self.datasets, meta, recordings)

    def meta(self, started: float) -> dict:
        import torch
        import transformers

        return {
            "target": self.config.target or _describe(getattr(self.target, "model", self.target)),
            "draft": self.config.draft or (self.draft if isinstance(self.draft, str) else
                                           "auto (tree for q-free methods, else ngram)" if self.draft is None else
                                           _describe(getattr(self.draft, "model", self.draft))),
            "dtype": fast_dtype_name(device=self.config.device or "cpu") if self.config.dtype == "auto" else self.config.dtype,
            "device": self.config.device,
            "backend": {"target": self.target.backend,
                        "draft": getattr(self.draft, "backend", "ngram" if isinstance(self.draft, str) else "n/a")},
            "torch_threads": torch.get_num_threads(),
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
            "seconds": round(time.time() - started, 1),
            "datasets": {d.name: {"source": d.source, "prompts": len(d.prompts), "categories": d.categories} for d in self.datasets},
            "config": asdict(self.config),
        }


def _describe(model) -> str:
    """A model's name for the report: its path if it has one, else its class and size."""
    name = getattr(getattr(model, "config", None), "_name_or_path", "")
    if name:
        return str(name)
    try:
        params = sum(p.numel() for p in model.parameters())
        return f"{type(model).__name__} ({params / 1e6:.2f}M parameters)"
    except AttributeError:
        return type(model).__name__


def run_sweep(config: BenchConfig, target, tokenizer, draft="ngram", datasets: Sequence[Dataset] | None = None) -> SweepResult:
    """Run the sweep of ``config`` (see ``Sweep``)."""
    return Sweep(config, target, tokenizer, draft, datasets).run()
