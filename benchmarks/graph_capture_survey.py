"""Which kernels' passes can be captured in a CUDA graph, and what the replay saves per call.

Runs single cells through longca's one cell runner (`longca.run.cell.run_cell`) on a CUDA device
with `repeat.graph: true`, for each kernel and pass asked for, and prints one JSON line per row:
the eager median, the replayed median (or `graph_reason`: why there is none), their ratio and
the capture attempts that failed before the last (`capture_retries`);
with `--out`, the same lines go to that file too (libraries print to stdout as they compile). A
survey before a sweep relies on the capture (its cells record the same columns), on any card: it
names no GPU model.

    python benchmarks/graph_capture_survey.py --kernels fa4,flex_fa4,cudnn_flex,flex,sdpa_cudnn \
        --masks causal,causal_document --seqlens 1K,4K --passes fwd,bwd --out survey.jsonl
"""

from __future__ import annotations

import argparse
import json
import warnings

from longca.measure.graphs import CaptureRetryWarning
from longca.run.cell import run_cell
from longca.spec.cells import expand
from longca.spec.load import load_spec

REPEAT = (
    "warmup: 3, warmup_s: 0.05, iters: 1000, min_iters: 3, budget_s: 1.0, ci_target: 0.01, "
    "l2_flush: true, backward: retained_graph, graph: true"
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernels", required=True, help="comma-separated kernel names")
    p.add_argument("--masks", default="causal", help="comma-separated masks (default causal)")
    p.add_argument("--seqlens", default="1K", help="comma-separated lengths (default 1K)")
    p.add_argument("--passes", default="fwd,bwd", help="comma-separated passes (default fwd,bwd)")
    p.add_argument("--heads", default="64:8", help="heads q:kv (default 64:8)")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--out", help="also write the JSON lines to this file")
    args = p.parse_args(argv)
    out = open(args.out, "w", encoding="utf-8") if args.out else None  # noqa: SIM115 - open for the whole run
    spec = load_spec(
        text=f"""
name: graph-capture-survey
device: cuda
repeat: {{{REPEAT}}}
check: {{max_seqlen: 8192}}
mask_samples: {{multi_document: 1, single: 1}}
kernels: [{args.kernels}]
masks: [{args.masks}]
seqlens: [{args.seqlens}]
heads: ["{args.heads}"]
head_dims: [{args.head_dim}]
dtypes: [bfloat16]
passes: [{args.passes}]
sweeps: [{{name: survey}}]
"""
    )
    for cell in expand(spec):
        with warnings.catch_warnings(record=True) as retries:
            warnings.simplefilter("always", CaptureRetryWarning)
            rows = run_cell(cell)
        for row in rows:
            eager, graph = row.get("median_ms"), row.get("graph_median_ms")
            line = {
                "kernel": cell.kernel,
                "mask": cell.mask,
                "seqlen": cell.seqlen,
                "pass": cell.pass_,
                "status": row["status"],
                "eager_ms": eager,
                "graph_ms": graph,
                "graph_over_eager": graph / eager if eager and graph else None,
                "graph_reason": row.get("graph_reason"),
                "reason": row.get("reason"),
                # failed capture attempts before the one that gave graph_ms or graph_reason (the cell's)
                "capture_retries": [str(w.message) for w in retries if w.category is CaptureRetryWarning],
            }
            print(json.dumps(line), flush=True)
            if out is not None:
                out.write(json.dumps(line) + "\n")
                out.flush()
    if out is not None:
        out.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
