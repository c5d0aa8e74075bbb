#!/usr/bin/env bash
# One call on a GPU host without network (the project's H200 runs): unpack carried packages,
# run a stage for at most LIMIT seconds, and leave in OUTDIR the aggregates (h200.parquet, h200-cp.parquet),
# logs.tar.gz, triton-autotune.tar.gz (Triton's autotune choices, to carry into the next call) and
# fa4-cache.tar.xz (FA4's compiled kernels; carry it in .fa4-cache/ within one sweep).
# Results land under results/ exactly as a Snakemake run would write them, so a later call (or a
# Snakemake run) only adds the missing cells.
#   usage: tools/h200_call.sh OUTDIR STAGE[+STAGE...] [LIMIT_S]   (stages joined by + run in order)
#   stages (each runs only the cells still missing; calls 1-9 ran earlier stages, in git history):
#     single            every single-GPU sweep of specs/h200.yaml but sparse and linear, sharded
#                       over the GPUs (FA4 needed); RETRY="--retry error" reruns error rows
#     dense             the dense sweep alone, one `longca run` per GPU (without .bundles, all but
#                       FA4's cells, which stay missing): since the
#                       sweep-efficiency protocol (issue 4) every dense cell has a new digest; calls
#                       continue it until complete. Each process's wall is logged as `process wall`
#                       (tools/sweep_efficiency.py sums them against the rows' timed samples)
#     shapes            the shapes sweep (head dims 64 and 256 in bf16, 128 in fp16, all three in fp8,
#                       at 4K and 16K), one `longca run` per GPU (without .bundles, as for dense, but
#                       FA4's fp8 rows, planned `unsupported`, are written)
#     sparse            the sparse sweep on all GPUs, Triton first, then Flex, then VSA's Triton
#                       kernel (carry the vsa wheel and pytest's wheels in .whl-sparse/ for it), then
#                       FlashInfer and block-sparse FA2 (unsupported rows where not installed)
#     flex_long         Flex's long-context cells (64K-512K, the no-Flex-OOM goal), then Flex's
#                       sparse cells, sharded over the GPUs (no FA4 needed)
#     linear_sparse     fla autotuning warmed in parallel (PREWARM_S seconds, 0 to skip when the
#                       autotune cache is carried), then the linear sweeps (GPU 0: two kernels and
#                       linear_softmax, GPU 1: the other two), then the sparse sweep on both
#     cp                specs/h200-cp.yaml on all GPUs, sweep by sweep in priority order; RETRY as for single
#     linear_sparse_cp  linear_sparse for SPLIT_S seconds, then cp
#     sparse_tune       Triton block-sparse tiles tuned (benchmarks/sparse_triton.py --tune-only)
#     checks            timer fidelity, FA4 smoke test and the sparse kernel check on GPU 0
#     sparse_goal       the Triton block-sparse goal shape against dense cuDNN (sparse_triton.py headline)
#     fidelity          the timer fidelity check alone (FIDELITY_ROUNDS rounds, default 3) on GPU 0;
#                       FIDELITY_ARGS="--spec specs/h200.yaml --sweep dense" times longca under that
#                       sweep's protocol (default: 5 warm-up and 20 timed calls)
#     sparse_long       the sparse_long sweep (256K, 512K), Triton first, then Flex (no FA4 needed)
#     long_fp8          Flex's fp8 forward at 64K-512K (the long_fp8 sweep; no FA4 needed)
#     sparse_fp8        fp8 block-sparse forwards, Triton then Flex (the sparse_fp8 sweep)
#     baselines         the dense_baselines sweep, sharded over the GPUs (no FA4 needed)
#     long_rest         the long sweep's other kernels, FA4 first, then cuDNN, then the rest,
#                       sharded over the GPUs (FA4 needed)
#     dense_probe       where a dense cell's wall time goes (schema-2 phase columns): the dense
#                       sweep's cuDNN cells at PROBE_SEQLEN (default 32K) measured again into a
#                       scratch results folder, returned as OUTDIR/dense-probe.parquet (the
#                       committed rows stay as they are)
#     efficiency_probe  dense_probe, then the same 48 cells under specs/h200-efficiency-probe.yaml's
#                       protocol (warm-up cut at 50 ms, 10-50 timed calls in 2 s, backward on one
#                       retained graph) into another scratch folder, returned as
#                       OUTDIR/efficiency-probe.parquet (no FA4 needed)
#     efficiency_range  the probe spec's dense_range sweep (or RANGE_SWEEP; kernels RANGE_KERNELS, default
#                       cuDNN, then Flex: 4 masks x 1K-48K, GQA, fwd and bwd) under the same
#                       protocol, one process per kernel, into a scratch
#                       folder, returned as OUTDIR/efficiency-range.parquet; each process's whole
#                       wall (start-up included) is logged as `process wall` (no FA4 needed)
#     efficiency_sweep  the dense_range sweep as a user runs it: both kernels in one process (they
#                       share correctness references), returned as OUTDIR/efficiency-sweep.parquet
#     cp_local          one rank's Ring P2P forward at a time on GPU 0 (benchmarks/cp_rank_local.py:
#                       every participant's K/V in memory, nothing sent): its local work against
#                       single-GPU cuDNN, causal and full, 32K and 64K per GPU, GQA and MHA, each
#                       rank checked first; log cp_local.log, rows cp_local.json; CP_LOCAL_PASS=bwd
#                       times the ranks' backward (steps' bwd on the combined out/LSE) instead
#     cp_local_flex     one rank's Ring P2P work at a time on GPU 0 with Flex per rank (cp_rank_local.py),
#                       for each pass in CP_FLEX_PASSES (default "fwd bwd"): the backward times each
#                       step's backward on the combined out/LSE (longca.cp.flex_backward) and, beside
#                       it, through autograd (the forward run again, as before call 54); the four
#                       heterogeneous masks of call 19 and causal at 32K per GPU, GQA 64:8, against
#                       single-GPU Flex (CP_FLEX_MASKS, CP_FLEX_TOKENS override masks and tokens per GPU;
#                       CP_FLEX_SINGLE=none skips the single-GPU baseline, to compare with sweep rows);
#                       logs cp_local_flex_PASS.log, rows cp_local_flex_PASS.json
#                       (call 54 ran the backward alone, as the stage cp_local_bwd)
#     cooldown_probe    the probe spec's dense_sustained sweep (12 cuDNN cells under the dense
#                       sweep's protocol), then dense_cooldown (the same with 2 s idle before each
#                       row), one scratch folder, returned as OUTDIR/cooldown-probe.parquet (no FA4 needed)
#     burst_probe       dense_sustained again, then dense_burst (the same 12 cells as 20-call bursts after
#                       2 s idle: boost-clock figures), returned as OUTDIR/burst-probe.parquet (no FA4 needed)
#     workflow          Snakemake itself on this host (carry snakemake's wheels in .whl-snakemake/):
#                       specs/h200-workflow.yaml with `snakemake --cores 16` (four GPU chunk jobs
#                       started at once, each waiting for the GPU lease), then a dry run that must
#                       find nothing to do, then one deleted cell file run again alone; the report
#                       step is left to the CPU side (no altair here). Returned as
#                       OUTDIR/workflow-results.tar.gz (cells, job logs, aggregate); logs workflow*.log
#     flex_retained     whether compiled Flex runs several backwards on one retained graph
#                       (benchmarks/flex_retained_graph.py, GPU 0), log flex-retained.log
set -u
out=${1:?outdir}; stage=${2:?stage}; limit=${3:-480}
mkdir -p "$out"
start=$SECONDS
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
logs=/tmp/longca-logs; rm -rf "$logs"; mkdir -p "$logs"  # a warm machine still holds the last call's logs
# FA4's on-disk JIT cache (switched on by the worker) in one folder that comes back as
# OUTDIR/fa4-cache.tar.xz: carried back in .fa4-cache/, later calls of the same sweep on a fresh
# machine load FA4's kernels instead of compiling them, as jobs sharing a cache folder on a cluster
# do. It is keyed by FA4's sources, the CuTe DSL version and each kernel's configuration.
export FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=/tmp/fa4-jit-cache
# Triton's cache in the (git-ignored) checkout: it survives between calls on a warm machine, and
# its autotune results (fla-core tunes each kernel for 1-2 minutes on first use) come back as
# OUTDIR/triton-autotune.tar.gz; put that file in .triton-autotune/ and carry the folder.
export TRITON_CACHE_DIR=$PWD/.triton-cache
mkdir -p "$FLASH_ATTENTION_CUTE_DSL_CACHE_DIR" "$TRITON_CACHE_DIR"
# The carried packages and caches unpack in the background while the committed results are restored
# (neither needs the other): the set-up before the first cell is device time too.
(
  # .whl: what every stage needs (jsonschema and its dependencies); .whl-sparse: VSA and the pytest
  # wheels its Triton file imports, for the `sparse` stage only (kept apart: FA4 leaves little room);
  # .whl-snakemake: Snakemake and what the image lacks of its dependencies, for `workflow` (25 MB)
  wheels=$(ls .whl/*.whl .whl-sparse/*.whl .whl-snakemake/*.whl 2>/dev/null)
  if [ -n "$wheels" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $wheels > "$logs/pip.log" 2>&1
  fi
  if [ -f .bundles/fa4.tar.xz ]; then mkdir -p /tmp/fa4 && tar xJf .bundles/fa4.tar.xz -C /tmp/fa4; fi
  if [ -f .fa4-cache/fa4-cache.tar.xz ]; then tar xJf .fa4-cache/fa4-cache.tar.xz -C "$FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"; fi
  if [ -f .triton-autotune/triton-autotune.tar.gz ]; then tar xzf .triton-autotune/triton-autotune.tar.gz -C "$TRITON_CACHE_DIR"; fi
  echo "set-up: carried packages and caches unpacked at $((SECONDS - start)) s" >> "$logs/setup.txt"
) &
unpacking=$!
# Earlier calls' results travel as aggregates; restoring their cell files makes this call add only
# the missing cells. The restore imports nothing from the folders being unpacked.
for agg in results/*/all.parquet; do
  [ -f "$agg" ] && PYTHONPATH=$PWD python3 -m longca.cli unpack "$agg" >> "$logs/unpack.log" 2>&1
done
echo "set-up: committed cells restored at $((SECONDS - start)) s" >> "$logs/setup.txt"
wait "$unpacking"
export PYTHONPATH=$PWD:/tmp/site:/tmp/fa4:/tmp/fa4/nvidia_cutlass_dsl/dsl_packages
nvidia-smi > "$logs/env.txt" 2>&1
# one torch import for both: the versions go to env.txt, the GPU count to $ngpu
ngpu=$(python3 -c 'import sys, torch, triton
print(torch.__version__, torch.version.cuda, triton.__version__, file=sys.stderr)
print(torch.cuda.device_count())' 2>> "$logs/env.txt")
# the parts of the set-up (a fresh machine took 39 s in call 45 and 98 s in call 48), then its whole
cat "$logs/setup.txt" >> "$logs/env.txt" 2>/dev/null; rm -f "$logs/setup.txt"
echo "set-up $((SECONDS - start)) s" >> "$logs/env.txt"
left() { local s=$(( limit - (SECONDS - start) - 40 )); echo $(( s > 5 ? s : 5 )); }
capped() { local l; l=$(left); echo $(( l < $1 ? l : $1 )); }  # seconds left, at most $1
cleanup() { pkill -9 -f 'longca.cp.bench|longca.run.worker|torch.distributed.run' 2>/dev/null; sleep 2; }

# Commands run one after another on one GPU, each stopped (TERM, then KILL 10 s later: the
# supervisor takes its worker down on TERM) when the call's time is up.
upto() {  # seconds left before the phase deadline $1 (seconds since the call started), within the call's limit
  local s=$(( $1 - (SECONDS - start) )) l=$(left); [ "$s" -gt "$l" ] && s=$l; echo $(( s > 0 ? s : 0 ))
}
gpu_seq() {  # $1: GPU index, $2: log name, then one quoted `longca run` argument list per command
  local g=$1 name=$2; shift 2
  for args in "$@"; do
    local s; s=$(upto "${PHASE_END:-$limit}"); [ "$s" -le 5 ] && break
    local t0; t0=$(date +%s.%N)
    CUDA_VISIBLE_DEVICES=$g timeout -k 10 -s TERM "$s" python3 -m longca.cli run $args >> "$logs/$name.log" 2>&1
    wall_line "$t0" "$args" >> "$logs/$name.log"
  done
}
sharded() {  # $1: log name, then `longca run` argument lists: run in order on every GPU at once,
  # each with --shard g/n on GPU g
  local name=$1 g; shift
  for ((g = 0; g < ngpu; g++)); do
    gpu_seq "$g" "$name-$g" "${@/%/ --shard $g/$ngpu}" &
  done
  wait
}

prewarm_linear() {  # $1: seconds. fla-core autotunes each (kernel, head dim, varlen or not) for
  # 1-3 minutes, mostly compiling; one process per set, all at once over the GPUs, fills Triton's
  # cache (autotune choices included). Their rows go to a scratch folder and are thrown away: the
  # measured cells run afterwards, one process per GPU.
  local i=0 k m d
  for k in fla_linear_attn fla_simple_gla fla_gla fla_gated_deltanet; do
    for m in causal causal_document; do
      for d in 128 64; do
        CUDA_VISIBLE_DEVICES=$((i % ngpu)) timeout -k 10 -s TERM "$1" python3 -m longca.cli run --spec specs/h200.yaml \
          --sweep linear --only kernel=$k --only mask=$m --only head_dim=$d --only seqlen=1K \
          --results /tmp/prewarm > "$logs/prewarm-$k-$m-$d.log" 2>&1 &
        i=$((i + 1))
      done
    done
  done
  wait
}

linear_and_sparse() {  # the linear sweeps split over two GPUs, then the sparse sweep on both
  gpu_seq 0 linsp-0 "--spec specs/h200.yaml --sweep linear --only kernel=fla_linear_attn --only kernel=fla_simple_gla" \
    "--spec specs/h200.yaml --sweep linear_softmax" "--spec specs/h200.yaml --sweep sparse --shard 0/2" &
  gpu_seq 1 linsp-1 "--spec specs/h200.yaml --sweep linear --only kernel=fla_gla --only kernel=fla_gated_deltanet" \
    "--spec specs/h200.yaml --sweep sparse --shard 1/2" &
  wait; cleanup
}
cp_sweeps() {  # CP on all GPUs until the call's time is up, the sweeps in priority order
  # CP_SWEEPS: another order, argument lists separated by '|'
  local args s order
  IFS='|' read -ra order <<< "${CP_SWEEPS:---sweep cp_goal --only cp_mechanism=ulysses --only seqlen=64K --only seqlen=128K|--sweep cp_goal --only seqlen=64K --only seqlen=128K --only seqlen=256K|--sweep cp_masks --only seqlen=64K|--sweep cp_masks --only seqlen=256K|--sweep cp_goal|--sweep cp_masks|--sweep cp_sparse}"
  for args in "${order[@]}"; do
    s=$(left); [ "$s" -le 10 ] && break
    timeout -k 10 -s TERM "$s" python3 -m longca.cli run --spec specs/h200-cp.yaml $args ${RETRY:-} >> "$logs/cp.log" 2>&1
    cleanup
  done
}

# `process wall S s: ARGS`: the wall of one `longca run` process from start-up to exit, the
# denominator of a sweep's efficiency (tools/sweep_efficiency.py sums these lines over calls).
wall_line() {  # $1: start (date +%s.%N), $2: the run's arguments
  echo "process wall $(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(date +%s.%N)") s: $2"
}

# A probe: SPEC's cells (RUN_ARGS narrow them) run on GPU 0 into a scratch results folder, never the
# committed one, and come back as OUTDIR/NAME.parquet (log: NAME.log).
# The process's whole wall, Python start-up included, is the log's last `process wall` line: the
# denominator of a sweep's efficiency, which cell walls alone understate. KEEP=1 adds to the
# scratch folder instead of emptying it (several processes, one returned file).
scratch_run() {  # NAME SPEC [RUN_ARGS...]
  local name=$1 spec=$2 t0; shift 2
  [ "${KEEP:-0}" = 1 ] || rm -rf "/tmp/$name-results"
  t0=$(date +%s.%N)
  CUDA_VISIBLE_DEVICES=0 timeout -k 10 -s TERM "$(capped "${CAP:-420}")" python3 -m longca.cli run --spec "$spec" "$@" \
    --results "/tmp/$name-results" >> "$logs/$name.log" 2>&1
  wall_line "$t0" "$*" >> "$logs/$name.log"
  python3 -m longca.cli aggregate --spec "$spec" --results "/tmp/$name-results" --present-only \
    --out "$out/$name.parquet" >> "$logs/$name.log" 2>&1
}

fa4_sweep() {  # sweep $1 of specs/h200.yaml, one `longca run` per GPU; without the FA4 bundle (55 MB
  # of the call's 64 MiB) every other kernel's missing cells run and FA4's stay missing, never
  # recorded `unsupported: not installed`
  local only="" planned=""
  if [ ! -f .bundles/fa4.tar.xz ]; then
    # line 1: the sweep's other kernels; line 2: the dtypes FA4 is planned never to run (it does
    # not take them), whose rows need no FA4
    { read -r only; read -r planned; } < <(python3 -c 'import sys
from longca.kernels.registry import get
from longca.spec.load import load_spec
sw = next(w for w in load_spec("specs/h200.yaml").sweeps if w.name == sys.argv[1])
print(" ".join(f"--only kernel={k}" for k in sw.kernels if k != "fa4"))
print(" ".join(f"--only dtype={d}" for d in sw.dtypes if d not in get("fa4").caps.dtypes))' "$1")
    echo "stage $1: no .bundles (FA4), so FA4's cells are left missing: $only" | tee -a "$logs/$1-0.log"
  fi
  sharded "$1" "--spec specs/h200.yaml --sweep $1 $only ${RETRY:-}"
  if [ -n "$planned" ]; then
    sharded "$1-fa4-planned" "--spec specs/h200.yaml --sweep $1 --only kernel=fa4 $planned"
  fi
  cleanup
}

run_stage() {
case "$1" in
  single)  # the rest of the dense matrix, Flex to 512K, long context, baselines (FA4 needed)
    sharded single "--spec specs/h200.yaml --sweep dense ${RETRY:-}" \
      "--spec specs/h200.yaml --sweep long --only kernel=flex" "--spec specs/h200.yaml --sweep long" \
      "--spec specs/h200.yaml --sweep dense_baselines"
    cleanup ;;
  dense|shapes)  # the sweep alone, as a user runs it (shapes: head dim and dtype beside dense's D=128 bf16)
    fa4_sweep "$1" ;;
  sparse)
    sharded sparse "--spec specs/h200.yaml --sweep sparse --only kernel=triton_block_sparse" \
      "--spec specs/h200.yaml --sweep sparse --only kernel=flex" \
      "--spec specs/h200.yaml --sweep sparse --only kernel=vsa_triton" \
      "--spec specs/h200.yaml --sweep sparse --only kernel=flashinfer_block_sparse --only kernel=block_sparse_fa2"
    cleanup ;;
  flex_long)
    sharded flex-long "--spec specs/h200.yaml --sweep long --only kernel=flex ${RETRY:-}" \
      "--spec specs/h200.yaml --sweep sparse --only kernel=flex"
    cleanup ;;
  linear_sparse)
    [ "${PREWARM_S:-200}" -gt 0 ] && prewarm_linear "${PREWARM_S:-200}"
    linear_and_sparse ;;
  cp) cp_sweeps ;;
  linear_sparse_cp) export PHASE_END=${SPLIT_S:-270}; linear_and_sparse; unset PHASE_END; cp_sweeps ;;
  sparse_tune)
    CUDA_VISIBLE_DEVICES=0 timeout -k 10 -s TERM "$(left)" python3 benchmarks/sparse_triton.py "$logs/sparse_tune" \
      --budget-s $(( $(left) - 40 )) --no-check --tune-only > "$logs/sparse_tune.log" 2>&1 ;;
  sparse_long)  # block-sparse at 256K and 512K, Triton first, then Flex
    sharded sparse-long "--spec specs/h200.yaml --sweep sparse_long --only kernel=triton_block_sparse ${RETRY:-}" \
      "--spec specs/h200.yaml --sweep sparse_long --only kernel=flex ${RETRY:-}"
    cleanup ;;
  sparse_fp8)  # fp8 block-sparse forwards: Triton first, then Flex (no FA4 needed)
    sharded sparse-fp8 "--spec specs/h200.yaml --sweep sparse_fp8 --only kernel=triton_block_sparse ${RETRY:-}" \
      "--spec specs/h200.yaml --sweep sparse_fp8 --only kernel=flex ${RETRY:-}"
    cleanup ;;
  long_fp8)  # Flex's fp8 forward at 64K-512K (no FA4 needed)
    sharded long-fp8 "--spec specs/h200.yaml --sweep long_fp8 ${RETRY:-}"
    cleanup ;;
  baselines)  # the dense_baselines sweep (naive, SDPA math and efficient, 1K-16K)
    sharded baselines "--spec specs/h200.yaml --sweep dense_baselines ${RETRY:-}"
    cleanup ;;
  long_rest)
    sharded long "--spec specs/h200.yaml --sweep long --only kernel=fa4 ${RETRY:-}" \
      "--spec specs/h200.yaml --sweep long --only kernel=sdpa_cudnn ${RETRY:-}" "--spec specs/h200.yaml --sweep long ${RETRY:-}"
    cleanup ;;
  sparse_goal)  # the block-sparse goal shape (64K, block 128, density 0.5) against dense cuDNN, default tiles
    CUDA_VISIBLE_DEVICES=0 timeout "$(capped 120)" python3 benchmarks/sparse_triton.py "$logs/sparse_goal" \
      --budget-s 60 --no-check --no-tune --tune-only > "$logs/sparse_goal.log" 2>&1 ;;
  dense_probe)
    scratch_run dense-probe specs/h200.yaml --sweep dense --only kernel=sdpa_cudnn --only "seqlen=${PROBE_SEQLEN:-32K}" ;;
  efficiency_probe)
    run_stage dense_probe
    scratch_run efficiency-probe specs/h200-efficiency-probe.yaml --sweep dense_efficient ;;
  efficiency_range)  # one process per kernel, as Snakemake would run one job per kernel
    local k keep=0
    for k in ${RANGE_KERNELS:-sdpa_cudnn flex}; do
      KEEP=$keep scratch_run efficiency-range specs/h200-efficiency-probe.yaml --sweep "${RANGE_SWEEP:-dense_range}" --only "kernel=$k"
      keep=1
    done ;;
  efficiency_sweep)
    scratch_run efficiency-sweep specs/h200-efficiency-probe.yaml --sweep dense_range ;;
  workflow)  # Snakemake as a user runs it on one GPU host; results/h200-workflow is this call's own
    mkdir -p /tmp/wf-bin
    printf '#!/bin/sh\nexec python3 -m longca.cli "$@"\n' > /tmp/wf-bin/longca; chmod +x /tmp/wf-bin/longca
    local wf=(--config spec=specs/h200-workflow.yaml --omit-from report)
    rm -rf results/h200-workflow .snakemake
    PATH=/tmp/wf-bin:$PATH timeout -k 10 -s TERM "$(capped 420)" python3 -m snakemake --cores 16 "${wf[@]}" \
      > "$logs/workflow.log" 2>&1
    echo "snakemake exit $?" >> "$logs/workflow.log"
    PATH=/tmp/wf-bin:$PATH python3 -m snakemake --cores 16 -n "${wf[@]}" > "$logs/workflow-dry.log" 2>&1
    local one; one=$(find results/h200-workflow/cells -name 'cell-*.parquet' | sort | head -n 1)
    echo "deleted: ${one#results/h200-workflow/cells/}" > "$logs/workflow-rerun.log"
    rm -f "$one"
    PATH=/tmp/wf-bin:$PATH timeout -k 10 -s TERM "$(capped 120)" python3 -m snakemake --cores 16 "${wf[@]}" \
      >> "$logs/workflow-rerun.log" 2>&1
    echo "snakemake exit $?" >> "$logs/workflow-rerun.log"
    tar czf "$out/workflow-results.tar.gz" results/h200-workflow ;;
  burst_probe)  # sustained first (as a sweep runs), then short bursts after 2 s idle, one scratch folder
    scratch_run burst-probe specs/h200-efficiency-probe.yaml --sweep dense_sustained
    KEEP=1 scratch_run burst-probe specs/h200-efficiency-probe.yaml --sweep dense_burst ;;
  cooldown_probe)  # sustained first (it leaves the GPU warm, as a sweep does), then with the cool-down
    scratch_run cooldown-probe specs/h200-efficiency-probe.yaml --sweep dense_sustained
    KEEP=1 scratch_run cooldown-probe specs/h200-efficiency-probe.yaml --sweep dense_cooldown ;;
  cp_local)  # CP_LOCAL_PASS=bwd: the ranks' backward instead (files cp_local_bwd.*)
    local sfx=""; [ "${CP_LOCAL_PASS:-fwd}" = bwd ] && sfx="_bwd"
    CUDA_VISIBLE_DEVICES=0 timeout -k 10 -s TERM "$(capped 300)" python3 benchmarks/cp_rank_local.py "$logs/cp_local$sfx.json" \
      --pass "${CP_LOCAL_PASS:-fwd}" --masks causal full --tokens-per-gpu 32768 65536 --heads 64:8 64:64 \
      > "$logs/cp_local$sfx.log" 2>&1 ;;
  cp_local_flex)
    local p extra
    for p in ${CP_FLEX_PASSES:-fwd bwd}; do
      extra=""; [ "$p" = bwd ] && extra="--also-autograd"
      CUDA_VISIBLE_DEVICES=0 timeout -k 10 -s TERM "$(capped 420)" python3 benchmarks/cp_rank_local.py \
        "$logs/cp_local_flex_$p.json" --pass "$p" $extra --kernel flex --single "${CP_FLEX_SINGLE:-flex}" --heads 64:8 \
        --tokens-per-gpu ${CP_FLEX_TOKENS:-32768} --masks ${CP_FLEX_MASKS:-causal_document full_document share_question prefix_lm_causal causal} \
        > "$logs/cp_local_flex_$p.log" 2>&1
    done ;;
  flex_retained)
    CUDA_VISIBLE_DEVICES=0 timeout -k 10 -s TERM "$(capped 120)" python3 benchmarks/flex_retained_graph.py \
      > "$logs/flex-retained.log" 2>&1 ;;
  fidelity)
    # FIDELITY_ARGS="--spec specs/h200.yaml --sweep dense": longca timed under the dense sweep's protocol
    CUDA_VISIBLE_DEVICES=0 timeout "$(capped 240)" python3 benchmarks/timer_fidelity.py "$logs/fidelity.json" --rounds "${FIDELITY_ROUNDS:-3}" ${FIDELITY_ARGS:-} > "$logs/fidelity.log" 2>&1 ;;
  checks)
    run_stage fidelity
    CUDA_VISIBLE_DEVICES=0 timeout 120 python3 tools/fa4_smoke.py > "$logs/fa4_smoke.log" 2>&1
    CUDA_VISIBLE_DEVICES=0 timeout 90 python3 benchmarks/sparse_check.py "$logs/sparse_check" > "$logs/sparse_check.log" 2>&1 ;;
  *) echo "unknown stage $1"; exit 2 ;;
