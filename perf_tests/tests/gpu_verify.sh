#!/usr/bin/env bash
# Issue 17 on a GPU machine, from the repository root:
#   run1   pytest -m "gpu and perf", history saved (.benchmarks/<gpu model>/)
#   run2   the same again, saved, and compared with run1 (--benchmark-compare-fail=median:5%):
#          the floors must give the same verdicts (no flake); the compare shows A/A noise
#   plant  in a scratch copy (never committed): Pallas softmax column blocks capped at 1024
#          (RESULTS.md: ~1.5x slower at 32768x4096); its unplanted items saved, then the
#          planted ones compared: the floor check and --benchmark-compare-fail must fail
# Logs, JUnit XML and pytest-benchmark's JSON go to $OUT (default ./gpu-verify-out).
#
#   bash perf_tests/tests/gpu_verify.sh                  # run1, run2, plant
#   bash perf_tests/tests/gpu_verify.sh run1             # one phase per call (10-minute limits);
#   bash perf_tests/tests/gpu_verify.sh run2             # run2 needs run1's history and logs,
#   bash perf_tests/tests/gpu_verify.sh plant            # kept in .benchmarks/ (git-ignored)
#   PERF_K="softmax or mlp" bash perf_tests/tests/gpu_verify.sh run1    # narrowed (pytest -k);
#                                      # run2 with the same PERF_K is compared with that run1
#   KERNELPERF_PERF_BUDGET=1.0                     # seconds of sampling per measurement
# On CPU (a dry run of this script: floors skip there, the compare still fails):
#   PERF_MARK=perf PLANT_K=softmax-pallas-f32-64x1000 PLANT_COLS=256 bash perf_tests/tests/gpu_verify.sh
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 2
OUT=${OUT:-$ROOT/gpu-verify-out}
PY=${PYTHON:-python3}
# Run logs and JUnit files also go to STATE, which outlives one device call ($OUT is new each
# call; .benchmarks/ is ignored by git, so a warm machine keeps it): run2 reads run1's there.
STATE=$ROOT/.benchmarks/gpu-verify
mkdir -p "$OUT" "$STATE"
# pygal and pygaljs for the histograms, where carried as wheels (../shared/device/wheels.sh
# pygal pygaljs; carry .whl): the GPU image does not have them.
if ls .whl/pygal-*.whl >/dev/null 2>&1 && ! "$PY" -c 'import pygal' 2>/dev/null; then
  wheels=(.whl/pygal*.whl); for dep in importlib_metadata zipp lazy_importer; do
    ls .whl/${dep}-*.whl >/dev/null 2>&1 && wheels+=(.whl/${dep}-*.whl); done
  "$PY" -m pip install -q --no-index --no-deps --target /tmp/pygal-site "${wheels[@]}" \
    && export PYTHONPATH=/tmp/pygal-site${PYTHONPATH:+:$PYTHONPATH}
