#!/bin/bash
# Several CUDA contexts and devices (run on the GPU machines from target/gpu, built here by
# `cargo xtask gpu-bundle`): the Rust tests `contexts::*` of cuda-tests, tests/gpu/devices.c
# through libugds and through the cuFile drop-in (every context in one process; with two or more
# GPUs also one process per GPU, all at once), `ugds placement --nearest`, and
# tests/gpu/py_devices.py through the Python package. OLD=DIR (optional) holds libugds.so and
# libcufile_ugds.so of an earlier build: the C program runs against those too, to show what they
# got wrong.
set -u
B=${BIN:-$PWD/target/gpu}
P=$B/prefix
DIR=${UGDS_TEST_DIR:-/tmp}
export UGDS_TEST_DIR=$DIR
S=${SRC:-$PWD/tests/gpu}
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
run() { echo; echo "\$ $*"; timeout -k 5 "${T:-300}" "$@" 2>&1; echo "(exit $?)"; }
nvidia-smi -L
N=$(nvidia-smi -L | grep -c '^GPU')
echo "GPUs: $N"
T=300 run "$B/cuda-tests" --ignored --test-threads=1 contexts::
# The calling thread's GPU against the controllers bound here (none on the GPU machines: an
# empty list, exit 0, shows the thread's GPU was found).
T=60 run "$B/ugds" placement --nearest --json
link() { # OUT LIBDIR FACE-FLAGS LIB
  "$NVCC" -O2 -I"$P/include" $3 "$S/devices.c" -o "$1" -L"$2" -l"$4" -lcuda -lpthread -Xlinker -rpath="$2" \
    || echo "BUILD FAILED: $1"
}
link "$DIR/dev-ugds" "$P/lib" "" ugds
link "$DIR/dev-cufile" "$P/lib" -DFACE_CUFILE cufile_ugds
for f in ugds cufile; do
  T=120 run "$DIR/dev-$f" "$DIR/dev-$f.dat"
done
if [ "$N" -ge 2 ]; then
  for f in ugds cufile; do
    echo; echo "\$ one process per GPU ($f): dev-$f FILE --only D, D = 0..$((N - 1)), at once"
    for d in $(seq 0 $((N - 1))); do
      (timeout 120 "$DIR/dev-$f" "$DIR/dev-$f-$d.dat" --only "$d" >"$DIR/dev-$f-$d.out" 2>&1; echo "(exit $?)" >>"$DIR/dev-$f-$d.out") &
    done
    wait
    for d in $(seq 0 $((N - 1))); do echo "--- device $d"; cat "$DIR/dev-$f-$d.out"; done
  done
fi
if [ -n "${OLD:-}" ] && [ -d "$OLD" ]; then
  O=$DIR/old-lib
  rm -rf "$O"; mkdir -p "$O"
  cp "$OLD"/libugds.so "$OLD"/libcufile_ugds.so "$O"/
  ln -sf libugds.so "$O/libugds.so.0"; ln -sf libcufile_ugds.so "$O/libcufile_ugds.so.0"
  link "$DIR/dev-ugds-old" "$O" "" ugds
  link "$DIR/dev-cufile-old" "$O" -DFACE_CUFILE cufile_ugds
  for f in ugds cufile; do
    echo; echo "(the earlier build: $OLD)"
    T=120 run "$DIR/dev-$f-old" "$DIR/dev-$f-old.dat"
  done
fi
X=$DIR/pyugds-dev
rm -rf "$X"
if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$X" "$B"/ugds-wheel/ugds-*.whl; then
  T=200 run env PYTHONPATH="$X" PYTHONUNBUFFERED=1 python3 "$S/py_devices.py" "$DIR"
fi
rm -f "$DIR"/dev-*.dat
