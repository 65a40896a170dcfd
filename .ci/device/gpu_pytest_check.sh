#!/usr/bin/env bash
# `python3 -m pytest -m gpu` on one GPU exactly as a user types it: wall time, the phase
# breakdown pytest prints, peak GPU memory (nvidia-smi every 0.5 s) against the card; then
# the quick tier; then wrong kernels planted at real size, which must fail.
#
#   .ci/device/gpu_pytest_check.sh full|full-no-isolation|quick|planted|all
#
# full-no-isolation is `pytest -m gpu --no-isolation`: the cost of the fault isolation is
# full's wall time against it (per_gpu.sh runs both at once on two GPUs of one host).
#
# Each stage stays under 10 minutes (pytest gets SIGINT at $LIMIT seconds, 560 by default,
# and still prints its summary), so run them as separate calls of the device tool. Every
# stage starts from empty JAX, Triton and nvcc caches, as on a freshly started machine
# (COLD=0 keeps the caches of the stage before). Logs and a summary go to $OUT.
set -uo pipefail

OUT=${OUT:-/tmp/kp-gpu-check}
LIMIT=${LIMIT:-560}
COLD=${COLD:-1}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."

fresh_caches() {  # $1: stage name
    if [ "$COLD" = 1 ]; then
        export KERNELPERF_COMPILATION_CACHE=/tmp/kp-cache-$1/jax
        export TRITON_CACHE_DIR=/tmp/kp-cache-$1/triton
        export KERNELPERF_CUDA_CACHE=/tmp/kp-cache-$1/cuda
        rm -rf "/tmp/kp-cache-$1"
    fi
}

sample_memory() {  # $1: csv file; prints the sampler's pid
    # This process's GPU only (NVML numbers GPUs as nvidia-smi does, whatever
    # CUDA_VISIBLE_DEVICES says; per_gpu.sh gives each job one GPU by its index).
    nvidia-smi ${CUDA_VISIBLE_DEVICES:+-i "$CUDA_VISIBLE_DEVICES"} \
        --query-gpu=timestamp,memory.used,memory.total,utilization.gpu \
        --format=csv,noheader,nounits -lms 500 > "$1" 2>/dev/null &
    echo $!
}

peak_memory() {  # $1: csv file
    awk -F', ' '$2 + 0 > peak { peak = $2 + 0; total = $3 + 0 }
        END { if (total) printf "peak GPU memory (nvidia-smi, every 0.5 s): %d MiB of %d MiB (%.0f%%)\n", peak, total, 100 * peak / total;
              else print "peak GPU memory: no nvidia-smi samples" }' "$1"
}

run_pytest() {  # $1: stage name; the rest: pytest arguments, exactly as typed
    local stage=$1; shift
    local log=$OUT/$stage.log
    fresh_caches "$stage"
    export KERNELPERF_PHASES_JSONL=$OUT/$stage-phases.jsonl
    rm -f "$KERNELPERF_PHASES_JSONL"
    local sampler; sampler=$(sample_memory "$OUT/$stage-nvidia-smi.csv")
    echo "== $stage: python3 -m pytest $* (limit ${LIMIT} s, caches $([ "$COLD" = 1 ] && echo cold || echo kept))"
    local start; start=$(date +%s%N)
    timeout -s INT -k 15 "$LIMIT" python3 -m pytest "$@" > "$log" 2>&1
    local status=$?
    local wall_ms=$((($(date +%s%N) - start) / 1000000))
    local wall=$((wall_ms / 1000)).$(printf "%03d" $((wall_ms % 1000)))
    kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
    grep -E "^kernelperf: .*(workers|GPU|gpu)" "$log" | head -3
    grep -E "^created: |items\]|^collected " "$log" | head -2
    sed -n '/^kernelperf phases:/,/^kernelperf: compilation cache/p' "$log"
    grep -E "^(FAILED|ERROR) " "$log" | head -25
    grep -cE "^(FAILED|ERROR) " "$log" | sed 's/^/failed or errored items: /'
    tail -n 1 "$log"
    peak_memory "$OUT/$stage-nvidia-smi.csv"
    printf "%s: exit status %s, wall %s s (%s)\n" "$stage" "$status" "$wall" \
        "$([ "$status" = 124 ] || grep -q KeyboardInterrupt "$log" && echo "STOPPED AT THE LIMIT" || echo finished)"
    echo "$stage wall_s=$wall status=$status" >> "$OUT/summary.txt"
    return 0
}

planted() {
    # Wrong kernels registered like real ones (one file beside the operation), so the
    # generated tests, the case grouping, the shared reference and the device comparison
    # all see them; every one of their items must fail, real sizes included.
    local plant=kernels/ops/softmax/zz_planted_wrong.py
    cat > "$plant" <<'EOF'
"""Planted by .ci/device/gpu_pytest_check.sh: softmax with the last column wrong."""
import jax
import torch

from kernels import registry


def _jax(x):
    y = jax.nn.softmax(x, axis=-1)
    return y.at[..., -1].set(y[..., -1] * 1.5 + 0.01)


def _torch(x):
    y = torch.softmax(x, dim=-1)
    y[..., -1] = y[..., -1] * 1.5 + 0.01
    return y


registry.register_implementation(registry.Implementation(
    op="softmax", name="planted_wrong_jax", fn=_jax, baseline=True))
registry.register_implementation(registry.Implementation(
    op="softmax", name="planted_wrong_torch", fn=_torch, framework="torch", baseline=True))
EOF
    trap 'rm -f kernels/ops/softmax/zz_planted_wrong.py' EXIT
    # Real sizes only: 15 softmax cases x 2 distributions x 2 plants, every one must fail.
    # (PLANTED_MARKS="not gpu" tries the plants on the small cases of a CPU machine.)
    run_pytest planted -m "${PLANTED_MARKS:-gpu and not small}" -k "planted_wrong" \
        correctness_tests/test_kernels.py
    rm -f "$plant"
    echo "planted wrong kernels at real size: $(grep -oE '[0-9]+ (failed|passed)' \
        "$OUT/planted.log" | tr '\n' ' ')(every item must fail, none pass)"
    # The harness's own real-size plants (NaN, one element, zeros, gradient, torch).
    run_pytest planted-harness -m gpu -k "real_size" correctness_tests/test_harness.py
}

echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null); $(nproc) CPUs"
python3 -c "import jax, torch, triton, pytest, xdist; print('jax', jax.__version__, '| torch', torch.__version__, '| triton', triton.__version__, '| pytest', pytest.__version__, '| xdist', xdist.__version__)"

stage=${1:-all}
case "$stage" in
    full) run_pytest full -m gpu ;;
    full-no-isolation) run_pytest full-no-isolation -m gpu --no-isolation ;;
    quick) run_pytest quick -m "gpu and small" ;;
    planted) planted ;;
    all) run_pytest full -m gpu; run_pytest quick -m "gpu and small"; planted ;;
    *) echo "usage: $0 full|full-no-isolation|quick|planted|all" >&2; exit 2 ;;
esac
