#!/usr/bin/env bash
# The workstation side of a series of tools/gpu-host.sh calls on a lent machine whose working tree
# is capped in size (docs/gpu-host.md): the published results/ and reports/ leave the tree, each
# call carries only its selection's rows, and the calls' aggregates join the published set at the end.
#
#   bash tools/gpu-calls.sh start  SPEC [selection...]            before the first call
#   bash tools/gpu-calls.sh next   SPEC CALL_OUT [selection...]   after a call, before the next one
#   bash tools/gpu-calls.sh finish SPEC CALL_OUT [CALL_OUT...]    after the last call (oldest first)
#
# selection: `longca plan` arguments (--sweep, --only), the same as the calls'. CALL_OUT: a call's
# returned OUTDIR (its <name>.parquet, caches, draws.tar.gz).
#   start   moves results/ and reports/ to $LONGCA_PUBLISHED (default /tmp/published) and writes the
#           selection's published rows as results/<name>/all.parquet, for the first call to carry,
#           and each left cell's projected seconds from the published rows as
#           results/<name>/estimates.parquet (tools/sweep_projection.py --cells-out): gpu-host.sh then
#           starts only draws that fit in a call's time left.
#   next    keeps the call's returned caches and kept draws for the next call (.fa4-cache/,
#           .triton-autotune/, .draws/), and writes the selection's rows of the published set and of
#           that call (its rows win) as results/<name>/all.parquet.
#   finish  puts results/ and reports/ back and merges into results/<name>/all.parquet the calls'
#           aggregates, the last first (each carried the ones before), then the published rows of
#           every other cell; stops before writing if a row would be there twice. Cells moved out to
#           results/<name>/reruns.parquet for the calls (tools/move_cells.py) that no call measured
#           again go back with their rows.
# Not for re-run checks (`--results DIR`): their aggregate is a set of its own (docs/measurement.md).
set -euo pipefail
cmd=${1:?usage: gpu-calls.sh start|next|finish SPEC ...}
spec=${2:?usage: gpu-calls.sh start|next|finish SPEC ...}
shift 2
published=${LONGCA_PUBLISHED:-/tmp/published}
name=$(python3 -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["name"])' "$spec")
agg=results/$name/all.parquet

selection_rows() {  # "$@": the selection; rows of the published set, then of $call_rows (they win)
  local rows=(--rows "$published/$agg")
  [ -n "${call_rows:-}" ] && rows+=(--rows "$call_rows")
  mkdir -p "results/$name"
  python3 -m longca.cli plan "$spec" "${rows[@]}" "$@" --rows-out "$agg"
}

case $cmd in
  start)
    if [ -e "$published/results" ] || [ -e "$published/reports" ]; then
      echo "gpu-calls: $published already holds a published set (finish the last series, or remove it)" >&2
      exit 2
    fi
    [ -f "$agg" ] || { echo "gpu-calls: no $agg to start from" >&2; exit 2; }
    mkdir -p "$published"
    mv results "$published/results"
    [ -d reports ] && mv reports "$published/reports"
    selection_rows "$@"
    python3 "$(dirname "$0")/sweep_projection.py" --rows "$published/$agg" --spec "$spec" \
      --cells-out "results/$name/estimates.parquet" | sed -n 1p  # sed reads it all: no SIGPIPE
    ;;
  next)
    call=${1:?usage: gpu-calls.sh next SPEC CALL_OUT [selection...]}
    shift
    [ -f "$call/$name.parquet" ] || { echo "gpu-calls: $call has no $name.parquet" >&2; exit 2; }
    [ -f "$call/fa4-cache.tar.xz" ] && mkdir -p .fa4-cache && cp -f "$call/fa4-cache.tar.xz" .fa4-cache/
    [ -f "$call/triton-autotune.tar.gz" ] && mkdir -p .triton-autotune \
      && cp -f "$call/triton-autotune.tar.gz" .triton-autotune/
    # the call packed every draw still unfinished, the ones it was given included: it replaces them
    mkdir -p .draws && rm -f .draws/draws.tar.gz
    [ -f "$call/draws.tar.gz" ] && cp "$call/draws.tar.gz" .draws/
    chmod -R u+w .fa4-cache .triton-autotune .draws 2>/dev/null || true
    call_rows=$call/$name.parquet selection_rows "$@"
    ;;
  finish)
    [ $# -ge 1 ] || { echo "usage: gpu-calls.sh finish SPEC CALL_OUT [CALL_OUT...]" >&2; exit 2; }
    for call in "$@"; do
      [ -f "$call/$name.parquet" ] || { echo "gpu-calls: $call has no $name.parquet" >&2; exit 2; }
    done
    [ -f "$published/$agg" ] || { echo "gpu-calls: no published $published/$agg" >&2; exit 2; }
    merged=$(mktemp --suffix=.parquet)
    calls=("$@") olders=()
    cp "${calls[-1]}/$name.parquet" "$merged" && chmod u+w "$merged"
    for ((i = ${#calls[@]} - 2; i >= 0; i--)); do olders+=("${calls[$i]}/$name.parquet"); done
    python3 - "$merged" "${olders[@]}" "$published/$agg" <<'EOF'
import sys

import duckdb

from longca.store.aggregate import keep_rows_outside, repeated_rows

merged, *older = sys.argv[1:]
for path in older:
    print(f"{path}: {keep_rows_outside(merged, path)} rows of cells the newer calls lack")
twice = repeated_rows(merged)
if twice:
    sys.exit(f"gpu-calls: {len(twice)} rows would be in the set twice, e.g. {twice[0]}; nothing written ({merged})")
rows, cells = duckdb.execute("SELECT count(*), count(DISTINCT cell_digest) FROM read_parquet(?)", [merged]).fetchone()
print(f"merged: {rows} rows of {cells} cells")
EOF
    rm -rf results reports
    mv "$published/results" results
    [ -d "$published/reports" ] && mv "$published/reports" reports
    rmdir "$published" 2>/dev/null || true
    cp "$merged" "$agg" && rm -f "$merged"
    # cells moved to the re-run table before the calls (tools/move_cells.py) that no call measured
    # again go back with their published rows: else they would be missing from the published set
    reruns=results/$name/reruns.parquet
    [ -f "$reruns" ] && python3 - "$spec" "$agg" "$reruns" <<'EOF'
import sys

import duckdb

from longca.spec.cells import expand
from longca.spec.load import load_spec
from longca.store.aggregate import move_cells

spec, agg, reruns = sys.argv[1:]
current = {c.digest for c in expand(load_spec(spec))}
held = {d for (d,) in duckdb.execute("SELECT DISTINCT cell_digest FROM read_parquet(?)", [agg]).fetchall()}
moved = {d for (d,) in duckdb.execute("SELECT DISTINCT cell_digest FROM read_parquet(?)", [reruns]).fetchall()}
back = sorted((moved & current) - held)  # current cells with rows only in the re-run table
if back:
    rows, cells, _ = move_cells(reruns, agg, "cell_digest IN (" + ", ".join(f"'{d}'" for d in back) + ")")
    print(f"gpu-calls: {cells} moved cells no call measured again: back in {agg} with their {rows} rows")
EOF
    echo "gpu-calls: $agg written; rebuild the report (the set's README has the command) and commit"
    ;;
  *)
    echo "gpu-calls: unknown command $cmd (allowed: start, next, finish)" >&2
    exit 2
    ;;
esac
