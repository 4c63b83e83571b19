"""Engine mutants for the exact engine-law test (issue 10 item 3), run by hand:

    PYTHONPATH=src OMP_NUM_THREADS=1 python -m tests.engine.mutants

Each mutant is a plausible one-line bug, applied by patching at run time (no file is edited); the
script prints the clean error of every case, then per mutant and case the max |Δ| of the engine's
exact law and whether ``test_engine_law_is_the_target_law`` catches it (error >= the case's
tolerance, ~6e-7 .. 9e-7). Measured 2026-11-23 (clean errors 4.6e-9 .. 2.0e-8):

    mutation                             gbv-mod  ★ L2     ★ L3     gbv-mod L3 full q  ★ L3 full q
    (a) windows dropped between rounds   1.7e-2   1.5e-2   1.5e-2   2.8e-2             4.8e-2
    (b) windows at the round root only   -        -        -        2.5e-2             1.2e-2
    (c) window stacking reversed         -        -        -        1.9e-3             -
    (c) windows not advanced             1.9e-2   2.5e-2   2.5e-2   1.9e-3             -
    (c) window joint P(z) not advanced   -        -        -        1.4e-2             1.4e-2
    bases alias the modified row         -        -        -        2.9e-4             3.6e-3
    reported q != sampled q              sd 9.2e-3, gbv-mod 4.7e-3, spectr 1.1e-2, ★ 6.8e-3

    "-": not caught by that case (error = the clean error). Every mutant is caught by at least one
    case. "Stacking reversed" needs a window that clips ([.]_+ active) stacked under another:
    without clipping every window maps p into the line through p and q and stacking commutes.
    "Bases alias the modified row" was a real bug of modify_tree_targets (fixed)."""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace
from unittest import mock

import numpy as np

from tests.engine.test_engine_exact_law import ALL_CASES, engine_error, tolerance
from verispec.draft import samplers
from verispec.engine import decoder as decoder_module
from verispec.verify import modification


def windows_dropped_between_rounds():
    """(a) the windows this round leaves are never carried to the next round."""
    return mock.patch.object(decoder_module.SpeculativeDecoder, "_next_windows", staticmethod(lambda tree, modified, result: ()))


def windows_applied_at_root_only():
    """(b) modify_tree_targets modifies the root's vector only, deeper nodes keep the raw target."""
    original = modification.modify_tree_targets

    def root_only(windows, tokens, parents, raw, draft):
        result = original(windows, tokens, parents, raw, draft)
        target = np.array(raw, dtype=np.float64, copy=True)
        target[0] = result.target_probs[0]
        return replace(result, target_probs=target)

    return mock.patch.object(decoder_module, "modify_tree_targets", root_only)


def stacking_reversed():
    """(c) the new window is put before the old ones (newest first) when stacking."""
    original = decoder_module.SpeculativeDecoder._next_windows

    def reversed_stack(tree, modified, result):
        windows = original(tree, modified, result)
        return windows[::-1]

    return mock.patch.object(decoder_module.SpeculativeDecoder, "_next_windows", staticmethod(reversed_stack))


def windows_not_advanced():
    """(c) windows in force at the old root are carried to the next round unmoved."""
    original = decoder_module.SpeculativeDecoder._next_windows

    def unmoved(tree, modified, result):
        old = () if modified is None else modified.windows[0]
        return old + ((result.modification,) if result.modification is not None else ())

    return mock.patch.object(decoder_module.SpeculativeDecoder, "_next_windows", staticmethod(unmoved))


def bases_alias_the_modified_row():
    """The bug fixed in modify_tree_targets: each window's base at a node is the row after all
    windows (the first window advances P(z) by the modified p instead of the p it saw)."""
    original = modification.modify_tree_targets

    def aliased(windows, tokens, parents, raw, draft):
        result = original(windows, tokens, parents, raw, draft)
        bases = tuple(tuple(result.target_probs[node] for _ in node_bases) for node, node_bases in enumerate(result.bases))
        return replace(result, bases=bases)

    return mock.patch.object(decoder_module, "modify_tree_targets", aliased)


def window_joint_not_updated():
    """(c) advancing a window forgets to multiply P(z) by p(token | z)."""
    original = modification.ModificationWindow.advance

    def advance(self, token, base_target, draft):
        moved = original(self, token, base_target, draft)
        return None if moved is None else replace(moved, log_target_joint=self.log_target_joint)

    return mock.patch.object(modification.ModificationWindow, "advance", advance)


def reported_q_differs_from_sampled_q():
    """A draft whose reported q is smoothed (0.9 q + 0.1 uniform) while tokens were drawn from q."""
    original = samplers._Builder.finish

    def finish(self, scheme, paths=()):
        # the tokens are already drawn from the rows; report smoothed rows instead
        self.draft_rows = {node: 0.9 * np.asarray(row) + 0.1 / len(row) for node, row in self.draft_rows.items()}
        return original(self, scheme, paths)

    return mock.patch.object(samplers._Builder, "finish", finish)


MODIFYING = ["gbv-mod", "spectr-gbv-star", "spectr-gbv-star-L3", "gbv-mod-L3-full-q", "spectr-gbv-star-L3-full-q"]
MUTANTS = {
    "(a) windows dropped between rounds": (windows_dropped_between_rounds, MODIFYING),
    "(b) windows at the round root only": (windows_applied_at_root_only, MODIFYING),
    "(c) window stacking reversed": (stacking_reversed, MODIFYING),
    "(c) windows not advanced": (windows_not_advanced, MODIFYING),
    "(c) window joint P(z) not advanced": (window_joint_not_updated, MODIFYING),
    "bases alias the modified row": (bases_alias_the_modified_row, MODIFYING),
    "reported q != sampled q": (reported_q_differs_from_sampled_q, ["sd", "gbv-mod", "spectr", "spectr-gbv-star"]),
}


def main() -> None:
    print(f"{'mutation':40s} {'case':26s} {'max |Δ|':>10s}  verdict")
    for case in sorted({case for _, cases in MUTANTS.values() for case in cases}):
        start = time.perf_counter()
        error, _ = engine_error(ALL_CASES[case])
        print(f"{'(clean)':40s} {case:26s} {error:10.2e}  tolerance {tolerance(ALL_CASES[case]):.1e}, {time.perf_counter() - start:.1f} s", flush=True)
    for name, (patch, cases) in MUTANTS.items():
        for case in cases:
            with contextlib.ExitStack() as stack:
                stack.enter_context(patch())
                try:
                    error, _ = engine_error(ALL_CASES[case])
                    verdict = "CAUGHT by test_engine_law_is_the_target_law" if error >= tolerance(ALL_CASES[case]) else "not caught"
                except Exception as exc:  # a crash is caught too, but say so
                    error, verdict = float("nan"), f"CAUGHT (raises {type(exc).__name__})"
            print(f"{name:40s} {case:26s} {error:10.2e}  {verdict}", flush=True)


if __name__ == "__main__":
    main()
