"""The passes over the vocabulary behind ``core.rows.LogitRows``: one implementation with NumPy
on views of CPU logits (``HostKernels``) and one in torch on the logits' device (``DeviceKernels``),
with the same methods, and the sort that orders a row's candidates for the top-p cut. Kept apart
from ``rows.py`` because they are the row providers' arithmetic, not their interface.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

# log2(e): exp(x) = exp2(x log2 e); torch's float32 exp2 runs at about twice the speed of its exp
LOG2_E = 1.0 / math.log(2.0)

def order_by_value_then_position(scaled: np.ndarray) -> np.ndarray:
    """Positions of ``scaled`` (float32, <= 0 or -inf) by value descending, then position
    ascending (= id ascending for candidates listed by ascending id): one sort of distinct int64
    keys, the bits of -s above the position (non-negative floats order like their bit patterns),
    several times faster than a stable argsort of the floats."""
    flipped = -scaled + np.float32(0.0)  # >= 0, and -0.0 + 0.0 = +0.0
    keys = (flipped.view(np.uint32).astype(np.int64) << 32) | np.arange(len(scaled), dtype=np.int64)
    return np.sort(keys) & 0xFFFFFFFF


class HostKernels:
    """The passes over V for logits on the CPU: NumPy on views of the rows (no copies; float32
    rows are read in place, other dtypes are converted once per touched row; comparisons, argmax
    and flatnonzero are several times faster in NumPy than in torch here), and torch's
    exponentials on the same memory for the mass (its vectorised exp2 is the fastest
    exponential on this CPU; NumPy's float32 exp is slower than torch's)."""

    def __init__(self, logits: torch.Tensor):
        self.tensor = logits
        # a NumPy view shares the tensor's memory and strides: nothing is copied
        self.array = logits.numpy() if logits.dtype == torch.float32 else None
        self._converted: dict[int, np.ndarray] = {}
        self._buffer: torch.Tensor | None = None

    def row(self, node: int) -> np.ndarray:
        """(V,) float32 NumPy row (a view when the logits are float32)."""
        if self.array is not None:
            return self.array[node]
        found = self._converted.get(node)
        if found is None:
            found = self._converted[node] = self.tensor[node].float().numpy()
        return found

    def maxima(self, nodes: Sequence[int]) -> np.ndarray:
        return np.array([self.row(n).max() for n in nodes], dtype=np.float32)  # NaN propagates

    def masses(self, nodes: Sequence[int], maxima: np.ndarray, temperature: float, exact_terms: bool) -> np.ndarray:
        """sum_x exp(s(x)) per row (see ``LogitRows``: fast = exp2 terms and float32
        accumulation, exact_terms = exp of the float32 s itself and float64 accumulation)."""
        if self._buffer is None:
            self._buffer = torch.empty(self.tensor.shape[1], dtype=torch.float32)
        buffer = self._buffer
        out = np.empty(len(nodes))
        for i, node in enumerate(nodes):
            torch.sub(torch.from_numpy(self.row(node)), float(maxima[i]), out=buffer)
            if exact_terms:
                out[i] = float(buffer.div_(temperature).exp_().sum(dtype=torch.float64))
            else:
                out[i] = float(buffer.mul_(LOG2_E / temperature).exp2_().sum())
        return out

    def above(self, nodes: Sequence[int], thresholds: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per row (ids ascending, float32 logits) of the entries with logit > threshold."""
        found = []
        for node, threshold in zip(nodes, thresholds):
            row = self.row(node)
            ids = np.flatnonzero(row > np.float32(threshold))
            found.append((ids, row[ids]))
        return found

    def kth_largest(self, nodes: Sequence[int], k: int) -> np.ndarray:
        return np.array([torch.topk(torch.from_numpy(self.row(n)), k).values[-1].item() for n in nodes], dtype=np.float32)

    def argmax(self, nodes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(first maximal id, the logit there) per row. NumPy's argmax returns the first NaN of a
        row holding one, so a non-finite value at the argmax flags NaN, +inf and all -inf rows."""
        ids = np.empty(len(nodes), dtype=np.int64)
        values = np.empty(len(nodes), dtype=np.float32)
        if self.array is not None and len(nodes) > 1:  # one row (every plain round): the loop below
            # runs of consecutive rows are read as one 2-D view (np.argmax over a slice copies nothing)
            order = np.argsort(nodes, kind="stable")
            sorted_nodes = np.asarray(nodes, dtype=np.int64)[order]
            breaks = np.flatnonzero(np.diff(sorted_nodes) != 1) + 1
            for positions in np.split(np.arange(len(nodes)), breaks):
                first, last = int(sorted_nodes[positions[0]]), int(sorted_nodes[positions[-1]])
                block = self.array[first : last + 1]
                found = np.argmax(block, axis=1)
                ids[order[positions]] = found
                values[order[positions]] = block[np.arange(len(found)), found]
            return ids, values
        for i, node in enumerate(nodes):
            row = self.row(node)
            ids[i] = int(np.argmax(row))
            values[i] = row[ids[i]]
        return ids, values

    def entries(self, nodes: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        if self.array is not None:
            return self.array[nodes, tokens]
        return self.tensor[torch.from_numpy(nodes), torch.from_numpy(tokens)].float().numpy()

    def full_row(self, node: int) -> np.ndarray:
        return self.row(node)


class DeviceKernels:
    """The passes over V in torch on the logits' device (a GPU: rows selected together are
    processed as one batch, and only small results travel to the host). Also runs on CPU tensors,
    which is how the tests check it against ``HostKernels``."""

    def __init__(self, logits: torch.Tensor):
        self.tensor = logits

    def _rows(self, nodes: Sequence[int]) -> torch.Tensor:
        index = torch.as_tensor(list(nodes), dtype=torch.long, device=self.tensor.device)
        return self.tensor.index_select(0, index).float()

    def maxima(self, nodes: Sequence[int]) -> np.ndarray:
        return self._rows(nodes).amax(dim=-1).cpu().numpy()  # NaN anywhere in a row makes its max NaN

    def masses(self, nodes: Sequence[int], maxima: np.ndarray, temperature: float, exact_terms: bool) -> np.ndarray:
        shifted = self._rows(nodes).sub_(torch.as_tensor(maxima, device=self.tensor.device)[:, None])
        if exact_terms:
            return shifted.div_(temperature).exp_().sum(dim=-1, dtype=torch.float64).cpu().numpy()
        return shifted.mul_(LOG2_E / temperature).exp2_().sum(dim=-1).double().cpu().numpy()

    def above(self, nodes: Sequence[int], thresholds: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        rows = self._rows(nodes)
        cut = torch.as_tensor(np.asarray(thresholds, dtype=np.float32), device=rows.device)
        mask = rows > cut[:, None]
        positions = mask.nonzero().cpu().numpy()  # row-major: ids ascending within each row
        values = rows[mask].cpu().numpy()
        bounds = np.searchsorted(positions[:, 0], np.arange(len(nodes) + 1))
        return [(positions[a:b, 1].astype(np.int64), values[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]

    def kth_largest(self, nodes: Sequence[int], k: int) -> np.ndarray:
        return torch.topk(self._rows(nodes), k, dim=-1).values[:, -1].cpu().numpy()

    def argmax(self, nodes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        rows = self._rows(nodes)
        # amax propagates NaN (documented); the first maximal index is torch's documented argmax
        return rows.argmax(dim=-1).cpu().numpy().astype(np.int64), rows.amax(dim=-1).cpu().numpy()

    def entries(self, nodes: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        device = self.tensor.device
        return self.tensor[torch.as_tensor(nodes, device=device), torch.as_tensor(tokens, device=device)].float().cpu().numpy()

    def full_row(self, node: int) -> np.ndarray:
        return self.tensor[int(node)].float().cpu().numpy()


KERNELS = ("auto", "host", "device")
