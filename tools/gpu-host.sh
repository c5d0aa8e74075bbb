#!/usr/bin/env bash
# Run any spec on a GPU host without network, for at most LIMIT_S seconds, continuing where the
# committed results stop (docs/gpu-host.md).
#
#   bash tools/gpu-host.sh OUTDIR SPEC [LIMIT_S] [longca run arguments...]
#   e.g. bash tools/gpu-host.sh "$OUT" specs/h200.yaml 540 --sweep dense --only seqlen=32K
#
# 1. Carried packages are unpacked: wheels in .whl/ and .whl-*/ (pip --target $TMPDIR/site, /tmp by default),
#    every bundle .bundles/NAME.tar.xz (a packed site folder, e.g. FlashAttention-4's from
#    ../shared/tools/pack-fa4.sh) into $TMPDIR/bundles/NAME on PYTHONPATH, FA4's compiled-kernel
#    cache .fa4-cache/fa4-cache.tar.xz and
#    Triton's autotune cache .triton-autotune/triton-autotune.tar.gz (what an earlier call returned),
#    each only when present. With LONGCA_GPU_TESTS="tests/... -k ...", those tests run first
#    (pytest, log in OUTDIR/gpu-tests.log). With LONGCA_GPU_BENCH="benchmarks/X.py ARGS", that script
#    runs next with the same packages on its path ({out} in ARGS is OUTDIR; log in OUTDIR/bench.log).
#    Before any bundle is unpacked, a spec that names its GPU (`gpu_model`) is checked against this
#    machine's cards: another model ends the call (exit 4, OUTDIR/gpu-model.log, nothing measured).
# 2. The spec's committed aggregate (results/<name>/all.parquet) is unpacked into cell files, so
#    this call runs only the cells still missing.
# 3. `longca run` measures them, one process per visible GPU (`--shard g/N`), stopped by SIGTERM
#    (the chunk supervisor ends its workers and records nothing half-written) when time is up.
# 4. OUTDIR gets <name>.parquet (the committed rows plus this call's), logs.tar.gz, env.txt and
#    the two caches for the next call (FA4's compiled kernels, Triton's autotuning choices), and
#    draws.tar.gz: the finished draws of cells stopped by the time limit (carry it as
#    .draws/draws.tar.gz; the next call measures only their other draws).
#    Copy <name>.parquet to results/<name>/all.parquet, commit, and call again until
#    `longca plan SPEC --rows results/<name>/all.parquet` lists nothing to run. With `--results DIR`
#    among the run's arguments (a re-run check into another folder), nothing is restored and
#    <name>.parquet is that folder's aggregate.
set -u
out=${1:?usage: gpu-host.sh OUTDIR SPEC [LIMIT_S] [longca run arguments...]}
spec=${2:?usage: gpu-host.sh OUTDIR SPEC [LIMIT_S] [longca run arguments...]}
limit=${3:-540}
shift $(( $# < 3 ? $# : 3 ))
start=$SECONDS
mkdir -p "$out"
logs=$(mktemp -d)
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
host_tmp=${TMPDIR:-/tmp}  # where the carried packages go (a test points it elsewhere)
export FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=$host_tmp/fa4-jit-cache TRITON_CACHE_DIR=$PWD/.triton-cache
mkdir -p "$FLASH_ATTENTION_CUTE_DSL_CACHE_DIR" "$TRITON_CACHE_DIR"

# 1. carried packages and caches. The wheels come first: `longca unpack` below imports them
#    (jsonschema). The bundles and caches unpack in the background; restoring the cells needs none.
wheels=$(ls .whl/*.whl .whl-*/*.whl 2>/dev/null)  # .whl-linear/ (fla-core) travels only when needed
[ -n "$wheels" ] && python3 -m pip install -q --no-index --no-deps --no-compile --target "$host_tmp/site" $wheels > "$logs/setup.log" 2>&1
# A lent card of another model than the spec's `gpu_model` (an H100 for an H200) ends the call here,
# before the bundles are unpacked: `longca run` would refuse it too, but only after the set-up.
if ! PYTHONPATH=$PWD:$host_tmp/site python3 -m longca.cli validate --gpu "$spec" > "$logs/gpu-model.log" 2>&1; then
  echo "gpu-host: the spec failed its check against this machine's GPUs (gpu_model); nothing was measured:" >&2
  tail -n 3 "$logs/gpu-model.log" >&2
  cp "$logs/gpu-model.log" "$out/gpu-model.log"
  exit 4
fi
(
  for b in .bundles/*.tar.xz; do
    [ -f "$b" ] && mkdir -p "$host_tmp/bundles/$(basename "$b" .tar.xz)" && tar xJf "$b" -C "$host_tmp/bundles/$(basename "$b" .tar.xz)"
  done
  [ -f .fa4-cache/fa4-cache.tar.xz ] && tar xJf .fa4-cache/fa4-cache.tar.xz -C "$FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"
  [ -f .triton-autotune/triton-autotune.tar.gz ] && tar xzf .triton-autotune/triton-autotune.tar.gz -C "$TRITON_CACHE_DIR"
  true
) >> "$logs/setup.log" 2>&1 &
unpacking=$!
# 2. the committed cells of this spec. A failed unpack stops the call: without the committed cells
#    every cell would be measured again, spending the GPU time on rows that exist.
name=$(python3 -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["name"])' "$spec")
# The set: a CUDA spec that names no card (`gpu_model`) puts its rows in the set of the card it runs
# on, results/<card>/<name>/ (results/h100/core/); the others keep results/<name>/
root=$(PYTHONPATH=$PWD:$host_tmp/site python3 -c '
import sys, yaml
spec = yaml.safe_load(open(sys.argv[1]))
if spec.get("device") == "cuda" and not spec.get("gpu_model"):
    from longca.measure.env import this_card_set
    print("results/" + this_card_set("cuda"))
else:
    print("results")
' "$spec") || { echo "gpu-host: no result set for $spec on this machine" >&2; exit 4; }
agg=$root/$name/all.parquet
# A run into another folder (`--results DIR`: a re-run check with `--sample`) is a set of its own:
# nothing committed is restored into it, and what comes back is its aggregate (cell files under
# OUTDIR would be nested too deep to be returned).
results_dir=$root prev= own_results=no
for a in "$@"; do
  [ "$prev" = --results ] && results_dir=$a own_results=yes
  case $a in --results=*) results_dir=${a#--results=} own_results=yes ;; esac
  prev=$a
done
restore=yes; [ "$(realpath -m "$results_dir")" = "$(realpath -m "$root")" ] || restore=no
set_args=(); [ "$own_results" = no ] && set_args=(--results "$root")
echo "gpu-host: the set is $root (spec $name)"
if [ "$restore" = yes ] && [ -f "$agg" ] && ! PYTHONPATH=$PWD:$host_tmp/site python3 -m longca.cli unpack "$agg" --results "$root" >> "$logs/unpack.log" 2>&1; then
  echo "gpu-host: unpacking $agg failed; nothing was measured:" >&2
  tail -n 5 "$logs/unpack.log" >&2
  cp "$logs/unpack.log" "$out/unpack.log"
  kill "$unpacking" 2>/dev/null
  exit 3
fi
[ -f "$logs/unpack.log" ] && tail -n 1 "$logs/unpack.log"
# the finished draws of cells an earlier call stopped inside (OUTDIR/draws.tar.gz of that call)
[ "$restore" = yes ] && [ -f .draws/draws.tar.gz ] && tar xzf .draws/draws.tar.gz && echo "draws of unfinished cells restored"
wait "$unpacking"
# every process below imports the carried packages: the wheels' site and each bundle (with CuTe
# DSL's dsl_packages, since .pth files are not read from PYTHONPATH)
PYTHONPATH=$PWD:$host_tmp/site
for d in "$host_tmp"/bundles/*; do
  [ -d "$d" ] && PYTHONPATH=$PYTHONPATH:$d
  [ -d "$d/nvidia_cutlass_dsl/dsl_packages" ] && PYTHONPATH=$PYTHONPATH:$d/nvidia_cutlass_dsl/dsl_packages
done
export PYTHONPATH
{ nvidia-smi; python3 -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda,
  "triton", triton.__version__)'; echo "set-up: $((SECONDS - start)) s"; } > "$out/env.txt" 2>&1
ngpu=$(python3 -c 'import torch; print(max(1, torch.cuda.device_count()))')
if [ -n "${LONGCA_GPU_TESTS:-}" ]; then
  # shellcheck disable=SC2086  (the variable holds pytest's arguments)
  timeout -k 10 $(( limit / 2 )) python3 -m pytest -q -p no:cacheprovider $LONGCA_GPU_TESTS > "$out/gpu-tests.log" 2>&1
  tail -n 5 "$out/gpu-tests.log"
fi
if [ -n "${LONGCA_GPU_BENCH:-}" ]; then
  # shellcheck disable=SC2086  (the variable holds the script and its arguments)
  timeout -k 10 $(( limit / 2 )) python3 ${LONGCA_GPU_BENCH//\{out\}/$out} > "$out/bench.log" 2>&1
  tail -n 5 "$out/bench.log"
fi

# 3. the missing cells, one process per GPU, stopped when the time is up (40 s kept for step 4);
#    with the projection gpu-calls.sh writes (results/<name>/estimates.parquet), a draw that would not
#    finish in the time left is not started (longca/run/time_left.py)
left=$(( limit - (SECONDS - start) - 40 ))
est=$root/$name/estimates.parquet
fit=(); [ -f "$est" ] && fit=(--time-left "$(( left - 5 ))" --estimates "$est")
if [ "$left" -gt 10 ]; then
  for ((g = 0; g < ngpu; g++)); do
    shard=(); [ "$ngpu" -gt 1 ] && shard=(--shard "$g/$ngpu")
    (
      t0=$(date +%s.%N)
      timeout -k 10 -s TERM "$left" python3 -m longca.cli run --spec "$spec" "${set_args[@]}" "$@" "${shard[@]}" "${fit[@]}"
      # the process's whole wall, start-up included: what tools/sweep_efficiency.py divides by
      echo "process wall $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s: --spec $spec $* ${shard[*]}"
    ) > "$logs/run-$g.log" 2>&1 &
  done
  wait
fi

# 4. what comes back
keep=(); [ "$restore" = yes ] && [ -f "$agg" ] && keep=(--keep "$agg")
python3 -m longca.cli aggregate --spec "$spec" --results "$results_dir" --present-only "${keep[@]}" \
  --out "$out/$name.parquet" > "$logs/aggregate.log" 2>&1
python3 -m longca.cli plan "$spec" --rows "$out/$name.parquet" > "$out/plan.txt" 2>&1
# draws finished inside cells the time limit stopped (longca/store/draws.py): the next call's .draws/
find "$results_dir/$name/cells" -name 'cell-*.draw-*.partial' 2>/dev/null | while read -r d; do
  [ -f "${d%.draw-*}.parquet" ] || echo "$d"  # a written cell needs its draws no more
done > "$logs/draws.txt"
[ -s "$logs/draws.txt" ] && tar -czf "$out/draws.tar.gz" -T "$logs/draws.txt" \
  && echo "gpu-host: $(wc -l < "$logs/draws.txt") finished draws of unfinished cells in draws.tar.gz"
tar -C "$logs" -czf "$out/logs.tar.gz" .
tar -C "$FLASH_ATTENTION_CUTE_DSL_CACHE_DIR" -cJf "$out/fa4-cache.tar.xz" . 2>/dev/null
# Triton's cache: only the autotuning choices (`*.autotune.json`, what TRITON_CACHE_AUTOTUNING
# writes). With the compiled kernels beside them the cache outgrew what a lent machine returns (16
# MiB a file), and compiling the chosen configuration again takes seconds, tuning minutes.
(cd "$TRITON_CACHE_DIR" && find . -name '*.autotune.json' -print0 | tar --null -czf "$out/triton-autotune.tar.gz" -T -) 2>/dev/null
tail -n 3 "$logs"/run-*.log "$logs/aggregate.log" 2>/dev/null
head -n 1 "$out/plan.txt"
echo "gpu-host: $((SECONDS - start)) s"
