#!/usr/bin/env bash
# One-GPU scripts run side by side on a multi-GPU host, one per GPU, in one device call:
# job i (a shell command line) runs with CUDA_VISIBLE_DEVICES=i, its own clone of the bundle
# (REPO=/tmp/repo-gpu$i), its own empty HOME (FRESH_HOME=/tmp/home-gpu$i: JAX, Triton and nvcc
# caches and ~/.asv-machine.json apart) and its own OUT ($OUT/gpu$i, its output in job.log
# there). Each job is cut at JOB_LIMIT seconds (SIGINT first, as the scripts' own watchdogs
# do); then each job's last lines are printed, in GPU order, and every job's OUT is packed
# into $OUT/per_gpu.tgz (the device tool brings back 8 files at most). The GPUs share the
# host's CPUs and power: numbers compared with each other must come from the same job, or
# from two jobs of the same call (say so where they are reported).
#
#   bash .ci/device/per_gpu.sh "bash .ci/device/gate_full.sh" \
#       "bash .ci/device/gpu_pytest_check.sh full" ...
set -uo pipefail
cd "$(dirname "$0")/../.."
. .ci/device/common.sh
export SITE_READY=1  # installed above, once: the jobs' common.sh skips pip
JOB_LIMIT=${JOB_LIMIT:-570}
TAIL=${TAIL:-25}
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
if [ "$#" -gt "$gpus" ]; then
    echo "per_gpu.sh: expected at most $gpus jobs (one per GPU), got $#" >&2
    exit 2
fi
root=$OUT
pids=()
for i in $(seq 0 $(($# - 1))); do
    job=${*:$((i + 1)):1}
    mkdir -p "$root/gpu$i"
    echo "gpu $i: $job" | tee "$root/gpu$i/job.txt"
    (
        export CUDA_VISIBLE_DEVICES=$i REPO=/tmp/repo-gpu$i FRESH_HOME=/tmp/home-gpu$i
        export OUT=$root/gpu$i HOME=/tmp/home-gpu$i
        mkdir -p "$HOME"
        start=$(date +%s)
        timeout -s INT -k 30 "$JOB_LIMIT" bash -c "$job" > "$OUT/job.log" 2>&1
        echo "gpu $i: exit $? after $(($(date +%s) - start)) s" >> "$OUT/job.log"
    ) &
    pids+=($!)
done
wait "${pids[@]}"
for i in $(seq 0 $(($# - 1))); do
    echo "===== gpu $i: $(cat "$root/gpu$i/job.txt")"
    tail -n "$TAIL" "$root/gpu$i/job.log"
done
tar czf "$root/per_gpu.tgz" -C "$root" $(cd "$root" && ls -d gpu*) && rm -rf "$root"/gpu*
