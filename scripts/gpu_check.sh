#!/usr/bin/env bash
# Checks the learner's CUDA path on a machine with an NVIDIA GPU, in one short run:
#   1. the CUDA tests: HostWeights and HostPriorities copies, the update loop's host reads
#      (TorchFunctionMode) and its synchronising calls (PyTorch's sync debug mode), the bench's
#      GPU timing;
#   2. the learner's update on the GPU against a plain PyTorch loop (zrl bench pipeline's
#      learner_overhead), CartPole and Pong (shallow and deep nets, 8 and 32 columns), with
#      batches joined in line and on a prefetch thread (learner.prefetch_batches 2);
#   3. `zrl run` on Pong for a while, the learner on the GPU, without and with prefetch;
#   4. the whole pytest suite, with the GPU there, for the time that is left.
#
# Usage: bash scripts/gpu_check.sh [OUTDIR]     (logs go to OUTDIR, default gpu-check/)
# Needs python3 with a CUDA build of torch and zrl's Python dependencies importable; builds
# zrl._core in place (cmake + pybind11) when it does not import. GPU_CHECK_SECONDS (default
# 420) bounds the whole run: the suite gets what the earlier steps leave. GPU_CHECK_STEPS (default
# "tests learner run suite"; spaces or commas between them) picks the steps.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-gpu-check}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
BUDGET=${GPU_CHECK_SECONDS:-420}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
STEPS=" ${GPU_CHECK_STEPS:-tests learner run suite} "; STEPS=${STEPS//,/ }
step() { echo; echo "=== [${SECONDS}s] $*"; }
want() { [[ $STEPS == *" $1 "* ]]; }

step "machine"
nvidia-smi -L
echo "cores: $(nproc)"
$PY -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))" || exit 1

if ! $PY -c "import zrl._core" 2>/dev/null; then
  step "building zrl._core for $($PY -V)"
  gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
  { cmake -S . -B build/gpu-check "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DZRL_BUILD_PYTHON=ON \
      -DCMAKE_LIBRARY_OUTPUT_DIRECTORY="$PWD/zrl" -DPython_EXECUTABLE="$(command -v "$PY")" \
      -Dpybind11_DIR="$($PY -c 'import pybind11; print(pybind11.get_cmake_dir())')" \
    && cmake --build build/gpu-check --target _core -j "$(nproc)"; } >"$OUT/build.log" 2>&1 \
    || { tail -40 "$OUT/build.log"; exit 1; }
  $PY -c "import zrl._core" || exit 1
fi

if want tests; then
step "CUDA tests"
timeout 300 $PY -m pytest -p no:cacheprovider -q -rA -s -k "cuda or gpu" \
  tests/learner/test_host_weights.py tests/learner/test_no_host_reads.py tests/bench/test_bench_pipeline.py 2>&1 | tee "$OUT/cuda_tests.log"
fi

if want learner; then
step "learner update on the GPU against a plain PyTorch loop (ms per update, medians)"
timeout 240 $PY - <<'EOF' 2>&1 | tee "$OUT/learner_gpu.log"
from zrl.bench.pipeline import _config, learner_overhead

cases = [("CartPole", []), ("Pong", []), ("Pong", ["learner.batch_size=32"]),
         ("Pong", ["model.network=impala_deep"]), ("Pong", ["model.network=impala_deep", "learner.batch_size=32"])]
for name, ov in cases:
    cfg = _config(name, ov)
    row = []
    for from_host in (False, True):
        for prefetch in (0, 2):
            z, p = learner_overhead(name, cfg, 200, "cuda", from_host, prefetch)
            row.append(f"{'plain from pinned host' if from_host else 'plain on GPU'} {p * 1e3:.2f} "
                       f"zrl (prefetch {prefetch}) {z * 1e3:.2f} ratio {z / p:.3f}")
    print(f"{name} {cfg.model.network} batch {cfg.learner.batch_size}: " + " | ".join(row), flush=True)
EOF
fi

want run && for pf in 0 2; do
  step "zrl run on Pong, 8 actors, 40 s, the learner on the GPU, learner.prefetch_batches $pf"
  run_dir=$(mktemp -d)
  timeout 120 $PY -m zrl run --config configs/pong_impala.yaml --actors 8 --max-seconds 40 --stop-at-return 1e9 \
    --logdir "$run_dir" -o learner.checkpoint_interval_s=1e6 -o learner.prefetch_batches=$pf >"$OUT/zrl_run_pf$pf.log" 2>&1
  echo "exit $?"; grep -E "device|error|Error|Traceback" "$OUT/zrl_run_pf$pf.log" | head -5; tail -6 "$OUT/zrl_run_pf$pf.log"
  $PY -c "import json, sys; print(json.load(open(sys.argv[1]))['perf'])" "$run_dir/learner_final.json"
  rm -rf "$run_dir"
done

left=$((BUDGET - SECONDS - 30))  # (the suite may take 20 s more to stop after its SIGINT)
if want suite && [ "$left" -gt 30 ]; then
  step "the whole suite, ${left}s at most"
  xdist=(); $PY -c "import xdist" 2>/dev/null && xdist=(-n 12)
  timeout -s INT -k 20 "$left" $PY -m pytest -p no:cacheprovider -q -rfEs "${xdist[@]}" >"$OUT/suite.log" 2>&1
  echo "exit $? (124: out of time; the summary of what ran is below)"; tail -40 "$OUT/suite.log"
fi
step "done"
