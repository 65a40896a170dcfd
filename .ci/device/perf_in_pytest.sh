#!/usr/bin/env bash
# Performance inside `python3 -m pytest -m gpu` as typed (issue 48, items 3 and 4; the perf
# phase of kernels/testing/perf_phase.py, docs/perf-in-pytest.md), on one GPU:
#
#   cold     `python3 -m pytest -m gpu` from empty JAX, Triton and nvcc caches: wall time (the
#            goal on an H200: 420 s), the perf phase's serial share (its line: how long the
#            perf items held the device alone), the floors' verdicts, 0 failed expected
#   rerun    the same again with the caches `cold` left (run it in a later call on the still
#            warm machine): a clean rerun, 0 perf failures expected
#   planted  slowdowns of $PLANT (0.15: 15%) planted in a scratch copy, never in the tree,
#            in one kernel of each family: the Pallas softmax, the Triton softmax, the CUDA
#            softmax through ctypes (each against its roofline floor) and the Pallas Mosaic
#            matmul (against its ratio to the XLA baseline), by kernels/bench/gate.py's
#            plant_source (each call also recomputes a fraction of the rows, scaled as the
#            gate scales it); `python3 -m pytest -m gpu -k <their perf items>` $REPEAT times
#            (3): each planted item must fail, 3 of 3; then the same items unplanted (the
#            control), which must pass
#   all      cold, planted and the control in one run: about 460 + 3 x 60 + 60 s on an
#            H200 (measured 2026-12-02: cold was cut at 430 s, the planted runs took 59-60 s
#            each), more than one 10-minute device call, so split it:
#
#   bash .ci/device/perf_in_pytest.sh cold     # then, in the next call on the warm machine:
#   bash .ci/device/perf_in_pytest.sh planted  # 3 planted runs and the control, ~4 min
#   COLD=0 bash .ci/device/perf_in_pytest.sh rerun
#
# Leave OUT as the device tool sets it: a log written elsewhere is lost when the call's limit
# kills the script.
#
# A model without floors (the H200 until `python -m kernels bringup` has written its own)
# records and does not judge: the runs end with the finding line naming it, the plants cannot
# fail, and the summary gives each planted item's measured slowdown against the control
# instead. Logs, JUnit XML, pytest-benchmark's JSON and a summary go to $OUT; each pytest gets
# SIGINT at $LIMIT seconds (560) and still prints its summary.
#
# A dry run on a CPU (the script's own logic; interpreted kernels, nothing judged):
#   PYTHON=.venv/bin/python MARK=perf ARGS="-n 2" REPEAT=1 \
#       PLANTS="pallas softmax pallas f32-64x1000" bash .ci/device/perf_in_pytest.sh planted
set -uo pipefail

OUT=${OUT:-/tmp/kp-perf-in-pytest}
LIMIT=${LIMIT:-560}
COLD=${COLD:-1}
PLANT=${PLANT:-0.15}
REPEAT=${REPEAT:-3}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.." || exit 2
ROOT=$PWD
CACHE=/tmp/kp-cache-perf-in-pytest
MARK=${MARK:-gpu}
read -r -a EXTRA <<< "${ARGS:-}"
# family, operation, implementation, case (the fraction recomputed is $PLANT times the gate's
# scale for that kernel, gate.PLANTS)
if [ -n "${PLANTS:-}" ]; then
    IFS=';' read -r -a PLANTS <<< "$PLANTS"
else
    PLANTS=("pallas softmax pallas f32-32768x4096"
            "triton softmax triton f32-32768x4096"
            "cuda softmax cuda f32-32768x4096"
            "xla-ratio matmul pallas_mosaic bf16-8192x8192x8192")
fi
SELECT=$(for p in "${PLANTS[@]}"; do set -- $p; printf '%s-%s-%s-fwd or ' "$2" "$3" "$4"; done)
SELECT="test_kernel_performance and (${SELECT% or })"

caches() {  # one set of caches for every stage: `cold` empties them, the others keep them
    export KERNELPERF_COMPILATION_CACHE=$CACHE/jax TRITON_CACHE_DIR=$CACHE/triton \
        KERNELPERF_CUDA_CACHE=$CACHE/cuda
    if [ "$1" = empty ]; then rm -rf "$CACHE"; fi
}

