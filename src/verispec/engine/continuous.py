"""Continuous batching: sequences join a running batch between rounds and leave when done.

``BatchDecoder.generate`` decodes a list of prompts known up front. A server does not know its
prompts up front: ``ContinuousBatch`` is the same machinery (``engine.batch``: each sequence its
own ``SpeculativeDecoder`` on a slot of one ``BatchedLlamaRunner`` or llama.cpp batch context
(``models.llamacpp_batch``: there a joining prompt prefills alone), driven in turn by threads that
pause at their target forward, one packed forward per round) with the loop turned inside out, so
the caller owns it:

    batch = ContinuousBatch(decoder, max_batch=8)
    seq = batch.add(lambda target: SpeculativeDecoder(target, ...), prompt_ids, on_round=...)
    while batch.active:
        for done in batch.step():   # one round of every running sequence, one forward
            ...                      # done.output / done.error / done.stopped

``add`` may be called between any two ``step`` calls: the sequence waits until a slot is free
(at most ``max_batch`` run at once) and starts at the next step, its prompt's prefill packed into
that round's forward. Each sequence's decoder is made by the caller (``make_decoder(target)``),
so every sequence keeps its own rule, draft shape, sampling parameters, seed and limits; a
sequence in the batch runs exactly the code it runs alone (the engine's round generator), so its
law is its solo law and, with a drafter-invariant rule and a seed, its text is its solo text (up
to the batch variance of the float rounding of the packed forward, see ``models.batch_runner``).

Progress: ``on_round(output)`` is called in the sequence's turn after each of its rounds with the
round's ``GenerationOutput`` snapshot (stop_reason "running" until the last); returning a reason
(a string, e.g. "cancelled" or "time_limit") stops the sequence there: it leaves the batch at that
round with ``stopped`` set to the reason and ``output`` the snapshot. ``cancel(seq)`` does the
same from outside: the sequence stops at the end of its current round (a waiting one never
starts). A sequence whose input is bad (empty prompt, a prompt longer than the context, a decoder
that cannot be made) ends with ``error`` set; one whose code raises ends with ``exception`` set;
the other sequences go on in both cases.

Only one thread runs at a time (the caller's during the forward, else one sequence's), so state
shared between sequences (a token-tree adjacency table, ``token_tree_drafter``) needs no lock and
a run is deterministic for a given order of ``add`` calls between steps.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from verispec.engine.batch import BatchDecoder, BudgetPolicy, _Aborted, _Sequence, token_tree_copy
from verispec.engine.drafters import TokenTreeDrafter
from verispec.errors import ConfigError
from verispec.models.hf import HFModelAdapter

RoundHook = Callable[[Any], "str | None"]


@dataclass(eq=False)
class BatchSequence(_Sequence):
    """One sequence of a ``ContinuousBatch`` (what ``add`` returns and ``step`` reports when done).

    output: the last ``GenerationOutput`` snapshot (None if it never decoded a round); error: the
    message of a sequence that could not be decoded; stopped: the reason it was stopped early
    (``cancel`` or ``on_round``); exception: an unexpected error raised by its code; rounds: rounds
    decoded; added_at / started_at / finished_at: ``time.perf_counter()`` stamps."""

    make_decoder: Callable[..., Any] | None = None
    drafts: bool = False  # its decoder drafts with the batch's draft model (on a draft slot)
    on_round: RoundHook | None = None
    stop_request: str | None = None
    stopped: str | None = None
    rounds: int = 0
    added_at: float = field(default_factory=time.perf_counter)
    started_at: float | None = None
    finished_at: float | None = None

    __eq__ = object.__eq__  # a sequence is itself, whatever its fields (lists use ==, dicts hash)
    __hash__ = object.__hash__


class ContinuousBatch(BatchDecoder):
    """A running batch over ``decoder``'s target (a ``SpeculativeDecoder`` on the native Llama
    runner or llama.cpp; its drafter, if a token tree, lends its adjacency table to ``token_tree_drafter``).

    max_batch: most sequences decoding at once; threads: torch threads of every sequence's thread
    (None: leave torch's setting); budget: None (default): the batch budget splits each forward's
    tokens between the sequences by expected tokens per predicted second of the batched forward
    (``engine.batch_budget``), as ``generate_batch`` does; or a ``BudgetPolicy`` capping each
    token-tree sequence's tree (``drafter_choice``: each drafter's own choice); draft: a draft
    model's ``HFModelAdapter`` on the native Llama runner whose forwards the batch runs packed for
    the sequences added with ``drafts=True`` (a ``decoder`` drafting with a draft model lends its
    own). Not thread-safe: one thread calls ``add`` / ``cancel`` / ``step`` (a server's scheduler loop)."""

    def __init__(self, decoder, max_batch: int = 8, threads: int | None = None, budget: BudgetPolicy | None = None,
                 draft=None):
        super().__init__(decoder, max_batch=max_batch)
        if draft is not None:
            self._use_draft(draft)
        self.threads = threads
        self.budget = budget
        self.waiting: list[BatchSequence] = []
        self.running: list[BatchSequence] = []
        self._numbers = itertools.count()
        self.rounds = 0  # forwards run (steps with at least one running sequence)

    # ----- the caller's side ----------------------------------------------------------------
    @property
    def active(self) -> int:
        """Sequences waiting or running."""
        return len(self.waiting) + len(self.running)

    def add(self, make_decoder: Callable[..., Any], prompt, rng=None, on_round: RoundHook | None = None,
            drafts: bool = False) -> BatchSequence:
        """Queue a sequence; it starts at the next ``step`` with a free slot. ``make_decoder(target)``
        returns its ``SpeculativeDecoder`` over ``target`` (its slot's adapter); with ``drafts``
        (a batch made with ``draft=``) ``make_decoder(target, draft)``, ``draft`` its adapter on a
        slot of the batched draft runner; ``prompt``: text or token ids; ``rng``: an ``Rng``
        (default: the decoder's seeded draws)."""
        if drafts and self._draft_base is None:
            raise ConfigError("this batch has no draft model to batch (make it with ContinuousBatch(..., draft=adapter)); "
                              "add the sequence with drafts=False")
        seq = BatchSequence(next(self._numbers), prompt, rng=rng, make_decoder=make_decoder, on_round=on_round,
                            drafts=drafts)
        self.waiting.append(seq)
        return seq

    def cancel(self, seq: BatchSequence, reason: str = "cancelled") -> None:
        """Stop ``seq`` at the end of its current round (a waiting sequence never starts); it is
        reported by the next ``step`` with ``stopped`` = ``reason``."""
        if seq.stop_request is None:
            seq.stop_request = reason

    def token_tree_drafter(self) -> TokenTreeDrafter:
        """A token-tree drafter of its own (context index, plain-round streak) sharing the batch
        decoder's adjacency table and acceptance estimates, which describe the target and learn
        from every sequence; ConfigError if the batch decoder drafts otherwise."""
        if not isinstance(self.decoder.drafter, TokenTreeDrafter):
            raise ConfigError("this batch's decoder has no token-tree drafter to share")
        return token_tree_copy(self.decoder.drafter)

    def step(self) -> list[BatchSequence]:
        """Start waiting sequences while slots are free, run one round of every running sequence
        (one forward), and return the sequences that ended in it (or were cancelled waiting)."""
        ended = [seq for seq in self.waiting if seq.stop_request is not None]
        for seq in ended:
            self.waiting.remove(seq)
            seq.stopped, seq.done, seq.finished_at = seq.stop_request, True, time.perf_counter()
        if self.runner is None and self.waiting:
            self.runner = self._target_slots(len(self.waiting))
        while self.waiting and len(self.running) < self.max_batch and (not self.running or self.runner.admits()):
            seq = self.waiting.pop(0)
            seq.started_at = time.perf_counter()
            self._start(seq, None)
            self.running.append(seq)
        if not self.running:
            return ended
        self._aborted = False
        round_start = time.perf_counter()
        try:
            if self.budget is not None:
                self._apply_budget(self.budget, [s for s in self.running if isinstance(getattr(s.decoder, "drafter", None), TokenTreeDrafter)])
            # each runs to its offer, its draft forwards and its target forward; a sequence's
            # error is its own (reported with it), the others go on
            plan = self._run_turns(self.running, self.budget is None, check=lambda running: None)
            self._flush(plan, round_start, self.running)
        except BaseException:
            self.close()
            raise
        self.rounds += 1
        for seq in [s for s in self.running if s.done]:
            self._finish(seq)
            self.running.remove(seq)
            seq.finished_at = time.perf_counter()
            ended.append(seq)
        return ended

    def close(self) -> None:
        """Stop every sequence now (running ones raise inside their thread) and free the slots;
        they are dropped, not reported. The batch can be used again afterwards."""
        if self.runner is not None and self.running:
            self._abort(self.running)
        self.running, self.waiting = [], []

    # ----- the sequences' side (overrides of BatchDecoder's) --------------------------------
    def _start(self, seq: BatchSequence, settings) -> None:
        seq.slot = self.runner.open(wait=lambda: self._pause(seq, "target"))
        try:
            target = self._slot_adapter(seq.slot)
            if seq.drafts:
                seq.decoder = seq.make_decoder(target, self._draft_adapter(seq))
            else:
                seq.decoder = seq.make_decoder(target)
            if seq.decoder.step_callback is not None:
                raise ConfigError("step_callback is not supported in batched decoding; use on_round")
        except ConfigError as error:
            seq.error, seq.done = str(error), True
            return
        self._batch_drafter(seq)
        if self.budget is None:
            self._plan_by_budget(seq)
        seq.thread = threading.Thread(target=self._run_sequence, args=(seq,), daemon=True, name=f"verispec-batch-{seq.index}")
        seq.thread.start()

    def _run_sequence(self, seq: BatchSequence) -> None:
        """The sequence's thread: its decoder's round generator, one snapshot per round, stopping
        where ``on_round`` or ``cancel`` asks (the generator is closed: no further forward)."""
        seq.turn.acquire()
        if self.threads is not None:
            torch.set_num_threads(self.threads)  # OpenMP's thread count is per calling thread
        rounds = None
        try:
            if not self._aborted:
                rounds = seq.decoder._run(seq.prompt, seq.rng)
                for seq.output in rounds:
                    seq.rounds += 1
                    reason = seq.on_round(seq.output) if seq.on_round is not None else None
                    reason = reason or seq.stop_request
                    if reason and seq.output.stop_reason == "running":
                        seq.stopped = reason
                        break
        except ConfigError as error:
            seq.error = str(error)
        except _Aborted:
            pass
        except BaseException as error:  # reported per sequence: the others go on
            seq.exception = error
        finally:
            if rounds is not None:
                rounds.close()
            seq.done = True
            self._lock.release()
