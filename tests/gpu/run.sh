#!/bin/bash
# Runs the GPU-machine checks from prebuilt binaries in target/gpu (built here by
# `cargo xtask gpu-bundle`; the GPU machine has no registry access). Output goes to stdout and,
# when $OUT is set, to $OUT/gpu-run.txt.
#
# STEPS selects what runs (comma-separated; default "all"):
#   new = func,stream,overhead,python,pyugds,vllm,nixl      old = base,cuda,examples,cufile,bench
#   func      uGDS's own functional tests (target/gpu/ugds-functional, fetched from
#             ScaleX-IO/uGDS, never committed), compiled unchanged against our header and -lugds
#   stream    tests/gpu/stream_lifetime.cu
#   overhead  tests/gpu/cufile_overhead.cu through the drop-in, and through NVIDIA's libcufile
#   python    kvikio and cufile-python (wheels in target/gpu/wheels) through the drop-in
#   pyugds    the ugds Python package (target/gpu/ugds-wheel) with torch/CuPy CUDA memory
#   vllm      ugds.vllm, the vLLM offloading spec, with CUDA KV tensors (tests/gpu/vllm_offload_cuda.py;
#             vLLM itself is not installed there: the spec runs on its stand-ins for vLLM's classes)
#   nixl      the UGDS NIXL plugin with CUDA memory beside NIXL's POSIX plugin (and, with
#             NIXL_GDS_MT=1, its GDS_MT plugin), through NIXL's Python API
#             (tests/nixl/test_nixl_ugds.py --vram; nixl-cu12 from target/gpu/nixl)
#   base      machine facts and `ugds doctor`; cuda: the Rust CUDA tests; examples: the C
#             example; cufile: the cuFile round-trip programs; bench: `ugds bench-gpu` + probe
#   smallio   `ugds bench-gpu --breakdown` (4K, 64K: disk, copy, sync vs poll) and `--depths`
#             (4K batches of 1..128 against the naive pread + copy loop)
#   streamfloor tests/gpu/stream_floor.cu: the stream machinery's own round trip (the stream
#             writes a word, a host thread answers with another), against a synchronize
#   overlap   uGDS's own perf programs (target/gpu/ugds-perf: test/perf/bench_overlap.cu,
#             cufile_bench.cu and bench_utils.h from ScaleX-IO/uGDS, never committed), compiled
#             unchanged against our header: 16 queued asynchronous 1 MiB writes beside kernels vs
#             synchronous ones, and a 4 KiB read synchronous vs stream-ordered at depth 1;
#             then tests/gpu/overlap_probe.cu, the overlap loop with timestamps
#   copypaths tests/gpu/small_copy_paths.cu: a small read's copy to the GPU by the copy engine
#             vs a kernel reading mapped pinned host memory, with and without the disk
# Every step has a time limit and reports its exit status; a failing step never stops the rest.
set -u
B=${BIN:-$PWD/target/gpu}
P=$B/prefix
DIR=${UGDS_TEST_DIR:-/tmp}
export UGDS_TEST_DIR=$DIR
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
CUDA_LIB=$(dirname "$(dirname "$NVCC")")/lib64
STEPS=${STEPS:-all}
want() {
  case ",$STEPS," in
    *",all,"* | *",$1,"*) return 0 ;;
    *",new,"*) [[ $1 =~ ^(func|stream|overhead|python|pyugds|vllm|nixl)$ ]] ;;
    *",old,"*) [[ $1 =~ ^(base|cuda|examples|cufile|bench)$ ]] ;;
    *) return 1 ;;
  esac
}
# run [T=seconds] CMD...: prints the command, its output and its exit status (124 = timed out).
run() {
  local t=${T:-300}
  echo
  echo "\$ $*"
  timeout -k 10 "$t" "$@" 2>&1
  local rc=$?
  echo "(exit $rc)"
  return $rc
}
section() { echo; echo "=================== $* ==================="; }

