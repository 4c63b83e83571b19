"""Cost of one seeded (drafter-invariant) draw against a categorical draw, and against the seeded
draw as it was before the noise cache handed out views (kept below verbatim as ``before_*``).

Usage:
    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/seeded_draw.py [--vocab 49152] [--draws 400]
        [--temperature 0.6] [--top-p 1.0 0.9]

Per draw a fresh ``LogitRows`` over synthetic float32 logits (3 x standard normal, one (1, V)
row), the token at a new absolute position (so the noise is generated, as in decoding: a
position's noise is made once, when the draft or the target first reads it). Three variants run
interleaved on the same rows (categorical, before, after, categorical, before, ...):

  categorical  ``draw_from(SeededRng, rows, 0)``: exact in law, not drafter-invariant
  before       Philox words, then shift / scale / log in fresh temporaries, then a gather of the
               support's ids and the race, with a separate all-zero check
  after        ``core.noise.gumbel_argmax``: the same words and roundings in one in-place buffer,
               the cache read as a view when the support is the whole vocabulary

Checks that before and after draw the same token every time (they must: same noise, same race),
then prints the median and p90 milliseconds of each. Times are of this machine at this moment;
only the ratios within one run mean anything on a shared machine.
"""

from __future__ import annotations

import argparse
import gc
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from verispec.core.noise import GumbelNoise, gumbel_argmax  # noqa: E402
from verispec.core.rng import SeededRng  # noqa: E402
from verispec.core.rows import LogitRows, draw_from  # noqa: E402
from verispec.core.sampling import SamplingParams  # noqa: E402


def before_exponentials(seed: int, position: int, ids: np.ndarray) -> np.ndarray:
    ids = np.asarray(ids, dtype=np.int64)
    size = int(ids.max()) + 1
    words = np.random.Philox(key=seed, counter=[0, position, 0, 0]).random_raw(size)
    uniform = ((words >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53
    return (-np.log(uniform))[ids]


def before_draw(rows, seed: int, position: int) -> int:
    ids, probs = rows.support(0)
    ids = np.asarray(ids, dtype=np.int64)
    probs = np.asarray(probs, dtype=np.float64)
    if not (probs > 0).any():
        raise ValueError("all zero")
    if len(ids) == 1:
        return int(ids[0])
    return int(ids[int(np.argmax(probs / before_exponentials(seed, position, ids)))])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--draws", type=int, default=400)
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--top-p", type=float, nargs="+", default=[1.0, 0.9])
    args = parser.parse_args()
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    logits = [torch.randn(1, args.vocab, generator=generator) * 3 for _ in range(args.draws)]
    print(f"# V = {args.vocab}, T = {args.temperature}, {args.draws} draws per variant, interleaved; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'top_p':>5} {'categorical ms':>15} {'before ms':>10} {'after ms':>9} {'after/before':>12}  (median, p90)")
    for top_p in args.top_p:
        params = SamplingParams(args.temperature, 0, top_p)
        noise, rng = GumbelNoise(7), SeededRng(7)
        times = {"categorical": [], "before": [], "after": []}
        gc.disable()
        try:
            for position, row in enumerate(logits):
                tic = time.perf_counter()
                draw_from(rng, LogitRows(row, params), 0)
                times["categorical"].append(time.perf_counter() - tic)
                tic = time.perf_counter()
                old = before_draw(LogitRows(row, params), 7, position)
                times["before"].append(time.perf_counter() - tic)
                tic = time.perf_counter()
                new = gumbel_argmax(LogitRows(row, params), 0, noise, position)
                times["after"].append(time.perf_counter() - tic)
                if old != new:
                    raise SystemExit(f"before and after drew different tokens at position {position}: {old} != {new}")
        finally:
            gc.enable()
        cells = {name: (1e3 * np.median(t), 1e3 * np.percentile(t, 90)) for name, t in times.items()}
        print(f"{top_p:>5} " + " ".join(f"{cells[n][0]:>6.3f} / {cells[n][1]:.3f}".rjust(w)
                                        for n, w in (("categorical", 15), ("before", 10), ("after", 9)))
              + f" {cells['after'][0] / cells['before'][0]:>12.2f}")


if __name__ == "__main__":
    main()
