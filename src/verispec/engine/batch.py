"""Batched speculative decoding: B sequences, one target forward per round (DESIGN.md §4).

``BatchDecoder(decoder).generate(prompts, ...)`` (or ``SpeculativeDecoder.generate_batch``) decodes
several prompts together. Each sequence is decoded by its OWN ``SpeculativeDecoder``: its own rule
state, ``Rng`` (seed), sampling parameters, stop condition, modification windows and drafter, and a
target adapter (``HFModelAdapter``) whose runner is one slot of a shared
``models.batch_runner.BatchedLlamaRunner``. The only thing the sequences share is the target
forward: when a sequence's adapter calls its runner, the request is queued and the sequence
pauses; once every sequence of the batch has queued its request (or finished), one forward runs
for all of them and each resumes with its own logits.

Why per-sequence decoders driven in turn rather than a second, batched copy of the round loop:
the rounds (plain, sampled drafts with every rule, token trees + q-free), the context limit, the
stop conditions and the stats are the single-sequence engine's own code, so a sequence in a batch
runs exactly the code it runs alone and changes to that loop apply to both. The sequences run as
threads that hand a single turn to each other in a fixed order (sequence 0, 1, ..., then the
forward), so only one runs at a time and the run is deterministic: a seed gives the same text
on every run. Threads are only the mechanism to pause a sequence inside its adapter's forward.

Per sequence, a decoded sequence's law equals its law decoded alone (each rule is exact for any
draft chosen from past information, and the batched forward computes each row's own function:
exactly in float64, to float rounding in fp32; tests/engine/test_batch_engine.py). Sequences
join and leave: at most ``max_batch`` decode at once, the others wait and join as sequences
finish. A batch of one sequence (one prompt, or ``max_batch`` 1) without a budget runs the
single-sequence path itself (the decoder's own adapter and runner, no threads): it costs what
``generate`` costs. A sequence whose input is bad (empty prompt, ids outside the vocabulary, a prompt longer
than the context) ends with stop_reason "error" and its message; the others still finish. A
sequence reaching the context limit stops with "context" as it would alone.

Drafts: the token trees (each sequence its own copy of the decoder's drafter, sharing its
adjacency table and acceptance estimates), the n-gram draft, a draft model and an EAGLE-3 head. A
draft model runs like the target: a second ``BatchedLlamaRunner`` over the draft's native runner,
each sequence's draft adapter on one of its slots. A head reads the target's hidden states: each
sequence's target slot returns its own rows of them from the batched forward, and its head steps
are queued like forwards and run as one padded head call (``models.head_batch``). A sequence pauses
at whichever forward it queues; once every sequence is paused, the draft forwards (draft model or
head) run first for those waiting on one (the others keep waiting at the target), again until no
sequence waits on a draft, and only then the target forward: a sequence drafting a shorter chain
simply waits at the target while the others draft on. The draft forwards of a round are timed
inside the round's overhead, which the batch cost model learns per total of scored tokens, so the
budget prices a chain's draft tokens with its target tokens.

Timing: a sequence's ``seconds`` is the batch's wall time until it finished, and each step's ``target_seconds`` the wall time its forward took including the turns of the other
sequences of that round.

Per-round budget (``engine.batch_budget``): by default the batch's own cost model for the batched
forward (``SpeculativeDecoder.batch_cost_model``: total scored tokens -> seconds) decides how many
tree nodes each sequence drafts: every sequence offers its best-first candidates, and the batch
keeps the global prefix with the most expected tokens per predicted second
(``split_scored_tokens``); the decision goes into each step's ``policy.batch``. This takes one more
turn per sequence and round: a sequence pauses once with its offer, once at its forward.
``budget`` (a ``BudgetPolicy``, e.g. ``EvenSplit``) instead caps each sequence's tree and lets
its drafter size it alone.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from verispec.core.rng import Rng
from verispec.engine.batch_budget import (  # noqa: F401  (re-exported: the batch's budget API)
    BatchRoundDecision,
    BudgetPolicy,
    EvenSplit,
    SequenceView,
    drafter_choice,
    split_scored_tokens,
)
from verispec.engine.checks import check_max_new_tokens, check_stop_strings
from verispec.engine.cost_model import OnlineCostModel
from verispec.engine.results import GenerationOutput
from verispec.engine.drafters import ModelDrafter, NGramDrafter, TokenTreeDrafter
from verispec.engine.head_drafter import HeadDrafter
from verispec.errors import ConfigError
from verispec.models.batch_runner import BatchedLlamaRunner, SlotRunner
from verispec.models.head_batch import BatchedHeadSteps
from verispec.models.hf import HFModelAdapter
from verispec.models.token_tree import SuffixIndex


@dataclass
class BatchGenerationOutput(GenerationOutput):
    """``GenerationOutput`` of one sequence of a batch; ``error`` holds the message of a sequence
    that could not be decoded (stop_reason "error"), None otherwise."""

    error: str | None = None

    def to_dict(self) -> dict:
        return {**super().to_dict(), "error": self.error}


@dataclass
class _Sequence:
    """One sequence of the batch: its decoder, its thread and the turn handed to it."""

    index: int
    prompt: object
    decoder: Any = None  # this sequence's own SpeculativeDecoder
    rng: Rng | None = None
    slot: SlotRunner | None = None
    draft_slot: SlotRunner | None = None  # its slot of the batched draft runner (a draft model)
    waits_on: str | None = None  # "target", "draft" or "head": the queue whose flush it waits for
    thread: threading.Thread | None = None
    turn: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    done: bool = False
    output: GenerationOutput | None = None
    error: str | None = None
    exception: BaseException | None = None
    max_nodes: int | None = None  # the token-tree drafter's own limit, restored after a budgeted round
    offer: Any = None  # its candidates' expected tokens, best first, while it waits for the budget's decision
    share: tuple[int, BatchRoundDecision] | None = None  # the budget's answer: (tree nodes, decision)


class _Aborted(Exception):
    """Raised inside a paused sequence when the batch stops because of an unexpected error."""


def _per_sequence(values, count: int, name: str) -> list:
    """``values`` as a list of ``count`` (one value for all, or one per prompt)."""
    if values is None or isinstance(values, (int, float, str)) or not isinstance(values, Sequence):
        return [values] * count
    values = list(values)
    if len(values) != count:
        raise ConfigError(f"{name} has {len(values)} entries for {count} prompts; give one per prompt or a single value")
    return values


def token_tree_copy(drafter: TokenTreeDrafter) -> TokenTreeDrafter:
    """A token-tree drafter with its own context index, plain-round streak and round state that
    shares ``drafter``'s adjacency table and acceptance estimates: they describe the target and
    learn from every sequence of a batch, one sequence at a time, as ``generate`` learns from every
    prompt."""
    own = copy.copy(drafter)
    own.index = SuffixIndex(drafter.index.max_match, drafter.index.max_scan)
    own.probes = dataclasses.replace(drafter.probes, plain_streak=0)
    own.rest = dataclasses.replace(drafter.rest, quiet=0, rested=0)
    own.rate = copy.copy(drafter.rate)  # its own running rate (a budget that caps trees lets each size its own)
    own._rates = {}
    own._shadow = ()
    own.batch_refresh, own.scoring = False, None  # the batch that runs it decides (``_batch_drafter``)
    return own


class BatchDecoder:
    """Decodes batches of prompts with the settings of ``decoder`` (a ``SpeculativeDecoder`` whose
    target runs on the native Llama runner or on llama.cpp). Holds the shared KV cache between calls."""

    def __init__(self, decoder, max_batch: int = 8):
        if isinstance(max_batch, bool) or int(max_batch) != max_batch or max_batch < 1:
            raise ConfigError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        drafter = decoder.drafter
        if drafter is not None and not isinstance(drafter, (TokenTreeDrafter, NGramDrafter, ModelDrafter, HeadDrafter)):
            raise ConfigError(
                f"batched decoding drafts with the token trees, the n-gram draft, a draft model or a head; the "
                f"{type(drafter).__name__} draft cannot batch: use one of those, or decode one prompt at a time with generate"
            )
        if decoder.step_callback is not None:
            raise ConfigError("step_callback is not supported in batched decoding (it cannot tell the sequences apart); "
                              "use generate per prompt to record rounds")
        self.decoder = decoder
        self.max_batch = int(max_batch)
        self._llamacpp = getattr(decoder.target, "backend", None) == "llamacpp"
        if not self._llamacpp:  # checked here, allocated at the first batch with as many slots as it runs at once
            self._base_runner = decoder.target.runner
            BatchedLlamaRunner.check_base(self._base_runner)
        self.runner = None  # the shared target forward (_target_slots)
        self._draft_base = None  # the draft model's native runner, whose weights the draft forwards batch
        self.draft_runner: BatchedLlamaRunner | None = None
        self.head_steps: dict[object, BatchedHeadSteps] = {}  # per head module: its sequences' queued steps
        if isinstance(drafter, ModelDrafter):
            self._use_draft(drafter.adapter)
        self._lock = threading.Semaphore(0)  # the scheduler's turn
        self._aborted = False

    def _use_draft(self, draft) -> None:
        """Batch the forwards of the draft model ``draft`` (its ``HFModelAdapter``): ConfigError
        unless it runs on the native Llama runner."""
        if getattr(draft, "backend", None) == "llamacpp":
            raise ConfigError(
                "a GGUF draft model (llama.cpp) cannot batch yet: only drafts on the native Llama runner share a batched "
                "draft forward; use the token-tree or n-gram draft in a batch, or decode one prompt at a time with generate"
            )
        runner = getattr(draft, "runner", None)
        try:
            BatchedLlamaRunner.check_base(runner)
        except ConfigError:
            raise ConfigError(
                f"a batched draft model runs on the native Llama runner; this draft runs on {type(runner).__name__}: "
                "use a Llama-architecture draft on backend 'auto' or 'native', or decode one prompt at a time with generate"
            ) from None
        self._draft_base = runner

    @property
    def draft_batches(self) -> bool:
        """Whether this batch runs a draft model's forwards batched."""
        return self._draft_base is not None

    # ----- per-sequence decoders ------------------------------------------------------------
    def _drafter(self, seq: _Sequence):
        """The sequence's own drafter: a token-tree drafter with its own context index
        (``token_tree_copy``: adjacency table and acceptance estimates shared, updated in the
        batch's fixed turn order, so runs stay deterministic); the n-gram draft; the draft model on
        the sequence's draft slot (its ``ModelDrafter`` is made by the decoder, with its own
        sampling parameters); the parent's head (the decoder makes its ``HeadDrafter`` over the
        sequence's target adapter, whose slot returns the features the head reads; its steps are
        batched by ``_batch_drafter``); or none (plain)."""
        drafter = self.decoder.drafter
        if isinstance(drafter, TokenTreeDrafter):
            return token_tree_copy(drafter)
        if isinstance(drafter, HeadDrafter):
            return drafter.head
        if isinstance(drafter, ModelDrafter):
            return self._draft_adapter(seq)
        return None if drafter is None else "ngram"

    def _draft_adapter(self, seq: _Sequence) -> HFModelAdapter:
        """A draft adapter for ``seq`` on a new slot of the batched draft runner."""
        if self.draft_runner is None:
            # as many slots as the target's runner was made with (it grows the same way)
            slots = self.runner.kv.slots if isinstance(self.runner, BatchedLlamaRunner) else self.max_batch
            self.draft_runner = BatchedLlamaRunner(self._draft_base, initial_slots=slots)
        seq.draft_slot = self.draft_runner.open(wait=lambda: self._pause(seq, "draft"))
        return HFModelAdapter(self._draft_base.model, runner=seq.draft_slot)

    def _sequence_decoder(self, adapter, seed, max_new_tokens, temperature, stop, cost_model=None, draft=None):
        """The decoder of one sequence: the parent's settings with this sequence's own, on ``adapter``
        (target) and ``draft`` (its drafter, ``_drafter``; None: the parent's own drafter, alone)."""
        parent = self.decoder
        params, draft_params = parent.params, parent.draft_params
        if draft is None and parent.drafter is not None:
            draft = parent.drafter.adapter if isinstance(parent.drafter, ModelDrafter) else self._drafter(None)
        # the parent's own class (not imported: engine.decoder imports this module for generate_batch)
        decoder = type(parent)(
            adapter,
            draft,
            tokenizer=parent.tokenizer,
            method=parent.method,
            num_drafts=parent.num_drafts,
            # an adaptive chain stays adaptive (its L chosen per round, by the batch budget when planned)
            draft_len=None if parent.adaptive_draft_len else parent.draft_len,
            max_draft_len=parent.draft_len,
            tree=parent.tree,
            temperature=params.temperature if temperature is None else temperature,
            top_k=params.top_k,
            top_p=params.top_p,
            draft_temperature=None if draft_params.temperature == params.temperature else draft_params.temperature,
            max_new_tokens=parent.max_new_tokens if max_new_tokens is None else max_new_tokens,
            eos_token_id=sorted(parent.eos_ids),
            stop=parent.stop if stop is None else stop,
            seed=parent.seed if seed is None else seed,
            cost_model=cost_model,
        )
        decoder.spec = parent.spec  # the parent's rule object itself (it may be set directly, e.g. a control)
        if isinstance(parent.drafter, NGramDrafter):
            decoder.drafter.model.max_n = parent.drafter.model.max_n
        return decoder

    # ----- turns ---------------------------------------------------------------------------
    def _pause(self, seq: _Sequence, waits_on: str | None = None) -> None:
        """Called in ``seq``'s thread once its forward is queued (``waits_on``: "target", "draft" or
        "head", the queue it is in; None: an offer): hand the turn back, wait for the next."""
        seq.waits_on = waits_on
        self._lock.release()
        seq.turn.acquire()
        seq.waits_on = None
        if self._aborted:
            raise _Aborted

    def _offer(self, seq: _Sequence, offered) -> tuple[int, BatchRoundDecision]:
        """A sequence's planner (in its thread): hand its offer (the expected tokens of its candidate
        nodes, best first) to the scheduler, wait for its share (nodes to score, root included)."""
        seq.offer = offered
        self._pause(seq)
        share, seq.share = seq.share, None
        return share

    def _run_sequence(self, seq: _Sequence) -> None:
        seq.turn.acquire()
        try:
            if not self._aborted:
                seq.output = seq.decoder.generate(seq.prompt, rng=seq.rng)
        except ConfigError as error:
            seq.error = str(error)
        except _Aborted:
            pass
        except BaseException as error:  # re-raised by the scheduler
            seq.exception = error
        finally:
            seq.done = True
            self._lock.release()

    def _give_turn(self, seq: _Sequence) -> None:
        seq.turn.release()
        self._lock.acquire()

    def _target_slots(self, count: int):
        """The shared target forward whose ``open(wait)`` gives each sequence its slot: one
        llama.cpp context for every slot at once (its sequence ids are fixed when it is created,
        ``models.llamacpp_batch``), or the native runner's slotted KV cache."""
        if self._llamacpp:
            from verispec.models.llamacpp_batch import shared_batch

            return shared_batch(self.decoder.target, self.max_batch)
        return BatchedLlamaRunner(self._base_runner, initial_slots=min(self.max_batch, count))

    def _slot_adapter(self, slot):
        """A sequence's target adapter over its slot (a llama.cpp slot is an adapter itself)."""
        return slot if self._llamacpp else HFModelAdapter(self.decoder.target.model, runner=slot)

    def _start(self, seq: _Sequence, settings, planned: bool) -> None:
        seq.slot = self.runner.open(wait=lambda: self._pause(seq, "target"))
        try:
            seq.decoder = self._sequence_decoder(self._slot_adapter(seq.slot), *settings, draft=self._drafter(seq))
        except ConfigError as error:
            seq.error, seq.done = str(error), True
            return
        self._batch_drafter(seq)
        if planned:
            self._plan_by_budget(seq)
        seq.thread = threading.Thread(target=self._run_sequence, args=(seq,), daemon=True, name=f"verispec-batch-{seq.index}")
        seq.thread.start()

    def _batch_drafter(self, seq: _Sequence) -> None:
        """A head-drafting sequence queues its head steps for the batch's packed head call; a
        token-tree sequence on the native runner leaves its adjacency refresh to the batch
        (``_refresh_adjacency``)."""
        drafter = seq.decoder.drafter
        if isinstance(drafter, TokenTreeDrafter) and isinstance(self.runner, BatchedLlamaRunner):
            drafter.batch_refresh = True
        if isinstance(drafter, HeadDrafter):
            steps = self.head_steps.setdefault(drafter.head, BatchedHeadSteps(drafter.head))
            drafter.step = steps.stepper(lambda: self._pause(seq, "head"))

    def _plan_by_budget(self, seq: _Sequence) -> None:
        """Let the batch budget size ``seq``'s rounds: its token trees or adaptive chain offer their
        candidates to the scheduler (``_offer``) instead of choosing alone. Its own cost model is
        frozen: its timings would time the whole batched round, whose cost the batch's model learns."""
        seq.decoder.cost_model = OnlineCostModel(learn=False)
        if isinstance(seq.decoder.drafter, TokenTreeDrafter):
            seq.decoder.drafter.planner = lambda order: self._offer(seq, order)  # grown by the split as it reads
        elif seq.decoder.adaptive_draft_len:
            seq.decoder.chain_planner = lambda gains: self._offer(seq, gains)

    def _finish(self, seq: _Sequence) -> None:
        if seq.thread is not None:
            seq.thread.join()
        self._close_slots(seq)

    def _close_slots(self, seq: _Sequence) -> None:
        drafter = getattr(seq.decoder, "drafter", None)
        if isinstance(drafter, TokenTreeDrafter):  # a drafter kept after the batch (a server's) refreshes its own table again
            drafter.batch_refresh, drafter.scoring = False, None
        self.runner.close(seq.slot)
        if seq.draft_slot is not None:
            self.draft_runner.close(seq.draft_slot)
            seq.draft_slot = None

    # ----- the loop ------------------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence,
        seeds=None,
        max_new_tokens=None,
        temperatures=None,
        stops=None,
        rngs: Sequence[Rng] | None = None,
        budget: BudgetPolicy | None = None,
    ) -> list[BatchGenerationOutput]:
        """Decode every prompt (text or token ids); one output per prompt, in order.

        seeds / max_new_tokens / temperatures / stops: one value for all or one per prompt (None:
        the decoder's). A sequence with the decoder's seed gives what ``generate`` gives for its
        prompt alone (greedy: the same tokens up to float rounding; sampled: the same law, and the
        same text where the draft does not depend on other sequences, e.g. the n-gram draft).
        rngs: one ``Rng`` per prompt instead of seeds (e.g. the replay enumerator in exact tests).
        budget: None (default): the batch budget splits each forward's tokens by expected tokens per
        predicted second (``engine.batch_budget``); or a ``BudgetPolicy`` capping each sequence's
        tree, sized by its own drafter (``EvenSplit``, ``drafter_choice``).
        """
        if isinstance(prompts, str):
            raise ConfigError(f"prompts must be a list of prompts, got the string {prompts!r}; write [{prompts!r}]")
        prompts = list(prompts)
        if not prompts:
            raise ConfigError("generate_batch needs at least one prompt")
        count = len(prompts)
        seeds = _per_sequence(seeds, count, "seeds")
        limits = [None if m is None else check_max_new_tokens(m) for m in _per_sequence(max_new_tokens, count, "max_new_tokens")]
        temperatures = _per_sequence(temperatures, count, "temperatures")
        if stops is None or isinstance(stops, str) or all(isinstance(s, str) for s in stops):
            stops = [None if stops is None else check_stop_strings(stops)] * count  # one list for every prompt
        else:
            stops = [None if s is None else check_stop_strings(s) for s in _per_sequence(stops, count, "stops")]
        rngs = _per_sequence(rngs, count, "rngs")
        if budget is not None and not isinstance(self.decoder.drafter, TokenTreeDrafter):
            raise ConfigError("a per-round budget applies to the token-tree draft only for now; drop budget=")
        settings = list(zip(seeds, limits, temperatures, stops))
        if budget is None and (count == 1 or self.max_batch == 1):
            return [self._decode_alone(prompt, rng, setting) for prompt, rng, setting in zip(prompts, rngs, settings)]
        planned = budget is None
        if self.runner is None:  # KV buffers of max_batch slots would be zero-filled for nothing when fewer run
            self.runner = self._target_slots(count)
        self._aborted = False
        sequences = [_Sequence(i, prompt, rng=rngs[i]) for i, prompt in enumerate(prompts)]
        waiting = list(sequences)
        running: list[_Sequence] = []
        start = round_start = time.perf_counter()
        try:
            while waiting or running:
                while waiting and len(running) < self.max_batch and (not running or self.runner.admits()):
                    seq = waiting.pop(0)
                    self._start(seq, settings[seq.index], planned)
                    running.append(seq)
                if not planned:
                    self._apply_budget(budget, running)
                plan = self._run_turns(running, planned)
                for seq in [s for s in running if s.done]:
                    self._finish(seq)
                    running.remove(seq)
                round_start = self._flush(plan, round_start, running)
        except BaseException:
            self._abort(running)
            raise
        seconds = time.perf_counter() - start
        return [self._output(seq, seconds) for seq in sequences]

    @staticmethod
    def _raise_failure(running: list[_Sequence]) -> None:
        for seq in running:
            if seq.exception is not None:
                raise seq.exception

    def _run_turns(self, running: list[_Sequence], planned: bool, check=None) -> BatchRoundDecision | None:
        """One round's turns up to its target forward: every live sequence runs (in batch order)
        to its offer or its next forward; then, while any sequence waits, the draft runner and
        head queues are flushed for those waiting on them (the others keep waiting at the target)
        and they run on, or, once none waits on a draft, the offers are planned (``_plan_round``)
        and the offering sequences draft their shares. Returns the
        plan when all wait at the target (or are done). ``check(running)`` runs after each pass
        (default: re-raise a sequence's unexpected error)."""
        check = self._raise_failure if check is None else check
        turns = [seq for seq in running if not seq.done]
        plan = None
        while turns:
            for seq in turns:  # each runs to its offer, its draft forward or its target forward
                self._give_turn(seq)
            check(running)
            drafting = [seq for seq in running if not seq.done and seq.waits_on in ("draft", "head")]
            if drafting:
                for queue in [self.draft_runner, *self.head_steps.values()]:
                    if queue is not None:
                        queue.flush()
                turns = drafting
            elif planned and any(not s.done and s.offer is not None for s in running):
                plan = self._plan_round(running)
                turns = [seq for seq in running if seq.share is not None]
            else:
                turns = []
        return plan

    def _plan_round(self, running: list[_Sequence]) -> BatchRoundDecision | None:
        """Split this round's forward between the sequences waiting with an offer, giving each
        its share (it drafts it in its next turn, ``_run_turns``). Tokens already queued (a
        joining sequence's prompt) count in the forward's cost."""
        offering = [s for s in running if not s.done and s.offer is not None]
        if not offering:
            return None
        offers = [seq.offer for seq in offering]
        plan = split_scored_tokens(offers, self.decoder.batch_cost_model, self.runner.pending_tokens)
        for seq, nodes in zip(offering, plan.nodes):
            seq.offer, seq.share = None, (nodes, plan)
        return plan

    def _flush(self, plan: BatchRoundDecision | None, round_start: float, running: list[_Sequence]) -> float:
        """Run the batched forward and refresh the token trees' adjacency table from it; a planned
        round's timings go to its decision and to the batch cost model (the forward over all queued
        tokens; the rest of the round, the refresh included, as overhead). Returns the end of the round."""
        scored = self.runner.pending_tokens
        tic = time.perf_counter()
        self.runner.flush()
        end = time.perf_counter()
        self._refresh_adjacency(running)
        if plan is not None and scored:
            plan.measured_target_seconds, plan.measured_round_seconds = end - tic, end - round_start
            self.decoder.batch_cost_model.record(scored, end - tic, tic - round_start)
        return end

    def _refresh_adjacency(self, running: list[_Sequence]) -> None:
        """Record the rows of every tree the forward just scored into the shared adjacency table,
        before any sequence resumes, in one ``AdjacencyTable.update_rows`` (one softmax and top-k
        over all the rows) instead of one ``update`` per sequence. The rows go in turn order, so
        where several sequences scored the same token the last sequence's last row wins, as their
        own updates in turn order would leave it. Every sequence then drafts its next tree from all
        of this round's rows (no longer only from those of the sequences before it)."""
        tables: dict[int, tuple] = {}  # id(table) -> (table, tokens, rows): a batch shares one
        for seq in running:
            drafter = getattr(seq.decoder, "drafter", None)
            if seq.done or not isinstance(drafter, TokenTreeDrafter) or drafter.scoring is None:
                continue
            scored, drafter.scoring = drafter.scoring, None
            found = self.runner.flushed_rows(seq.slot.slot)
            if found is None or found[2] != len(scored):  # not the tree it proposed: no rows to record
                continue
            logits, first, _ = found
            _, tokens, rows = tables.setdefault(id(drafter.adjacency), (drafter.adjacency, [], []))
            tokens += scored
            rows += range(first, first + len(scored))
        for table, tokens, rows in tables.values():
            table.update_rows(tokens, logits, rows)

    def _decode_alone(self, prompt, rng, setting) -> BatchGenerationOutput:
        """One sequence at a time: the single-sequence path itself (the decoder's own target
        adapter and runner), so a batch of one costs what ``generate`` costs."""
        seq = _Sequence(0, prompt, rng=rng)
        start = time.perf_counter()
        try:
            # the parent's cost model too: alone, its timings are the round's own, as in generate
            seq.decoder = self._sequence_decoder(self.decoder.target, *setting, cost_model=self.decoder.cost_model)
            seq.output = seq.decoder.generate(prompt, rng=rng)
        except ConfigError as error:
            seq.error = str(error)
        return self._output(seq, time.perf_counter() - start)

    def _apply_budget(self, budget: BudgetPolicy, running: list[_Sequence]) -> None:
        live = [s for s in running if not s.done and s.decoder is not None and s.decoder.drafter is not None]
        if not live or not isinstance(live[0].decoder.drafter, TokenTreeDrafter):
            return
        views = []
        for seq in live:
            output = seq.decoder.last_output
            views.append(SequenceView(seq.index, len(seq.decoder.target.tokens()), 0 if output is None else output.new_tokens))
        limits = list(budget(views))
        if len(limits) != len(live):
            raise ConfigError(f"the budget policy returned {len(limits)} limits for {len(live)} sequences")
        for seq, limit in zip(live, limits):
            drafter = seq.decoder.drafter
            if seq.max_nodes is None:
                seq.max_nodes = drafter.max_nodes
            if limit is not None and (isinstance(limit, bool) or int(limit) != limit or limit < 0):
                raise ConfigError(f"the budget policy gave {limit!r} tree nodes; give an integer >= 0 or None")
            drafter.max_nodes = seq.max_nodes if limit is None else min(int(limit), seq.max_nodes)

    def _abort(self, running: list[_Sequence]) -> None:
        """Stop every paused sequence (they raise ``_Aborted`` in their thread) and free the slots."""
        self._aborted = True
        for queue in [self.runner, self.draft_runner, *self.head_steps.values()]:
            if queue is not None:
                queue.discard_queued()
        for seq in running:
            if not seq.done and seq.thread is not None:
                seq.turn.release()
                seq.thread.join()
            self._close_slots(seq)

    def _output(self, seq: _Sequence, seconds: float) -> BatchGenerationOutput:
        decoder = self.decoder
        if seq.output is not None:
            values = {f.name: getattr(seq.output, f.name) for f in fields(seq.output)}
            return BatchGenerationOutput(**values)
        settings = seq.decoder or decoder
        return BatchGenerationOutput(
            settings.method, settings.num_drafts, settings.draft_len, [], [], "", [], seconds, 0.0, "error",
            {}, error=seq.error,
        )