esac
}
for st in ${stage//+/ }; do run_stage "$st"; done
stages_end=$SECONDS
for spec in h200 h200-cp; do
  if [ -d "results/$spec/cells" ]; then
    # The aggregate holds the current spec's cells; --keep appends the carried rows of cells the spec
    # no longer has (the Ulysses zigzag cells before `balance: auto` changed, the dense rows measured
    # under the file-wide protocol), so the returned file can replace results/$spec/all.parquet.
    keep=(); [ -f "results/$spec/all.parquet" ] && keep=(--keep "results/$spec/all.parquet")
    python3 -m longca.cli aggregate --spec "specs/$spec.yaml" --present-only --out "$out/$spec.parquet" ${keep[@]+"${keep[@]}"} \
      >> "$logs/aggregate.log" 2>&1
    # what is left, per sweep and kernel, for planning the next call (the aggregate's cells count
    # as done; an empty results folder keeps it from checking thousands of cell files again)
    python3 -m longca.cli plan "specs/$spec.yaml" --results "$logs/no-results" --rows "$out/$spec.parquet" \
      > "$logs/plan-$spec.txt" 2>&1
  fi
done
[ -n "$(ls -A "$FLASH_ATTENTION_CUTE_DSL_CACHE_DIR")" ] && tar cJf "$out/fa4-cache.tar.xz" -C "$FLASH_ATTENTION_CUTE_DSL_CACHE_DIR" . \
  && echo "fa4-cache.tar.xz: $(find "$FLASH_ATTENTION_CUTE_DSL_CACHE_DIR" -type f | wc -l) files, $(du -sk "$out/fa4-cache.tar.xz" | cut -f1) KiB" >> "$logs/aggregate.log"
echo "stages ended at $((stages_end - start)) s; aggregates and caches written by $((SECONDS - start)) s" >> "$logs/aggregate.log"
tar czf "$out/logs.tar.gz" "$logs" 2>/dev/null
(cd "$TRITON_CACHE_DIR" && find . -name '*.autotune.json' | tar czf "$out/triton-autotune.tar.gz" -T -) 2>/dev/null
python3 - "$out" <<'PY'
# rows per (sweep, kernel, status) of the current specs' cells, from the returned aggregates (one
# read each instead of thousands of cell files; rows of superseded digests left out)
import collections, os, sys, pyarrow.parquet as pq
from longca.spec.cells import expand
from longca.spec.load import load_spec
c = collections.Counter(); bad = []
for spec in ("h200", "h200-cp"):
    path = os.path.join(sys.argv[1], f"{spec}.parquet")
    if not os.path.exists(path):
        continue
    digests = {cell.digest for cell in expand(load_spec(f"specs/{spec}.yaml"))}
    for r in pq.read_table(path, columns=["cell_digest", "sweep", "kernel", "status", "reason"]).to_pylist():
        if r["cell_digest"] not in digests:
            continue
        c[(r["sweep"], r["kernel"], r["status"])] += 1
        if r["status"] in ("error", "incorrect") and len(bad) < 12:
            bad.append(f"{r['kernel']}: {(r['reason'] or '')[:160]}")
for k, v in sorted(c.items()): print(*k, v)
print("\n".join(bad))
PY
tail -n 3 "$logs"/*.log
