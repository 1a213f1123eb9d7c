#!/bin/bash
# Runs the GPU-machine checks from prebuilt binaries in target/gpu (built on the developer
# machine by `cargo xtask gpu-bundle`; the GPU machine has no registry access). Output goes to
# stdout and, when $OUT is set, to $OUT/gpu-run.txt.
set -u
B=${BIN:-target/gpu}
DIR=${UGDS_TEST_DIR:-/tmp}
export UGDS_TEST_DIR=$DIR
run() { echo; echo "\$ $*"; "$@" 2>&1; echo "(exit $?)"; }
{
  run nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  run head -1 /proc/driver/nvidia/version
  run df -T "$DIR"
  run "$B/ugds" doctor
  run "$B/cuda-tests" --ignored --test-threads=1 --nocapture
  run "$B/ugds" bench-gpu --file "$DIR/ugds-bench.dat" --file-size "${FILE_SIZE:-4G}" --seconds "${SECONDS_PER:-1}"
  NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  if run "$NVCC" -O2 -o "$DIR/cufile_probe" tests/gpu/cufile_probe.c -lcufile -lcudart; then
    run "$DIR/cufile_probe" "$DIR/ugds-bench.dat" "$(( $(stat -c %s "$DIR/ugds-bench.dat") >> 20 ))"
  fi
  rm -f "$DIR/ugds-bench.dat"
} | tee "${OUT:-/tmp}/gpu-run.txt"
