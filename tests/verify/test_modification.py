"""Target-modification windows far below float range (issue 10 item 8; ALGORITHMS.md §1 rule 2,
§4.3, §6.3 step 4): P(z) and Q(z) of deep prefixes underflow float64, yet the modified law
p̂(.|z) ∝ [P(z) p(.|z) - Qd(z, .)]_+ depends only on their ratio. Windows keep log P and a
log-scaled Qd, so log P = -800 must give the same p̂ as the same ratio at a shallow prefix."""

import math

import numpy as np
import pytest

from verispec.verify.modification import ModificationWindow, PlainDraftJoint, SkewedDraftJoint, scaled_to_linear

# Along the path the token 0 is drafted with q = 1/4. Its ratio p/q is the smallest, so C(z) stays
# 0 and the skewed joint is Q(z)^K.
DRAFT = np.array([0.25, 0.25, 0.5])


def _deep_window(joint, target, steps):
    window = ModificationWindow(0.0, joint, remaining=steps + 1)
    for _ in range(steps):
        window = window.advance(0, target, DRAFT)
    return window


@pytest.mark.parametrize("steps", [600, 1000])
def test_gbv_mod_window_at_log_p_below_minus_800(steps):
    target = np.array([0.25, 0.25, 0.5])  # p(0) = q(0): P(z) = Q(z), so Q(z, .)/P(z) = q
    window = _deep_window(PlainDraftJoint(0.0), target, steps)
    assert window.log_target_joint < -800
    modified, guard = window.modify(np.array([0.5, 0.25, 0.25]), DRAFT)
    expected = np.maximum(np.array([0.5, 0.25, 0.25]) - DRAFT, 0.0)
    assert not guard
    np.testing.assert_allclose(modified, expected / expected.sum(), rtol=1e-9)


@pytest.mark.parametrize("steps", [300, 700])
def test_star_window_at_log_p_below_minus_800(steps):
    """K = 2, p(0) = q(0)^2 along the path: P(z) = Q(z)^2 = Q̃(z) while Q(z) = 4^-steps underflows
    for 700 steps; p̂ must equal the shallow (1-step) result."""
    target = np.array([0.0625, 0.4375, 0.5])
    shallow = _deep_window(SkewedDraftJoint(0.0, 1.0, 2), target, 1)
    deep = _deep_window(SkewedDraftJoint(0.0, 1.0, 2), target, steps)
    assert deep.log_target_joint < -400 and (steps < 600 or deep.log_target_joint < -800)
    base = np.array([0.6, 0.1, 0.3])
    expected, shallow_guard = shallow.modify(base, DRAFT)
    modified, guard = deep.modify(base, DRAFT)
    assert not guard and not shallow_guard
    assert not np.allclose(expected, base)  # the modification really changes the law
    np.testing.assert_allclose(modified, expected, rtol=1e-9, atol=1e-15)


def test_scaled_to_linear_handles_factors_beyond_float_range():
    vector = np.array([0.0, 1e-300, 0.5])
    out = scaled_to_linear(vector, 800.0)
    assert out[0] == 0.0 and out[2] == math.inf
    assert out[1] == pytest.approx(1e-300 * math.exp(400) * math.exp(400), rel=1e-9)
    assert scaled_to_linear(vector, -math.inf).tolist() == [0.0, 0.0, 0.0]
    assert np.array_equal(scaled_to_linear(vector, 0.0), vector)


def test_tree_windows_advance_by_the_row_they_saw_not_the_modified_row():
    """modify_tree_targets on a chain root -> node 1 (token 0) with one window at the root: the
    window at node 1 has log P(z) advanced by the root's RAW p(0) (the base the window saw), and
    the root's base is that raw row. Regression: the base aliased the root's modified row."""
    from verispec.verify.modification import modify_tree_targets

    raw = np.array([[0.5, 0.25, 0.25], [0.2, 0.3, 0.5], [0.4, 0.4, 0.2]])
    draft = np.array([DRAFT, DRAFT, np.zeros(3)])
    window = ModificationWindow(math.log(0.3), PlainDraftJoint(math.log(0.2)), remaining=2)
    result = modify_tree_targets((window,), np.array([-1, 0, 1]), np.array([-1, 0, 1]), raw, draft)
    assert not np.allclose(result.target_probs[0], raw[0])  # the root really is modified
    np.testing.assert_array_equal(result.bases[0][0], raw[0])
    (deeper,) = result.windows[1]
    assert deeper.log_target_joint == pytest.approx(math.log(0.3) + math.log(raw[0, 0]), abs=1e-12)