fi
PHASES=("$@")
[ ${#PHASES[@]} -gt 0 ] || PHASES=(run1 run2 plant)
K_ARGS=()
[ -n "${PERF_K:-}" ] && K_ARGS=(-k "$PERF_K")
# Runs narrowed by PERF_K are kept apart: run2 of "softmax or mlp" is compared with its run1.
PART=$(echo "${PERF_K:-all}" | tr -c 'A-Za-z0-9_\n-' '_')
PERF_MARK=${PERF_MARK:-gpu and perf}
PLANT_K=${PLANT_K:-softmax-pallas-f32-32768x4096 or softmax-pallas-bf16-32768x4096}
PLANT_COLS=${PLANT_COLS:-1024}
PYTEST=(-m "$PERF_MARK" -p no:xdist -p no:cacheprovider -rfEs --durations=15)

log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$OUT/summary.txt"; }

gpu_state() {
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
    --format=csv,noheader 2>/dev/null | sed 's/^/  gpu: /' | tee -a "$OUT/summary.txt"
}

# Passed / failed / skipped from a JUnit file, and the failing ids with their first line.
junit_summary() {
  "$PY" - "$1" <<'EOF' | tee -a "$OUT/summary.txt"
import sys
import xml.etree.ElementTree as ET

root = ET.parse(sys.argv[1]).getroot()
counts = {"passed": 0, "failed": 0, "skipped": 0, "error": 0}
failed = []
for case in root.iter("testcase"):
    outcome = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")),
                   "passed")
    outcome = {"failure": "failed"}.get(outcome, outcome)
    counts[outcome] += 1
    if outcome in ("failed", "error"):
        child = next(c for c in case if c.tag in ("failure", "error"))
        first = (child.get("message") or "").strip().splitlines()[:1]
        failed.append(f"{case.get('name')}: {first[0] if first else ''}")
print("  " + ", ".join(f"{v} {k}" for k, v in counts.items()))
for line in failed:
    print("  FAILED " + line)
EOF
}

# The end-of-run table of values against floors, and pytest-benchmark's regression lines.
report() {
  awk '/= kernelperf floors =/ {on = 1; print; next} on && /^$/ && rows {exit}
       on && NF {print; rows++}' "$1" | tee -a "$OUT/summary.txt"
  sed -n '/^Performance has regressed:/,/^---/p' "$1" | tee -a "$OUT/summary.txt"
}

run_suite() {  # name, extra pytest arguments...
  local name=$1; shift
  log "$name: $PY -m pytest ${PYTEST[*]} ${K_ARGS[*]} $*"
  gpu_state
  local start=$SECONDS
  "$PY" -m pytest "${PYTEST[@]}" "${K_ARGS[@]}" --junitxml="$STATE/$name.xml" "$@" \
    >"$STATE/$name.log" 2>&1
  local rc=$?
  cp "$STATE/$name.xml" "$STATE/$name.log" "$OUT/"
  log "$name: exit status $rc after $((SECONDS - start)) s"
  gpu_state
  junit_summary "$OUT/$name.xml"
  report "$OUT/$name.log"
  return $rc
}

phase_run1() {
  run_suite "run1-$PART" --benchmark-autosave
}

phase_run2() {
  # Compared with every run saved before (on a fresh machine: run1, whole or in parts).
  run_suite "run2-$PART" --benchmark-autosave --benchmark-compare='*' \
    --benchmark-compare-fail=median:5%
  local rc=$?
  if [ ! -f "$STATE/run1-$PART.xml" ]; then
    log "run2: no run1-$PART.xml in $STATE (machine not kept warm?): no flake check"
    return 1
  fi
  "$PY" - "$STATE/run1-$PART.xml" "$STATE/run2-$PART.xml" <<'EOF' | tee -a "$OUT/summary.txt"
import sys
import xml.etree.ElementTree as ET

def verdicts(path):
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        tags = [c.tag for c in case if c.tag in ("failure", "error", "skipped")]
        out[case.get("name")] = tags[0] if tags else "passed"
    return out

first, second = verdicts(sys.argv[1]), verdicts(sys.argv[2])
changed = sorted(k for k in first.keys() & second.keys() if first[k] != second[k])
print(f"  floors, run1 vs run2: {len(first.keys() & second.keys())} items in both, "
      f"{len(changed)} changed verdict" + "".join(f"\n    {k}: {first[k]} -> {second[k]}"
                                                   for k in changed))
EOF
  local model
  model=$("$PY" -c 'from kernels import fingerprint; print(fingerprint.fingerprint().model)')
  log "pytest-benchmark compare over the saved runs (.benchmarks/$model):"
  "$PY" -m pytest_benchmark --storage "file://./.benchmarks/$model" compare \
    --columns=median,iqr,rounds --group-by=group 2>&1 | tail -60 >"$OUT/compare.txt"
  head -30 "$OUT/compare.txt" | tee -a "$OUT/summary.txt"
  if "$PY" -c 'import pygal' 2>/dev/null; then
    "$PY" -m pytest_benchmark --storage "file://./.benchmarks/$model" compare \
      --histogram "$OUT/histogram" >/dev/null 2>&1 && log "histograms: $(ls "$OUT"/histogram* | wc -l) SVG files"
  else
    log "pytest-benchmark compare --histogram needs pygal (not installed here); skipped"
  fi
  return $rc
}

phase_plant() {
  local scratch
  scratch=$(mktemp -d)/kernelperf
  mkdir -p "$scratch"
  tar --exclude=./.git --exclude=./.benchmarks --exclude=./gpu-verify-out -cf - . \
    | tar -xf - -C "$scratch"
  local store="file://$scratch/.plant-history"
  local k=$PLANT_K
  (cd "$scratch" && "$PY" -c 'import kernels; print("  kernels from", kernels.__file__)') \
    | tee -a "$OUT/summary.txt"
  log "plant: unplanted items first, saved as 'unplanted' ($scratch)"
  (cd "$scratch" && K_ARGS=() && \
    run_suite plant-before -k "$k" --benchmark-storage="$store" --benchmark-save=unplanted)
  sed -i "s/^MAX_BLOCK_COLS = 4096\$/MAX_BLOCK_COLS = $PLANT_COLS/" \
    "$scratch/kernels/ops/softmax/pallas.py"
  if ! grep -q "^MAX_BLOCK_COLS = $PLANT_COLS\$" "$scratch/kernels/ops/softmax/pallas.py"; then
    log "plant: did not apply (MAX_BLOCK_COLS = 4096 not found in kernels/ops/softmax/pallas.py)"
    return 2
  fi
  log "plant: MAX_BLOCK_COLS = 4096 -> $PLANT_COLS in the scratch copy's kernels/ops/softmax/pallas.py"
  (cd "$scratch" && K_ARGS=() && \
    run_suite plant-after -k "$k" --benchmark-storage="$store" --benchmark-compare='*unplanted' \
    --benchmark-compare-fail=median:5%)
  local rc=$?
  log "plant: exit status $rc (1 expected: floor failures and a median regression)"
  grep -B2 -A8 'under its floor' "$OUT/plant-after.log" | head -60 >"$OUT/plant-floor-message.txt"
  head -30 "$OUT/plant-floor-message.txt" | tee -a "$OUT/summary.txt"
  cp -r "$scratch/.plant-history" "$OUT/plant-history" 2>/dev/null
  rm -rf "$(dirname "$scratch")"
}

log "gpu_verify: phases ${PHASES[*]}; $(git rev-parse --short HEAD 2>/dev/null || echo 'no git')"
status=0
for phase in "${PHASES[@]}"; do
  case $phase in
    run1) phase_run1 || status=1 ;;
    run2) phase_run2 || status=1 ;;
    plant) phase_plant ;;
    *) echo "unknown phase $phase (run1, run2, plant)"; exit 2 ;;
  esac
done
[ -d .benchmarks ] && cp -r .benchmarks "$OUT/benchmarks"
log "gpu_verify: done (exit $status: run1/run2 failures, if any, are above)"
exit $status
