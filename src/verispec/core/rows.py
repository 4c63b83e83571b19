"""Row providers: the target and draft distributions of a draft tree, one row per node, computed
only where a rule asks for them (DESIGN.md §3, ALGORITHMS.md §1 rules 1-2; issue 16).

Why an interface and not arrays: a round scores n nodes over V tokens, and turning all n x V
logits into float64 probability vectors costs far more than the rules themselves at V = 128k (one
softmax over 33 x 128,256 floats takes ~16 ms at 1 thread). Most rules visit a few rows: SD stops
at the first rejection, NSS walks one path, and their acceptance tests read one entry per row. So
every rule is written ONCE against this interface, and two backends implement it:

``DenseRows``  wraps an (n, V) float64 array (what tests, enumeration and replay use, and what
               ``DraftTree.build(..., target_probs=array)`` makes);
``LogitRows``  keeps the raw (n, V) logits tensor on its device plus the ``SamplingParams`` and
               processes a row only when it is touched (the engine's path).

The exactness tests enumerate the rules through both backends (tests/core/test_rows.py), so the
code the engine runs is the code that is proven exact.

Interface (``Rows``), n rows over V tokens, node = row index:
  prob(node, token) -> float            one entry of the processed row (float64)
  probs_of(nodes, tokens) -> (m,) f64   entries (nodes[i], tokens[i]), one batched gather
  row(node) -> (V,) float64             the full processed row (cached; callers must not write
                                        into it: copy first)
  argmax(node) -> int                   most probable token, lowest id on ties
  support(node) -> (ids, values)        the row's positive entries: ids ascending int64 (a superset
                                        of {x : row[x] > 0}; zeros may be listed), values float64
                                        equal to row(node)[ids] entry by entry. Every law a rule
                                        draws from at a node lies inside supp(p(.|node)), so rules
                                        compute residuals on these few entries (a top-p nucleus)
                                        instead of V (issue 16)
  gather(node, ids) -> (m,) float64     row(node)[ids] entry by entry, without building the row
                                        where the backend can (the draft side of a residual)
  greedy                                True when every row is a point mass at its argmax
                                        (temperature 0): rules then draw nothing from full rows
  dense() -> (n, V) float64             every row (for rules that need all of them)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from verispec.core.rng import Rng
from verispec.errors import InvalidDistributionError

# Candidates read by the first partial selection of a top-p row; nuclei are usually far smaller
# than the vocabulary (the same start as core.sampling._top_p_mask, grown x4 when too small).
TOP_P_FIRST_CANDIDATES = 64


class Rows:
    """Base class of the row providers; see the module docstring for the interface."""

    num_rows: int
    vocab_size: int
    greedy: bool = False

    def row(self, node: int) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def prob(self, node: int, token: int) -> float:
        return float(self.probs_of([node], [token])[0])

    def probs_of(self, nodes: Sequence[int], tokens: Sequence[int]) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def argmax(self, node: int) -> int:
        return int(np.argmax(self.row(node)))

    def support(self, node: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids ascending, row[ids]) over the positive entries; backends override with cheaper forms."""
        row = self.row(node)
        ids = np.flatnonzero(row > 0)
        return ids, row[ids]

    def gather(self, node: int, ids) -> np.ndarray:
        """row(node)[ids] (float64, a new array)."""
        return self.row(node)[np.asarray(ids, dtype=np.int64)]

    def dense(self) -> np.ndarray:
        return np.stack([self.row(node) for node in range(self.num_rows)]) if self.num_rows else np.zeros((0, self.vocab_size))

    def __len__(self) -> int:
        return self.num_rows


class DenseRows(Rows):
    """Rows of an (n, V) float64 array (the reference backend). greedy=True declares every row a
    point mass (one-hot), which lets rules skip drawing from it, as ``LogitRows`` does at T = 0."""

    def __init__(self, probs, greedy: bool = False):
        self.array = np.asarray(probs, dtype=np.float64)
        # a wrong shape is reported by DraftTree.validate, which names the argument
        shape = self.array.shape
        self.num_rows = int(shape[0]) if self.array.ndim else 0
        self.vocab_size = int(shape[-1]) if self.array.ndim else 0
        self.greedy = bool(greedy)

    def row(self, node: int) -> np.ndarray:
        return self.array[node]

    def prob(self, node: int, token: int) -> float:
        return float(self.array[node, token])

    def probs_of(self, nodes, tokens) -> np.ndarray:
        return self.array[np.asarray(nodes, dtype=np.int64), np.asarray(tokens, dtype=np.int64)]

    def gather(self, node: int, ids) -> np.ndarray:
        return self.array[int(node), np.asarray(ids, dtype=np.int64)]

    def dense(self) -> np.ndarray:
        return self.array


