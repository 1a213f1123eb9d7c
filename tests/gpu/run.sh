#!/bin/bash
# Runs the GPU-machine checks from prebuilt binaries in target/gpu (built here by
# `cargo xtask gpu-bundle`; the GPU machine has no registry access). Output goes to stdout and,
# when $OUT is set, to $OUT/gpu-run.txt.
set -u
B=${BIN:-$PWD/target/gpu}
P=$B/prefix
DIR=${UGDS_TEST_DIR:-/tmp}
export UGDS_TEST_DIR=$DIR
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
CUDA_LIB=$(dirname "$(dirname "$NVCC")")/lib64
run() { echo; echo "\$ $*"; "$@" 2>&1; echo "(exit $?)"; }
{
  run nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  run head -1 /proc/driver/nvidia/version
  run df -T "$DIR"
  run "$B/ugds" doctor
  run "$B/cuda-tests" --ignored --test-threads=1 --nocapture

  # The C ABI: the CUDA example against the installed header and library.
  truncate -s 128M "$DIR/ugds-example.dat"
  run "$NVCC" -O2 -o "$DIR/cuda_quickstart" examples/cuda/quickstart.cu -I"$P/include" -L"$P/lib" -lugds -lcuda -Xlinker -rpath="$P/lib"
  run "$DIR/cuda_quickstart" "$DIR/ugds-example.dat"

  # A cuFile program, unchanged: NVIDIA's libcufile, ugds's shim by relinking, and by LD_PRELOAD.
  echo '{ "properties": { "allow_compat_mode": true }, "execution": {}, "logging": { "level": "ERROR" } }' > "$DIR/cufile-compat.json"
  run grep -n -m3 'allow_compat_mode\|"use_compat_mode"' /etc/cufile.json
  run "$NVCC" -O2 -o "$DIR/rt_nvidia" tests/gpu/cufile_roundtrip.c -lcufile -lcudart
  run "$NVCC" -O2 -o "$DIR/rt_ugds" tests/gpu/cufile_roundtrip.c -L"$P/lib" -lcufile_ugds -lcudart -Xlinker -rpath="$P/lib"
  run "$DIR/rt_nvidia" "$DIR/rt-nvidia.dat"
  run env CUFILE_ENV_PATH_JSON="$DIR/cufile-compat.json" "$DIR/rt_nvidia" "$DIR/rt-nvidia.dat"
  run env CUFILE_FORCE_COMPAT_MODE=true "$DIR/rt_nvidia" "$DIR/rt-nvidia.dat"
  run tail -n 12 cufile.log
  run "$DIR/rt_ugds" "$DIR/rt-ugds.dat"
  run env LD_PRELOAD="$P/lib/libcufile_ugds.so" "$DIR/rt_nvidia" "$DIR/rt-preload.dat"
  run ldd "$DIR/rt_ugds"

  # Benchmarks: the fallback path vs pread+copy vs the disk; NVIDIA cuFile and the shim on the
  # same file.
  run "$B/ugds" bench-gpu --file "$DIR/ugds-bench.dat" --file-size "${FILE_SIZE:-4G}" --seconds "${SECONDS_PER:-1}"
  MIB=$(( $(stat -c %s "$DIR/ugds-bench.dat") >> 20 ))
  if run "$NVCC" -O2 -o "$DIR/cufile_probe" tests/gpu/cufile_probe.c -lcufile -lcudart; then
    run env CUFILE_ENV_PATH_JSON="$DIR/cufile-compat.json" "$DIR/cufile_probe" "$DIR/ugds-bench.dat" "$MIB"
    run env LD_PRELOAD="$P/lib/libcufile_ugds.so" "$DIR/cufile_probe" "$DIR/ugds-bench.dat" "$MIB"
  fi
  rm -f "$DIR"/ugds-bench.dat "$DIR"/ugds-example.dat "$DIR"/rt-*.dat
} | tee "${OUT:-/tmp}/gpu-run.txt"
