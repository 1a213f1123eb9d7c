#!/bin/bash
# Two builds side by side on stream-ordered I/O: uGDS's own cufile_bench (4 KiB reads at depth 1,
# synchronous and stream-ordered, p50 of 262,144 each) and bench_overlap (16 queued 1 MiB writes
# against 16 synchronous ones), both compiled unchanged against each build's header and library.
# The builds take turns, in the opposite order in every second round.
#
#   ROUNDS=2 bash tests/gpu/stream_ab.sh BASE_BUNDLE NEW_BUNDLE
#
# Each bundle is a `cargo xtask gpu-bundle` output (target/gpu) holding ugds-perf/ (cufile_bench.cu,
# bench_overlap.cu, bench_utils.h from ScaleX-IO/uGDS test/perf) and, optionally, BUILT_FROM.
set -u
A=$1 B=$2
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
W=${UGDS_TEST_DIR:-/tmp}/stream-ab
mkdir -p "$W"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for side in A B; do
  dir=${!side}
  P=$dir/prefix PD=$dir/ugds-perf
  echo "$side: $dir, built from $(cat "$dir/BUILT_FROM" 2>/dev/null || echo '?')"
  "$NVCC" -O2 -I"$P/include" -I"$PD" "$PD/cufile_bench.cu" -L"$P/lib" -lugds -lcudart -lpthread \
    -Xlinker -rpath="$P/lib" -o "$W/cufile_bench-$side" || echo "$side: cufile_bench did not compile"
  "$NVCC" -O2 -I"$P/include" -I"$PD" "$PD/bench_overlap.cu" -L"$P/lib" -lugds -lcudart \
    -Xlinker -rpath="$P/lib" -o "$W/bench_overlap-$side" || echo "$side: bench_overlap did not compile"
done
head -c 1G /dev/zero >"$W/bench.dat"
head -c 64M /dev/zero >"$W/overlap.dat"
sync
for round in $(seq 1 "${ROUNDS:-2}"); do
  order="A B"
  [ $((round % 2)) = 0 ] && order="B A"
  for side in $order; do
    for m in read async-read; do
      echo "== round $round, $side, cufile_bench $m"
      timeout 90 "$W/cufile_bench-$side" -f "$W/bench.dat" -l 1G -s 4K -m $m | grep -E "Avg latency|p50.0|p99.0"
    done
    echo "== round $round, $side, bench_overlap"
    timeout 90 "$W/bench_overlap-$side" "$W/overlap.dat" 0 1M 16 | grep -E "Sequential|Overlap \(|Pipeline \("
  done
done
rm -rf "$W"