# ---------------------------------------------------------------------------------------------
# uGDS's functional tests, unchanged, against a regular file (the fallback path).
func_tests() {
  local FD=$B/ugds-functional W=$DIR/ugds-func
  section "uGDS functional tests (ScaleX-IO/uGDS test/functional, unchanged) against a file"
  if [ ! -d "$FD" ]; then
    echo "SKIP: $FD is missing (fetch the sources first)"
    return
  fi
  rm -rf "$W"
  mkdir -p "$W/bin" "$W/log"
  echo "compile: $NVCC -O2 -I$P/include -I<test dir> -I$FD TEST.cu -L$P/lib -lugds -lcudart -Xlinker -rpath=$P/lib -o TEST"
  echo "run:     TEST $DIR/ugds-func.dat 0   (a fresh 512 MiB sparse file each time; 120 s limit)"
  local f name n=0 srcs=()
  # A pattern that matches nothing (uGDS main has no cuda/ folder) is no test.
  for f in "$FD"/*.cu "$FD"/cuda/*.cu; do [ -e "$f" ] && srcs+=("$f"); done
  local have_verbs=0
  [ -f /usr/include/infiniband/verbs.h ] && have_verbs=1
  for f in "${srcs[@]}"; do
    name=$(basename "$f" .cu)
    [[ $f == */cuda/* ]] && name="cuda_$name"
    (
      timeout 300 "$NVCC" -O2 -I"$P/include" -I"$(dirname "$f")" -I"$FD" "$f" -L"$P/lib" -lugds -lcudart \
        -Xlinker -rpath="$P/lib" -o "$W/bin/$name" >"$W/log/$name.cc" 2>&1
      echo $? >"$W/log/$name.ccrc"
    ) &
    n=$((n + 1))
    [ $((n % 16)) -eq 0 ] && wait
  done
  if [ $have_verbs = 1 ]; then
    timeout 300 "$NVCC" -O2 -D_RDMA -I"$P/include" -I"$FD" "$FD/test_rdma_tracked.cu" -L"$P/lib" -lugds -lcudart \
      -libverbs -Xlinker -rpath="$P/lib" -o "$W/bin/test_rdma_tracked_RDMA" >"$W/log/test_rdma_tracked_RDMA.cc" 2>&1
    echo $? >"$W/log/test_rdma_tracked_RDMA.ccrc"
  else
    echo "note: /usr/include/infiniband/verbs.h absent: test_rdma_tracked is built without -D_RDMA only"
  fi
  wait
  local rows=() failed=() rc res why last
  for ccrc in "$W"/log/*.ccrc; do
    name=$(basename "$ccrc" .ccrc)
    why=""
    case $name in
      test_interrupt_ioctls) why="uGDS's private kernel-module ioctls (type 0x80, nr 5/6/7) on the device fd" ;;
      test_batch_interrupt) why="counts ugds_drv MSI-X interrupts in /proc/interrupts (real device needed)" ;;
      test_nvmeof_direct) why="includes uGDS's private ../../src/ugds_nvmeof_capsule.h; needs an nvme-rdma namespace" ;;
      test_nvmeof_register) why="NVMe-oF branch API (uGDSHandleRegisterNvmeof); needs an NVMe-oF block device" ;;
      test_rdma_export | test_rdma_tracked | test_rdma_tracked_RDMA) why="RDMA: exit 77 expected without a verbs device" ;;
    esac
    echo
    echo "----- $name"
    if [ "$(cat "$ccrc")" != 0 ]; then
      grep -m6 -E "error|undefined" "$W/log/$name.cc"
      last=$(grep -m1 -E "error|undefined" "$W/log/$name.cc" | sed 's/.*error: //' | cut -c1-110)
      if [ -n "$why" ]; then res="SKIP"; else res="FAIL"; fi
      rows+=("| $name | $res | compile error | ${why:+$why; }$last |")
      continue
    fi
    rm -f "$DIR/ugds-func.dat"
    truncate -s 512M "$DIR/ugds-func.dat"
    timeout -k 5 120 "$W/bin/$name" "$DIR/ugds-func.dat" 0 >"$W/log/$name.out" 2>&1
    rc=$?
    cat "$W/log/$name.out"
    echo "(exit $rc)"
    last=$(grep -v '^\s*$' "$W/log/$name.out" | tail -1 | cut -c1-140)
    if [ $rc = 0 ]; then
      res=PASS
    elif [ $rc = 77 ]; then
      res=SKIP
    elif [ -n "$why" ]; then
      res="SKIP"
    else
      res=FAIL
    fi
    [ $rc -ge 128 ] && last="killed by signal $((rc - 128)); $last"
    [ $rc = 124 ] && last="timed out (120 s); $last"
    [ "$res" = SKIP ] || why=""
    rows+=("| $name | $res | exit $rc | ${why:+$why; }$last |")
    [ "$res" = FAIL ] && failed+=("$name")
  done
  # A failure that comes and goes is a race: run each failed test again, 20 times.
  for name in "${failed[@]}"; do
    local pass=0 i outs=""
    for i in $(seq 20); do
      rm -f "$DIR/ugds-func.dat"
      truncate -s 512M "$DIR/ugds-func.dat"
      if timeout -k 5 60 "$W/bin/$name" "$DIR/ugds-func.dat" 0 >"$W/log/$name.rep" 2>&1; then
        pass=$((pass + 1))
      else
        outs="$(tail -1 "$W/log/$name.rep")"
      fi
    done
    echo "repeat: $name passed $pass of 20 more runs${outs:+ (last failure: $outs)}"
    rows=("${rows[@]/"| $name | FAIL | "/"| $name | FAIL ($pass/20 passed on repeat) | "}")
  done
  rm -f "$DIR/ugds-func.dat"
  echo
  echo "uGDS functional tests:"
  echo "| test | result | how it ended | output / reason |"
  echo "| --- | --- | --- | --- |"
  printf '%s\n' "${rows[@]}"
  printf '%s\n' "${rows[@]}" | awk -F'|' '{s=$3; gsub(/^ +/,"",s); split(s,a," "); c[a[1]]++} END {printf "FUNCTIONAL PASS=%d FAIL=%d SKIP=%d\n", c["PASS"], c["FAIL"], c["SKIP"]}'
}

# ---------------------------------------------------------------------------------------------
stream_lifetime() {
  section "stream lifetime (tests/gpu/stream_lifetime.cu)"
  run "$NVCC" -O2 -o "$DIR/stream_lifetime" tests/gpu/stream_lifetime.cu -I"$P/include" -L"$P/lib" -lugds -lcudart \
    -Xlinker -rpath="$P/lib" &&
    T=200 run "$DIR/stream_lifetime" "$DIR/stream-lifetime.dat"
}

# ---------------------------------------------------------------------------------------------
overhead() {
  section "cuFile drop-in overhead at 4 KiB (tests/gpu/cufile_overhead.cu)"
  # Against CUDA's own cufile.h (layouts checked by the compiler), linked with -lcufile from the
  # drop-in's directory; and the same source against NVIDIA's libcufile.
  run "$NVCC" -O2 -DUSE_CUFILE_H -o "$DIR/ov_ugds" tests/gpu/cufile_overhead.cu -L"$P/lib/ugds-cufile" -lcufile -lcudart \
    -Xlinker -rpath="$P/lib/ugds-cufile" && run ldd "$DIR/ov_ugds" | grep -i cufile
  run "$NVCC" -O2 -DUSE_CUFILE_H -o "$DIR/ov_nvidia" tests/gpu/cufile_overhead.cu -L"$CUDA_LIB" -lcufile -lcudart
  T=240 run "$DIR/ov_ugds" "$DIR/ov-1g.dat" "${OV_ROUNDS:-15}" "${OV_READS:-500}"
  T=120 run "$DIR/ov_nvidia" "$DIR/ov-1g.dat" 3 200
  T=120 run env CUFILE_ENV_PATH_JSON="$DIR/cufile-compat.json" "$DIR/ov_nvidia" "$DIR/ov-1g.dat" 3 200
  T=120 run env CUFILE_FORCE_COMPAT_MODE=true CUFILE_ENV_PATH_JSON="$DIR/cufile-compat.json" "$DIR/ov_nvidia" "$DIR/ov-1g.dat" 3 200
  [ -f cufile.log ] && run tail -n 8 cufile.log
  rm -f "$DIR/ov-1g.dat"
}

# ---------------------------------------------------------------------------------------------
# wheel_into DIR: pip install of the ugds wheel (nothing else) into DIR, anew; fails (after
# saying so) when there is no wheel.
wheel_into() {
  if ! ls "$B"/ugds-wheel/ugds-*.whl >/dev/null 2>&1; then
    echo "SKIP: no wheel in $B/ugds-wheel (cargo xtask gpu-bundle builds it)"
    return 1
  fi
  rm -rf "$1"
  run python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$1" "$B"/ugds-wheel/ugds-*.whl
}

# The ugds Python package: pip install of the wheel (nothing else), then CUDA memory through it.
pyugds() {
  section "the ugds Python package with CUDA memory"
  local X=$DIR/pyugds
  wheel_into "$X" || return
  T=300 run env PYTHONPATH="$X" PYTHONUNBUFFERED=1 python3 tests/gpu/ugds_py_cuda.py "$DIR"
  T=60 run env PYTHONPATH="$X" python3 -m ugds doctor
  # 4 KiB reads through the package, one call and batches of 128 (the CLI's bench takes ugds
  # nodes only, so the Rust side of the comparison runs in the VM: docs/python.md).
  truncate -s 1G "$DIR/pyugds-bench.dat"
  T=60 run env PYTHONPATH="$X" python3 -m ugds bench "$DIR/pyugds-bench.dat" --rw randread --bs 4K --runtime 3 --size 1G
  T=60 run env PYTHONPATH="$X" python3 -m ugds bench "$DIR/pyugds-bench.dat" --rw randread --bs 4K --runtime 3 --size 1G --iodepth 128
  rm -f "$DIR/pyugds-bench.dat"
  T=400 run env PYTHONPATH="$X" PYTHONUNBUFFERED=1 python3 tests/gpu/ugds_kv_bench.py "$DIR"
}

# ---------------------------------------------------------------------------------------------
# ugds.vllm with CUDA KV tensors: the wheel as in pyugds (vLLM is not installed: its stand-ins).
vllm_spec() {
  section "ugds.vllm (the vLLM offloading spec) with CUDA KV tensors"
  local X=$DIR/pyugds-vllm
  wheel_into "$X" || return
  T=400 run env PYTHONPATH="$X" PYTHONUNBUFFERED=1 python3 tests/gpu/vllm_offload_cuda.py "$DIR"
}

# ---------------------------------------------------------------------------------------------
# The NIXL plugin with VRAM: NIXL's own wheel (nixl-cu12, for this machine's python, carried in
# $B/nixl), installed with pip without its dependencies; a plugin folder with our plugin and
# NIXL's POSIX plugin, as the host phase makes (xtask/src/nixl.rs).
nixl_vram() {
  section "the UGDS NIXL plugin with CUDA memory (tests/nixl/test_nixl_ugds.py --vram)"
  if ! ls "$B"/nixl/nixl_cu12-*.whl >/dev/null 2>&1; then
    echo "SKIP: no nixl-cu12 wheel in $B/nixl (docs/nixl.md says how to carry one)"
    return
  fi
  local X=$DIR/nixl-site D=$DIR/nixl-plugins
  rm -rf "$X" "$D"
  mkdir -p "$D"
  run python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$X" "$B"/nixl/nixl_cu12-*.whl || return
  ln -s "$P/lib/nixl/libplugin_UGDS.so" "$D/libplugin_UGDS.so"
  ln -s "$X/.nixl_cu12.mesonpy.libs/plugins/libplugin_POSIX.so" "$D/libplugin_POSIX.so"
  local libs="$X/.nixl_cu12.mesonpy.libs:$X/nixl_cu12.libs" gds=() gds_env=()
  # NIXL's GDS_MT plugin beside ours (NIXL_GDS_MT=1): it is built for CUDA 12, so CUDA 12's
  # runtime and NVIDIA's libcufile come from their wheels (nvidia-cuda-runtime-cu12,
  # nvidia-cufile-cu12). NVIDIA's libcufile needs udev's record of the file's volume to register
  # a file, which a machine without udev lacks (docs/nixl.md).
  if [ "${NIXL_GDS_MT:-0}" = 1 ] && ls "$B"/nixl/nvidia_cuda_runtime_cu12-*.whl "$B"/nixl/nvidia_cufile_cu12-*.whl >/dev/null 2>&1; then
    run python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$X" \
      "$B"/nixl/nvidia_cuda_runtime_cu12-*.whl "$B"/nixl/nvidia_cufile_cu12-*.whl &&
      ln -s "$X/.nixl_cu12.mesonpy.libs/plugins/libplugin_GDS_MT.so" "$D/libplugin_GDS_MT.so" &&
      libs="$libs:$X/nvidia/cuda_runtime/lib:$X/nvidia/cufile/lib" && gds=(--gds-mt)
    # No nvidia-fs here: NVIDIA's libcufile serves GDS_MT in its compatibility mode.
    [ ${#gds[@]} -gt 0 ] && gds_env=(CUFILE_FORCE_COMPAT_MODE=true)
  fi
  T=300 run env PYTHONPATH="$X" NIXL_PLUGIN_DIR="$D" PYTHONUNBUFFERED=1 CUFILE_ENV_PATH_JSON="$DIR/cufile-compat.json" \
    LD_LIBRARY_PATH="$libs" "${gds_env[@]}" python3 tests/nixl/test_nixl_ugds.py --vram "${gds[@]}"
}

# ---------------------------------------------------------------------------------------------
python_clients() {
  section "real clients: kvikio and cufile-python through the drop-in"
  local X=$DIR/pyext D=$P/lib/ugds-cufile
  if ! ls "$B"/wheels/*.whl >/dev/null 2>&1; then
    echo "SKIP: no wheels in $B/wheels"
    return
  fi
  rm -rf "$X"
  run python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$X" "$B"/wheels/*.whl || return
  run python3 -m pip show cuda-pathfinder nvidia-cufile cupy-cuda13x torch 2>&1 | grep -E "^(Name|Version|Location):"
  run python3 -c "import cuda.pathfinder as p; print(p.load_nvidia_dynamic_lib('cufile'))"
  export PYTHONPATH=$X PYTHONUNBUFFERED=1
  # kvikio's AUTO mode takes its POSIX path unless cuFile looks usable to it: libcufile loads,
  # /run/udev is readable and the machine is not WSL.
  run ls -ld /run/udev
  local K="KVIKIO_COMPAT_MODE=OFF KVIKIO_GDS_THRESHOLD=1"
  echo
  echo "--- kvikio, recipe 0: nothing set (kvikio loads the libcufile.so.0 of the nvidia-cufile wheel)"
  T=150 run env $K python3 tests/gpu/kvikio_client.py "$DIR"
  echo
  echo "--- kvikio, recipe 1: LD_LIBRARY_PATH=$D"
  T=150 run env $K LD_LIBRARY_PATH="$D" python3 tests/gpu/kvikio_client.py "$DIR"
  echo
  echo "--- kvikio, recipe 2: LD_PRELOAD=$D/libcufile.so.0"
  T=150 run env $K LD_PRELOAD="$D/libcufile.so.0" python3 tests/gpu/kvikio_client.py "$DIR"
  echo
  echo "--- kvikio, recipe 2 with kvikio's defaults (compat mode AUTO, GDS threshold 16 KiB): informational"
  T=150 run env LD_PRELOAD="$D/libcufile.so.0" python3 tests/gpu/kvikio_client.py "$DIR"
  echo
  echo "--- loader trace for recipe 2 (LD_DEBUG=libs, lines naming libcufile)"
  T=60 run env LD_DEBUG=libs LD_PRELOAD="$D/libcufile.so.0" KVIKIO_COMPAT_MODE=OFF python3 -c \
    "import kvikio, kvikio.cufile_driver; kvikio.cufile_driver.driver_open(); print('libcufile', kvikio.cufile_driver.libcufile_version())" \
    2>&1 | grep -E "libcufile|^libcufile" | grep -v "search path" | head -20
  echo
  echo "--- cufile-python, nothing set"
  T=150 run python3 tests/gpu/cufile_python_client.py "$DIR"
  echo
  echo "--- cufile-python, LD_LIBRARY_PATH=$D"
  T=150 run env LD_LIBRARY_PATH="$D" python3 tests/gpu/cufile_python_client.py "$DIR"
  unset PYTHONPATH
}

{
  echo "STEPS=$STEPS  $(date -u +%FT%TZ)"
  echo '{ "properties": { "allow_compat_mode": true }, "execution": {}, "logging": { "level": "ERROR" } }' >"$DIR/cufile-compat.json"
  if want base; then
    [ -f "$B/BUILT_FROM" ] && cat "$B/BUILT_FROM"
    run nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    run head -1 /proc/driver/nvidia/version
    run df -T "$DIR"
    run "$B/ugds" doctor
  fi
  want func && func_tests
  want stream && stream_lifetime
  want overhead && overhead
  want python && python_clients
  want pyugds && pyugds
  want vllm && vllm_spec
  want nixl && nixl_vram

  if want cuda; then
    section "Rust CUDA tests"
    T=400 run "$B/cuda-tests" --ignored --test-threads=1 --nocapture
  fi

  if want examples; then
    section "C example"
    # The C ABI: the CUDA example against the installed header and library.
    truncate -s 128M "$DIR/ugds-example.dat"
    run "$NVCC" -O2 -o "$DIR/cuda_quickstart" examples/cuda/quickstart.cu -I"$P/include" -L"$P/lib" -lugds -lcuda -Xlinker -rpath="$P/lib"
    run "$DIR/cuda_quickstart" "$DIR/ugds-example.dat"
  fi

  if want cufile; then
    section "cuFile round trip"
    # A cuFile program, unchanged: NVIDIA's libcufile, ugds's shim by relinking, and by LD_PRELOAD.
    run grep -n -m3 'allow_compat_mode\|"use_compat_mode"' /etc/cufile.json
    run "$NVCC" -O2 -o "$DIR/rt_nvidia" tests/gpu/cufile_roundtrip.c -lcufile -lcudart
    run "$NVCC" -O2 -o "$DIR/rt_ugds" tests/gpu/cufile_roundtrip.c -L"$P/lib" -lcufile_ugds -lcudart -Xlinker -rpath="$P/lib"
    run "$DIR/rt_nvidia" "$DIR/rt-nvidia.dat"
    run env CUFILE_ENV_PATH_JSON="$DIR/cufile-compat.json" "$DIR/rt_nvidia" "$DIR/rt-nvidia.dat"
    run env CUFILE_FORCE_COMPAT_MODE=true "$DIR/rt_nvidia" "$DIR/rt-nvidia.dat"
    run tail -n 12 cufile.log
    run "$DIR/rt_ugds" "$DIR/rt-ugds.dat"
    run env LD_PRELOAD="$P/lib/libcufile_ugds.so" "$DIR/rt_nvidia" "$DIR/rt-preload.dat"
    run env LD_LIBRARY_PATH="$P/lib/ugds-cufile" "$DIR/rt_nvidia" "$DIR/rt-ldpath.dat"
    run ldd "$DIR/rt_ugds"
  fi

  if want bench; then
    section "benchmarks"
    # Benchmarks: the fallback path vs pread+copy vs the disk; NVIDIA cuFile and the shim on the
    # same file.
    T=500 run "$B/ugds" bench-gpu "$DIR/ugds-bench.dat" --file-size "${FILE_SIZE:-4G}" --seconds "${SECONDS_PER:-1}"
    MIB=$(( $(stat -c %s "$DIR/ugds-bench.dat" 2>/dev/null || echo 0) >> 20 ))
    if run "$NVCC" -O2 -o "$DIR/cufile_probe" tests/gpu/cufile_probe.c -lcufile -lcudart; then
      T=120 run env CUFILE_ENV_PATH_JSON="$DIR/cufile-compat.json" "$DIR/cufile_probe" "$DIR/ugds-bench.dat" "$MIB"
      T=120 run env LD_PRELOAD="$P/lib/libcufile_ugds.so" "$DIR/cufile_probe" "$DIR/ugds-bench.dat" "$MIB"
    fi
  fi
  if want smallio; then
    section "small GPU I/O on the fallback path"
    T=300 run "$B/ugds" bench-gpu "$DIR/ugds-small.dat" --file-size 1G --sizes 4K,64K --breakdown
    T=300 run "$B/ugds" bench-gpu "$DIR/ugds-small.dat" --file-size 1G --sizes 4K --depths 1,8,32,128
    rm -f "$DIR/ugds-small.dat"
  fi
  if want streamfloor; then
    section "the stream machinery's own round trip"
    run "$NVCC" -O2 -o "$DIR/stream_floor" tests/gpu/stream_floor.cu -lcuda -lpthread &&
      T=120 run "$DIR/stream_floor" 3000
  fi
  if want overlap; then
    section "uGDS's own perf programs (ScaleX-IO/uGDS test/perf, unchanged) against a file"
    PD=$B/ugds-perf W=$DIR/ugds-perf
    if [ ! -d "$PD" ]; then
      echo "SKIP: $PD is missing (fetch the sources first)"
    else
      mkdir -p "$W"
      if run "$NVCC" -O2 -I"$P/include" -I"$PD" "$PD/bench_overlap.cu" -L"$P/lib" -lugds -lcudart \
        -Xlinker -rpath="$P/lib" -o "$W/bench_overlap"; then
        # It opens the file without O_CREAT: 16 MiB of it are written.
        head -c 64M /dev/zero >"$W/overlap.dat" && sync
        for i in 1 2 3; do T=120 run "$W/bench_overlap" "$W/overlap.dat" 0 1M 16; done
      fi
      if run "$NVCC" -O2 -I"$P/include" tests/gpu/overlap_probe.cu -L"$P/lib" -lugds -lcudart \
        -Xlinker -rpath="$P/lib" -o "$W/overlap_probe"; then
        T=300 run "$W/overlap_probe" "$W/probe.dat" 1024 200
        T=300 run "$W/overlap_probe" "$W/probe.dat" 4 500 200
      fi
      if run "$NVCC" -O2 -I"$P/include" -I"$PD" "$PD/cufile_bench.cu" -L"$P/lib" -lugds -lcudart -lpthread \
        -Xlinker -rpath="$P/lib" -o "$W/cufile_bench"; then
        head -c 1G /dev/zero >"$W/bench.dat" && sync
        for i in 1 2; do
          T=120 run "$W/cufile_bench" -f "$W/bench.dat" -l 1G -s 4K -m read
          T=120 run "$W/cufile_bench" -f "$W/bench.dat" -l 1G -s 4K -m async-read
        done
      fi
      rm -rf "$W"
    fi
  fi
  if want copypaths; then
    section "small reads into GPU memory: copy engine vs a kernel reading mapped host memory"
    W=$DIR/copypaths
    mkdir -p "$W"
    run "$NVCC" -O2 -o "$W/small_copy_paths" tests/gpu/small_copy_paths.cu -lcuda &&
      head -c 256M /dev/urandom >"$W/data.bin" && sync && T=300 run "$W/small_copy_paths" "$W/data.bin" 2000
    rm -rf "$W"
  fi
  rm -f "$DIR"/ugds-bench.dat "$DIR"/ugds-example.dat "$DIR"/rt-*.dat
  echo
  echo "run.sh done: STEPS=$STEPS $(date -u +%FT%TZ)"
} 2>&1 | tee "${OUT:-/tmp}/gpu-run.txt"
