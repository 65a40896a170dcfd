#!/usr/bin/env bash
# Issues 37/38, item 2: why all-gather, reduce-scatter and all-reduce read under the 330 GB/s
# busbw asked (260-325 at 256 MiB-1 GiB per rank) while send/recv reaches 360. Runs
# `python -m kernels.sharding.collectives` (nccl-tests' definitions, device clock) at 256 MiB,
# 512 MiB and 1 GiB per rank under NCCL and XLA settings, on all GPUs and on 2, each under a
# 45 s watchdog; each variant's busbw rows go to the output, everything to
# $OUT/nccl_probe.log.
#
#   bash .ci/device/nccl_probe.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/kp-nccl}
mkdir -p "$OUT"
GPUS=$(nvidia-smi -L | wc -l)
symmetric=--xla_gpu_experimental_enable_nccl_symmetric_buffers=true
variants=(
    "defaults="
    "channels32=NCCL_MIN_NCHANNELS=32"
    "channels32+buffer16M=NCCL_MIN_NCHANNELS=32 NCCL_BUFFSIZE=16777216"
    "ring+simple+channels32=NCCL_ALGO=Ring NCCL_PROTO=Simple NCCL_MIN_NCHANNELS=32"
    "symmetric-buffers=XLA_FLAGS=$symmetric"
)
COUNTS=$GPUS; (( GPUS > 2 )) && COUNTS="$GPUS 2"  # a 2-GPU host: each variant once
for n in $COUNTS; do
    for variant in "${variants[@]}"; do
        name=${variant%%=*} settings=${variant#*=}
        [ "$n" = 2 ] && [[ $name = ring* ]] && continue
        echo "=== $n GPUs, $name: ${settings:-(none)}" | tee -a "$OUT/nccl_probe.log"
        # shellcheck disable=SC2086  # settings are NAME=VALUE words
        rows=$(env $settings timeout -k 5 45 python3 -m kernels.sharding.collectives \
            --ops all-gather reduce-scatter all-reduce --min-bytes 256M --max-bytes 1G \
            --devices "$n" 2>&1)
        status=$?
        echo "$rows" >> "$OUT/nccl_probe.log"
        [ $status = 0 ] || echo "    exit $status" | tee -a "$OUT/nccl_probe.log"
        # This variant's rows alone (a variant that failed prints none).
        echo "$rows" | grep -E "^(all-gather|reduce-scatter|all-reduce) " \
            | awk -v n="$n" -v name="$name" '{ printf "%-3s %-24s %s\n", n, name, $0 }'
    done
done
