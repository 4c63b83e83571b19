"""``verispec compare``: every lossless rule on the same recorded draft trees, and the papers'
claims checked with paired intervals.

One module per stage:

- ``recording``: stage 1, ``record``: the grid of live configurations; the live engine decodes
  held-out prompts and keeps every verified tree, one ``.npz`` per (point, seed) under ``OUT/trees``.
- ``replaying``: stage 2, ``report``: every rule re-verifies the recorded trees with common random
  numbers; per-tree values cached under ``OUT/replay``.
- ``claims``: the papers' claims, each with a paired 95% interval over (prompt, seed) clusters.
- ``plots``: block efficiency along each swept factor, and the live runs' time per round.
- ``report``: claims.md, claims.json, compare.csv and the plots.
- ``live``: each rule at its best replayed point, decoded live beside plain decoding (tokens/s).

The names the CLI and the tests use are re-exported here.
"""

from verispec.bench.compare.claims import (
    CANNOT_TELL, FAILS, HOLDS, ClaimRow, claims, claims_markdown, cluster_bootstrap_ratio, verdict,
)
from verispec.bench.compare.live import LiveBest, live_best_markdown, run_live_best
from verispec.bench.compare.plots import plot_block_efficiency
from verispec.bench.compare.recording import GridPoint, RecordConfig, default_grid, make_grid, record_grid
from verispec.bench.compare.replaying import (
    ReplayedRecording, by_point, expected_block_efficiency_given_chain, replay_all,
)
from verispec.bench.compare.report import write_compare_report

__all__ = [
    "CANNOT_TELL", "FAILS", "HOLDS", "ClaimRow", "GridPoint", "LiveBest", "RecordConfig", "ReplayedRecording",
    "by_point", "claims", "claims_markdown", "cluster_bootstrap_ratio", "default_grid", "expected_block_efficiency_given_chain",
    "live_best_markdown", "make_grid", "plot_block_efficiency", "record_grid", "replay_all", "run_live_best", "verdict",
    "write_compare_report",
]
