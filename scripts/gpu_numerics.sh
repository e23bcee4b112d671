#!/usr/bin/env bash
# The one prepared GPU run of issue 5 item 6: batch-invariant kernels on a ~2.1B-param MoE, run
# through tidal's own model (CausalLM, the one fused forward) on the GPU op sets.
#
#   bash scripts/gpu_wheels.sh              # first, here (network): wheels into .gpu-wheels/
#   bash scripts/gpu_numerics.sh            # on the device machine, from the repo root, $OUT set,
#                                           # with carry=[".gpu-wheels"]
#
# Settings of the benchmark are --bench.KEY VALUE (tidal.bench.config; `python -m
# tidal.bench.numerics_gpu --help` lists them), run-config overrides --SECTION.KEY VALUE.
# 1. environment (GPU, torch, triton) and pydantic (tidal.model's configs need it; the device
# machine lacks it): importable already, or installed offline from .gpu-wheels into a scratch
# folder put on PYTHONPATH (nothing installed into the machine's Python); 2. a ~30 s smoke run on
# a tiny MoE: every Triton kernel checked against torch on the GPU (accuracy, batch invariance,
# decode vs prefill), then both modes end to end; 3. the >=1B run (fast vs deterministic,
# >=10,000 generated tokens), sized for a few minutes on an H200: each mode warmed up, then 2
# timed rounds interleaved, median reported (run 3: ~2-3 min, limit 330 s). Each step has its own
# time limit and failure message, so one failure still lets the others print. Uses the
# checkout's sources (PYTHONPATH=src).
# Output: $OUT/log.txt (everything printed), $OUT/numerics_smoke.json, $OUT/numerics_gpu.json.
#
# Rehearsal without a GPU: DEVICE=cpu SMOKE_SIZE=tiny MAIN_SIZE=tiny runs the CPU op sets; add
# TIDAL_OPS=gpu TRITON_INTERPRET=1 WORKLOAD=interpreted (and longer limits) to run the Triton op
# set itself in Triton's interpreter.
set -u
OUT="${OUT:-/tmp/gpu_numerics_out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-/tmp/triton-cache}"
PY="${PYTHON:-python3}"
SMOKE_LIMIT_S="${SMOKE_LIMIT_S:-120}"
MAIN_LIMIT_S="${MAIN_LIMIT_S:-330}"
REPEATS="${REPEATS:-2}"  # timed rounds per mode (fast, det, fast, det after a warm-up of each)
WHEELS="${WHEELS:-$PWD/.gpu-wheels}"
DEPS="${DEPS:-/tmp/tidal-pydeps}"
DEVICE="${DEVICE:-cuda}"
SMOKE_SIZE="${SMOKE_SIZE:-smoke}"
MAIN_SIZE="${MAIN_SIZE:-1b}"
WORKLOAD_ARGS=()
[ -n "${WORKLOAD:-}" ] && WORKLOAD_ARGS=(--bench.workload "$WORKLOAD")
exec > >(tee -a "$OUT/log.txt") 2>&1

step() { echo; echo "=== $1  ($(date -u +%H:%M:%S))"; }

step "environment"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv || echo "nvidia-smi FAILED"
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'triton', triton.__version__, 'gpu', torch.cuda.get_device_name() if torch.cuda.is_available() else None)" \
    || echo "ENV CHECK FAILED"

step "pydantic (tidal.model's configs)"
if "$PY" -c "import pydantic" 2>/dev/null; then
    "$PY" -c "import pydantic; print('pydantic', pydantic.VERSION, 'already importable')"
elif "$PY" -m pip install --quiet --no-index --find-links "$WHEELS" --target "$DEPS" pydantic; then
    export PYTHONPATH="$PYTHONPATH:$DEPS"
    "$PY" -c "import pydantic; print('pydantic', pydantic.VERSION, 'from', '$WHEELS')" \
        || echo "PYDANTIC IMPORT FAILED"
else
    echo "PYDANTIC INSTALL FAILED: no usable wheel in $WHEELS (run scripts/gpu_wheels.sh and carry .gpu-wheels)"
fi

step "smoke: kernel checks + tiny MoE end to end (limit ${SMOKE_LIMIT_S}s)"
timeout "$SMOKE_LIMIT_S" "$PY" -m tidal.bench.numerics_gpu --bench.device "$DEVICE" --bench.size "$SMOKE_SIZE" \
    --bench.smoke true --bench.repeats "$REPEATS" ${WORKLOAD_ARGS[@]+"${WORKLOAD_ARGS[@]}"} --json "$OUT/numerics_smoke.json"
rc=$?; [ $rc -eq 0 ] || echo "SMOKE RUN FAILED (exit $rc; 124 = time limit)"

# fast mode's experts: torch._grouped_mm only if the smoke run confirmed it (a private torch op;
# the smoke run checks it against the padded bmm), else the padded batched matmul.
FAST_EXPERTS=$("$PY" -c "import json, sys; d = json.load(open(sys.argv[1])); \
print('grouped_mm' if d.get('fast_experts') == 'grouped_mm' else 'padded_bmm')" \
    "$OUT/numerics_smoke.json" 2>/dev/null || echo padded_bmm)

step "main: ~2.1B-param MoE, fast vs deterministic, fast experts: $FAST_EXPERTS (limit ${MAIN_LIMIT_S}s)"
timeout "$MAIN_LIMIT_S" "$PY" -m tidal.bench.numerics_gpu --bench.device "$DEVICE" --bench.size "$MAIN_SIZE" \
    --bench.repeats "$REPEATS" --bench.fast_experts "$FAST_EXPERTS" ${WORKLOAD_ARGS[@]+"${WORKLOAD_ARGS[@]}"} \
    --json "$OUT/numerics_gpu.json"
rc=$?; [ $rc -eq 0 ] || echo "MAIN RUN FAILED (exit $rc; 124 = time limit)"

step "done"
ls -la "$OUT"