run_pytest() {  # $1: stage name, $2: folder to run in; the rest: pytest's arguments
    local stage=$1 dir=$2; shift 2
    local log=$OUT/$stage.log
    nvidia-smi --query-gpu=timestamp,memory.used,memory.total --format=csv,noheader,nounits \
        -lms 500 > "$OUT/$stage-nvidia-smi.csv" 2>/dev/null &
    local sampler=$!
    echo "== $stage: python3 -m pytest $* (in $dir; limit $LIMIT s)"
    local start; start=$(date +%s%N)
    (cd "$dir" && timeout -s INT -k 15 "$LIMIT" "$PY" -m pytest "$@" "${EXTRA[@]}" \
        --junitxml="$OUT/$stage.xml" --benchmark-json="$OUT/$stage.json") > "$log" 2>&1
    local status=$?
    local wall_ms=$((($(date +%s%N) - start) / 1000000))
    kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
    grep -E "^kernelperf: ([0-9]+ workers|perf phase|perf items|no performance floors)" "$log"
    grep -E "^(FAILED|ERROR) " "$log" | head -20
    tail -n 1 "$log"
    awk -F', ' '$2 + 0 > peak { peak = $2 + 0; total = $3 + 0 }
        END { if (total) printf "peak GPU memory: %d of %d MiB\n", peak, total }' \
        "$OUT/$stage-nvidia-smi.csv"
    printf "%s: exit %s, wall %d.%03d s\n" "$stage" "$status" $((wall_ms / 1000)) \
        $((wall_ms % 1000)) | tee -a "$OUT/summary.txt"
    grep -E "^kernelperf: perf phase" "$log" | sed "s/^/$stage: /" >> "$OUT/summary.txt"
}

planted_tree() {  # a scratch copy of the tree with the plants appended to their modules
    local scratch=/tmp/kp-planted
    rm -rf "$scratch" && cp -a "$ROOT" "$scratch"
    (cd "$scratch" && PYTHONPATH=$scratch "$PY" - "$PLANT" "${PLANTS[@]}" <<'EOF'
import sys

from kernels.bench import gate
from kernels.core import registry

size = float(sys.argv[1])
scales = {(p.op, p.impl): p.scale for p in gate.PLANTS}
for spec in sys.argv[2:]:
    family, op, impl, case = spec.split()
    fraction = min(1.0, size * scales.get((op, impl), 1.0))
    path = registry.module_path(op, impl)
    with open(path, "a") as module:
        module.write(gate.plant_source(op, impl, fraction, registry.implementation(op, impl)
                                       .framework))
    print(f"planted {family}: {op}-{impl} recomputes {fraction:.1%} of the rows ({path})")
EOF
    ) >&2 || exit 1
    echo "$scratch"
}

summary() {  # the planted items' verdicts and measured slowdowns against the control
    "$PY" - "$OUT" "$REPEAT" "${PLANTS[@]}" <<'EOF' | tee -a "$OUT/summary.txt"
import json
import pathlib
import sys

out, repeat, plants = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]


def records(stage):
    path = out / f"{stage}.json"
    if not path.exists():
        return {}
    return {b["param"]: b for b in json.loads(path.read_text())["benchmarks"]}


control = records("control")
caught = 0
for spec in plants:
    family, op, impl, case = spec.split()
    item = f"{op}-{impl}-{case}-fwd"
    clean = control.get(item)
    verdicts = []
    for trial in range(1, repeat + 1):
        planted = records(f"planted-{trial}").get(item)
        if planted is None:
            verdicts.append("not run")
            continue
        info = planted["extra_info"]
        slower = (planted["stats"]["median"] / clean["stats"]["median"]
                  if clean else float("nan"))
        verdicts.append(f"{info['floor_verdict']} (value {info['floor_value']}, "
                        f"median {slower:.3f}x the control)")
        caught += info["floor_verdict"] == "fail"
    base = clean["extra_info"]["floor_verdict"] if clean else "not run"
    print(f"{family:9} {item}: control {base}; planted: {'; '.join(verdicts)}")
print(f"plants caught: {caught} of {len(plants) * repeat} (every planted item must fail)")
EOF
}

stage=${1:-all}
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,memory.total,driver_version \
    --format=csv,noheader 2>/dev/null); $(nproc) CPUs"
case "$stage" in
    cold) caches empty; run_pytest cold "$ROOT" -m "$MARK" ;;
    rerun) caches keep; run_pytest rerun "$ROOT" -m "$MARK" ;;
    planted|all)
        if [ "$stage" = all ]; then caches empty; run_pytest cold "$ROOT" -m "$MARK"; fi
        caches keep
        scratch=$(planted_tree) || exit 1
        for trial in $(seq 1 "$REPEAT"); do
            run_pytest "planted-$trial" "$scratch" -m "$MARK" -k "$SELECT"
        done
        run_pytest control "$ROOT" -m "$MARK" -k "$SELECT"
        summary ;;
    *) echo "usage: $0 cold|rerun|planted|all" >&2; exit 2 ;;
esac
cat "$OUT/summary.txt"
