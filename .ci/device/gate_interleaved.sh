# Issue 49: the interleaved gate on one GPU, from a fresh HOME (empty JAX, Triton and nvcc
# caches; no ~/.asv-machine.json), every benchmark, in one device call per part (each fits in
# the 10 minutes of a call; PART picks it):
#   PART=aa     `python -m kernels bench --base main`, HEAD a README whitespace commit (run it
#               3 times, a call each: goal <= 7 min, 0 flagged); its time breakdown (first
#               pass and confirmation per phase, confirmation's share) and the smallest change
#               each row can call.
#   PART=power  the same over a commit with 2% plants in every family on this machine
#               (gate.PLANTS: Pallas, Triton, CUDA, XLA in softmax, matmul and row sum; their
#               whole implementations slowed, so every case and direction of them regresses):
#               goal <= 10 min, every planted row confirmed slower, 0 unplanted rows flagged.
#   PART=asv    plain `asv continuous main HEAD` as documented, on that planted commit: its wall
#               time and which plants it reports.
# Logs, rows and journals go to $OUT.
source .ci/device/common.sh
export HOME=$FRESH_HOME && mkdir -p "$HOME"
cd "$REPO" || exit 1
PART=${PART:-aa}
SIZE=${SIZE:-0.02}

# HEAD on branch `planted`: main with every plant of gate.PLANTS this machine can run, at SIZE;
# the planted rows (operation, implementation, case) in $OUT/planted.json.
planted_head() {
    git checkout -q -B planted main
    python3 - "$SIZE" "$OUT/planted.json" <<'EOF'
import json, sys
from kernels.bench import gate
from kernels.core import devices, registry
size, out = float(sys.argv[1]), sys.argv[2]
here = devices.this_machine()
platform = "gpu" if here.has_gpu else "cpu"
planted, edits = [], {}
for plant in gate.PLANTS:
    case = plant.case_for(platform, here.device_count)
    impl = registry.implementation(plant.op, plant.impl)
    if devices.case_unavailable_reason(impl, registry.operation(plant.op).case(case)):
        continue
    path = registry.module_path(plant.op, plant.impl)
    edits[path] = edits.get(path, "") + gate.plant_source(
        plant.op, plant.impl, min(1.0, size * plant.scale), impl.framework, plant.site)
    planted.append([plant.family, plant.op, plant.impl, case])
for path, text in edits.items():
    with open(path, "a") as file:
        file.write(text)
json.dump(planted, open(out, "w"))
print(f"planted {len(planted)}: " + ", ".join(f"{o}-{i} {c}" for _, o, i, c in planted))
EOF
    git commit -qam "plants at $SIZE"
}

# The verdicts of rows.json against planted.json: each planted row's, and the rows flagged
# that no plant explains.
judge() {
    python3 - "$1" "$OUT/planted.json" <<'EOF'
import json, sys
from kernels.core import registry
rows, planted = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
ops = {registry.benchmark_class(op.name): op.name for op in registry.operations()}
plants = {(op, impl): (family, case) for family, op, impl, case in planted}
flagged = caught = 0
for row in rows:
    if not row["benchmark"].endswith(".time_device"):
        continue
    op = ops.get(row["benchmark"].split(".")[-2], row["benchmark"])
    impl, case, direction = (p.strip("'") for p in row["params"])
    word = row["verdict"]
    if (op, impl) in plants:
        family, planted_case = plants[(op, impl)]
        flagged += word == "slower"
        if (case, direction) == (planted_case, "fwd"):
            caught += word == "slower"
            print(f"plant {family:7} {op}-{impl} {case}: {row['ratio']:.3f} gap "
                  f"{row['gap']:.1%} [{row['confirmed'] or '-'}] -> {word}")
    elif word in ("slower", "FAILED on head"):
        print(f"UNPLANTED FLAGGED {op}-{impl} {case} {direction}: {row['ratio']} -> {word}")
print(f"planted rows caught {caught} of {len(plants)}; rows of planted implementations "
      f"slower: {flagged}")
EOF
}

summarise() {
    grep -E "^summary|^smallest change|^interleaved gate on|^kernels bench:|FAILED" "$1" | head -12
    grep -A24 "^interleaved gate on" "$1" | grep -E "^(phase|the |worker|backend|JAX|inputs|compile|warm|sampling|commits|asv results|total)" | head -20
}

case $PART in
aa)
    git checkout -q -B aa main && echo >> README.md && git commit -qam "A/A: README whitespace"
    stamp "kernels bench (A/A)"
    start=$(date +%s)
    timeout -s INT -k 20 ${BENCH_TIMEOUT:-560} python3 -m kernels bench --base main \
        --json "$OUT/rows.json" > "$OUT/bench.log" 2>&1
    echo "kernels bench exit $? after $(( $(date +%s) - start )) s"
    summarise "$OUT/bench.log"
    grep -A40 "^smallest change" "$OUT/bench.log" | grep "^  " | head -20
    ;;
power)
    planted_head
    stamp "kernels bench (plants at $SIZE)"
    start=$(date +%s)
    timeout -s INT -k 20 ${BENCH_TIMEOUT:-560} python3 -m kernels bench --base main \
        --json "$OUT/rows.json" > "$OUT/bench.log" 2>&1
    echo "kernels bench exit $? after $(( $(date +%s) - start )) s"
    summarise "$OUT/bench.log"
    [ -f "$OUT/rows.json" ] && judge "$OUT/rows.json"
    ;;
asv)
    planted_head
    stamp "asv continuous main HEAD (plants at $SIZE)"
    start=$(date +%s)
    timeout -s INT -k 20 ${BENCH_TIMEOUT:-560} python3 -m asv continuous main HEAD \
        > "$OUT/asv.log" 2>&1
    echo "asv continuous main HEAD exit $? after $(( $(date +%s) - start )) s"
    grep -iE "BENCHMARKS NOT SIGNIFICANTLY|SOME BENCHMARKS HAVE|PERFORMANCE (IN|DE)CREASED" \
        "$OUT/asv.log"
    python3 - "$OUT/asv.log" "$OUT/planted.json" <<'EOF'
import json, sys
log, planted = open(sys.argv[1]).read().splitlines(), json.load(open(sys.argv[2]))
marked = [line for line in log if line.startswith("| +")]
for family, op, impl, case in planted:
    hit = [line for line in marked if f"'{impl}', '{case}'" in line]
    print(f"plant {family:7} {op}-{impl} {case}: {'reported' if hit else 'not reported'}")
print(f"{len(marked)} row(s) marked worse in all")
EOF
    ;;
*)
    echo "PART: expected aa, power or asv, got $PART"; exit 2
    ;;
esac
tar czf "$OUT/journals.tgz" .asv/results .asv/confirm/journals 2>/dev/null
stamp done