class NodeRows(Rows):
    """Rows held per node in a mapping node -> (V,) float64 row; nodes without a row (leaves of a
    draft: nothing was drawn from them) are all zero. The draft side of an engine round: the
    sampler already built the rows it drew from, and stacking them into an (n, V) matrix of
    mostly zero rows would copy n x V floats for nothing."""

    def __init__(self, rows: Mapping[int, np.ndarray], num_rows: int, vocab_size: int, greedy: bool = False):
        self.rows = {int(node): np.asarray(row, dtype=np.float64) for node, row in rows.items()}
        self.num_rows, self.vocab_size, self.greedy = int(num_rows), int(vocab_size), bool(greedy)
        self._zero: np.ndarray | None = None
        self._dense: np.ndarray | None = None

    def row(self, node: int) -> np.ndarray:
        found = self.rows.get(int(node))
        if found is not None:
            return found
        if self._zero is None:
            self._zero = np.zeros(self.vocab_size)
        return self._zero

    def prob(self, node: int, token: int) -> float:
        found = self.rows.get(int(node))
        return 0.0 if found is None else float(found[token])

    def probs_of(self, nodes, tokens) -> np.ndarray:
        return np.array([self.prob(n, t) for n, t in zip(nodes, tokens)], dtype=np.float64)

    def dense(self) -> np.ndarray:
        if self._dense is None:  # built once: rules that read every row ask for it repeatedly
            self._dense = super().dense()
        return self._dense


class LogitRows(Rows):
    """Processed rows of raw logits, computed on demand on the logits' device (ALGORITHMS.md §1
    rule 1; same semantics as ``core.sampling.logits_to_probs``, which builds every row densely).

    logits: (n, V) tensor, any float dtype, any device; params: ``SamplingParams``.

    Per touched row the provider computes once, batched over the rows asked for together:
      shift    the row's max logit (float32 arithmetic, as the softmax of logits_to_probs)
      scaled   s(x) = (logit(x) - shift) / T, float32 on the device
      keep     top-k: s(x) >= s_(k) (ties at the k-th value kept, as logits_to_probs); top-p: the
               most probable tokens by (s desc, id asc) until their mass reaches top_p, found by a
               partial selection (``torch.topk`` of 64, then 256, ...) instead of a full sort; the
               kept set is {s > s_cut} U {s == s_cut and id <= id_cut} (ties at the cut by id,
               exactly ``core.sampling._top_p_mask``)
      log_z    log of the kept mass of exp(s), float64
    and p(x) = exp(float64(s(x)) - log_z) on kept tokens, 0 elsewhere.

    Precision: the sum over the vocabulary is accumulated in float32 (one pass over V, the same
    arithmetic as today's float32 softmax: relative error ~1e-7 on every p(x), far below the 1e-6
    every probability vector is checked against); everything a rule divides or compares (the
    entries, log_z, the top-p cumulative masses, ratios) is float64 (ALGORITHMS.md §1 rule 2).

    Greedy (T = 0): rows are point masses at the argmax (lowest id on ties, as logits_to_probs);
    prob() compares with the argmax and no one-hot vector is built unless row() is called.
    NaN, +inf or all -inf logits raise InvalidDistributionError when their row is touched.
    """

    def __init__(self, logits: torch.Tensor, params):
        if logits.ndim != 2:
            raise InvalidDistributionError(f"logits must be an (n, V) tensor, got shape {tuple(logits.shape)}")
        self.logits = logits.detach()
        self.params = params
        self.num_rows, self.vocab_size = (int(s) for s in logits.shape)
        self.greedy = params.greedy
        self._argmax: dict[int, int] = {}
        # node -> (shift, log_z, kth, s_cut, id_cut); kth / s_cut = -inf keep every token
        self._state: dict[int, tuple[float, float, float, float, int]] = {}
        self._rows: dict[int, np.ndarray] = {}
        self._scaled_rows: dict[int, torch.Tensor] = {}
        self._dense: np.ndarray | None = None

    # ----- per-row preparation (batched over the rows asked for) ---------------------------------
    def _check_rows(self, maxima: torch.Tensor, nodes: Sequence[int]) -> None:
        finite = torch.isfinite(maxima)
        if not bool(finite.all()):
            bad = nodes[int((~finite).nonzero()[0, 0])]
            raise InvalidDistributionError(
                f"row {bad} of the logits holds NaN, +inf or only -inf; check the model weights and "
                "dtype (fp16 can overflow: try bf16 or fp32)"
            )

    def _prepare_argmax(self, nodes: Sequence[int]) -> None:
        missing = [n for n in dict.fromkeys(int(n) for n in nodes) if n not in self._argmax]
        if not missing:
            return
        selected = self.logits[missing].float()
        self._check_rows(selected.amax(dim=-1), missing)  # NaN anywhere in a row makes its max NaN
        if selected.device.type == "cpu":
            # numpy's argmax is the first maximum and several times faster than torch's on CPU
            found = np.argmax(selected.numpy(), axis=-1)
        else:
            found = selected.argmax(dim=-1).cpu().numpy()  # first maximal index (torch documents it)
        self._argmax.update(zip(missing, (int(i) for i in found)))

    def _scaled(self, nodes: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(scaled rows (m, V) float32 with top-k's cut applied as -inf, shifts (m,), the k-th
        largest scaled value (m,) float32, -inf without top-k)."""
        selected = self.logits[list(nodes)].float()
        maxima = selected.amax(dim=-1)  # NaN anywhere in a row makes its max NaN
        self._check_rows(maxima, nodes)
        # subtracting the row maximum first keeps the division finite for tiny temperatures; the
        # max scaled value is then exactly 0
        scaled = selected.sub(maxima[:, None]).div_(self.params.temperature)
        top_k = self.params.top_k
        kth = torch.full_like(maxima, -math.inf)
        if top_k and top_k < self.vocab_size:
            kth = torch.topk(scaled, top_k, dim=-1).values[:, -1]
            scaled = scaled.masked_fill_(scaled < kth[:, None], float("-inf"))
        return scaled, maxima, kth

    def _prepare(self, nodes: Sequence[int]) -> None:
        missing = [n for n in dict.fromkeys(int(n) for n in nodes) if n not in self._state]
        if not missing:
            return
        scaled, maxima, kth = self._scaled(missing)
        # one float32 pass over V for the mass (every scaled value is <= 0, the max exactly 0, so
        # exp cannot overflow and the sum is >= 1); float64 from here on
        log_z = torch.exp(scaled).sum(dim=-1).double().log()
        s_cut = torch.full((len(missing),), -math.inf, dtype=torch.float64)
        id_cut = [self.vocab_size] * len(missing)
        if self.params.top_p < 1.0:
            s_cut, id_cut, log_z = self._nucleus(scaled, log_z)
        maxima, log_z, kth, s_cut = (t.double().cpu().numpy() for t in (maxima, log_z, kth, s_cut))
        for i, node in enumerate(missing):
            self._state[node] = (float(maxima[i]), float(log_z[i]), float(kth[i]), float(s_cut[i]), int(id_cut[i]))
            self._scaled_rows[node] = scaled[i]  # kept for row(): no second pass over the logits

    def _nucleus(self, scaled: torch.Tensor, log_z: torch.Tensor):
        """Top-p cut per row by partial selection (on the rows' device). Returns (s_cut (m,),
        id_cut list, log of the kept mass (m,)).

        Candidates: the tokens with p(x) > eps, found by one comparison pass. If their mass
        reaches top_p, the nucleus (the most probable tokens until their mass reaches top_p) lies
        among them, ties at the cut included (they share p(cut) > eps), and only the candidates
        are sorted, by (p desc, id asc). eps shrinks (1e-3, 3e-5, 1e-6, then (1 - top_p)/(4V),
        below which the rest provably holds less than 1 - top_p) until that holds; the last
        resort, all V tokens, is reached only through rounding."""
        top_p = self.params.top_p
        rows, vocab = scaled.shape
        schedule = [1e-3, 3e-5, 1e-6, (1.0 - top_p) / (4.0 * vocab)]
        threshold = torch.tensor([top_p - 1e-12], dtype=torch.float64, device=scaled.device)
        s_cut = torch.empty(rows, dtype=torch.float64)
        log_kept = torch.empty(rows, dtype=torch.float64)
        id_cut = [vocab] * rows
        for row in range(rows):
            row_log_z = float(log_z[row])
            for eps in [*(e for e in schedule if e >= schedule[-1]), None]:
                if eps is None:
                    candidates = torch.arange(vocab, device=scaled.device)
                else:
                    candidates = torch.nonzero(scaled[row] > row_log_z + math.log(eps)).squeeze(-1)
                values = scaled[row, candidates]
                # nonzero lists ids in increasing order and the sort is stable: ties stay by id
                order = torch.sort(values, descending=True, stable=True).indices
                ordered_values = values[order].double()
                cumulative = torch.cumsum(torch.exp(ordered_values - row_log_z), dim=0)
                crossing = int(torch.searchsorted(cumulative, threshold)[0])
                if crossing < len(candidates) or eps is None:
                    crossing = min(crossing, len(candidates) - 1)
                    break
            s_cut[row] = float(ordered_values[crossing])
            id_cut[row] = int(candidates[order[crossing]])
            log_kept[row] = row_log_z + math.log(float(cumulative[crossing]))
        return s_cut, id_cut, log_kept

    # ----- the interface ------------------------------------------------------------------------
    def argmax(self, node: int) -> int:
        if self.greedy:
            self._prepare_argmax([node])
            return self._argmax[int(node)]
        return int(np.argmax(self.row(node)))

    def probs_of(self, nodes, tokens) -> np.ndarray:
        nodes = [int(n) for n in nodes]
        tokens = [int(t) for t in tokens]
        if not nodes:
            return np.zeros(0)
        if self.greedy:
            self._prepare_argmax(nodes)
            return np.array([1.0 if self._argmax[n] == t else 0.0 for n, t in zip(nodes, tokens)])
        self._prepare(nodes)
        device = self.logits.device
        picked = self.logits[torch.as_tensor(nodes, device=device), torch.as_tensor(tokens, device=device)].float()
        state = np.array([self._state[n] for n in nodes], dtype=np.float64)
        shift = torch.as_tensor(state[:, 0], dtype=torch.float32, device=device)
        # the same float32 expression as the dense row, so prob() and row() agree entry by entry
        scaled = ((picked - shift) / self.params.temperature).double().cpu().numpy()
        log_z, kth, s_cut, id_cut = state[:, 1], state[:, 2], state[:, 3], state[:, 4]
        kept = (scaled >= kth) & ((scaled > s_cut) | ((scaled == s_cut) & (np.asarray(tokens) <= id_cut)))
        with np.errstate(under="ignore"):
            values = np.exp(scaled - log_z)
        return np.where(kept, values, 0.0)

    def dense(self) -> np.ndarray:
        """Every row, (n, V) float64: one batched preparation, then the rows (for the rules that
        read all of them, and for modification windows)."""
        if self._dense is None:
            if self.num_rows and not self.greedy:
                self._prepare(range(self.num_rows))
            self._dense = super().dense()
        return self._dense

    def row(self, node: int) -> np.ndarray:
        node = int(node)
        cached = self._rows.get(node)
        if cached is not None:
            return cached
        if self.greedy:
            result = np.zeros(self.vocab_size)
            result[self.argmax(node)] = 1.0
        else:
            self._prepare([node])
            _, log_z, _, s_cut, id_cut = self._state[node]
            # top-k's cut is already applied as -inf; the row goes to the host once, and the
            # entries use numpy's exp as probs_of does, so row(node)[x] == prob(node, x)
            scaled = self._scaled_rows.pop(node).double().cpu().numpy()
            keep = scaled > s_cut
            if id_cut < self.vocab_size - 1:
                keep |= (scaled == s_cut) & (np.arange(self.vocab_size) <= id_cut)
            else:
                keep |= scaled == s_cut
            with np.errstate(under="ignore"):
                result = np.exp(scaled - log_z)
            result[~keep] = 0.0
        self._rows[node] = result
        return result


def as_rows(value, greedy: bool = False) -> Rows:
    """A ``Rows`` as is; an (n, V) array or list of rows as ``DenseRows``."""
    if isinstance(value, Rows):
        return value
    return DenseRows(value, greedy=greedy)


def draw_from(rng: Rng, target: Rows, node: int, build=None) -> tuple[int, int]:
    """Draw the extra token at ``node``: from ``build()`` -> (law (V,), guard hits), or from the
    target row p(.|node) when ``build`` is None. Returns (token, guard hits).

    Every law a rule draws from at a node (the target row, a residual norm([w p - q]_+) or its
    guard fallback p, NSS's miss law, RRS's t_m, SpecHub's r, traversal's updated P_u) is
    supported inside the support of p(.|node). When the target rows are point masses (greedy)
    that support is {argmax p}, so the draw is that token: no law is built, and no random number
    is used (a draw from a one-point law has no alternative, so the output law is unchanged)."""
    if target.greedy:
        return target.argmax(node), 0
    if build is None:
        return rng.categorical(target.row(node)), 0
    law, guard = build()
    return rng.categorical(law), int(guard)


def draw_on_support(rng: Rng, target: Rows, node: int, build=None) -> tuple[int, int]:
    """``draw_from`` in the coordinates of the target's support at ``node`` (issue 16).

    ids, p = target.support(node); ``build(ids, p)`` -> (law over ids (m,), guard hits), e.g.
    ``residual(p, draft.gather(node, ids))``; the token drawn is ids[categorical(law)]. Without
    ``build`` the draw is from p itself. Exact whenever the law vanishes outside supp(p), which
    holds for every law of the rules (see ``draw_from``): the entries outside the support are 0 in
    the dense law, so a categorical over the support has the same law, and with the same uniform
    the same token (the cumulative sums agree; only the normaliser's summation order differs, by
    rounding). Greedy rows draw nothing (their argmax), as in ``draw_from``."""
    if target.greedy:
        return target.argmax(node), 0
    ids, probs = target.support(node)
    if build is None:
        return int(ids[rng.categorical(probs)]), 0
    law, guard = build(ids, probs)
    return int(ids[rng.categorical(law)]), int(guard)
