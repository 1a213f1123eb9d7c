#!/bin/bash
# Makes the bundle tests/gpu/lmcache_run.sh runs on the GPU machine: DEST (default
# target/gpu-lmc) gets the ugds wheel (`cargo xtask wheel` first), LMCache 0.5.6's cp312 wheel
# and the wheels of the packages LMCache's L2-adapter code imports (pip download, for CPython
# 3.12 on manylinux x86_64; cached in target/lmc-wheels), and the scripts. BUILDS="NAME=DIR ..."
# adds installed ugds builds (pip install --target DIR of an earlier wheel) as py-NAME/, which
# lmcache_run.sh compares with kv_connector_bench.py.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DEST=${1:-$ROOT/target/gpu-lmc}
W=$ROOT/target/lmc-wheels
PLAT=(--only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux_2_34_x86_64)
mkdir -p "$W/deps"
ls "$W"/lmcache-0.5.6-*.whl >/dev/null 2>&1 || pip download -q lmcache==0.5.6 --no-deps "${PLAT[@]}" -d "$W"
# What lmcache.v1.distributed.l2_adapters (native_plugin, fs_native, fs) and
# lmcache.v1.memory_management import at module level, outside torch/numpy.
ls "$W"/deps/aiofiles-*.whl >/dev/null 2>&1 || pip download -q aiofiles aiohttp cachetools py-cpuinfo cryptography \
  nvtx prometheus_client psutil requests sortedcontainers pyyaml "${PLAT[@]}" -d "$W/deps"
rm -rf "$DEST"
mkdir -p "$DEST/deps"
cp "$ROOT"/target/wheels/ugds-*.whl "$W"/lmcache-0.5.6-*.whl "$DEST/"
cp "$W"/deps/*.whl "$DEST/deps/"
cp "$ROOT"/tests/gpu/lmcache_run.sh "$DEST/run.sh"
cp "$ROOT"/tests/gpu/lmcache_native_plugin.py "$ROOT"/tests/gpu/kv_recovery.py "$ROOT"/tests/python/test_ugds_kv.py \
  "$ROOT"/tests/python/ugds_test_runner.py "$ROOT"/tests/gpu/kv_connector_bench.py "$DEST/"
for b in ${BUILDS:-}; do
  cp -r "${b#*=}" "$DEST/py-${b%%=*}"
done
echo "built from $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet || echo ' (with uncommitted changes)')" \
  >"$DEST/BUILT_FROM"
du -sh "$DEST"
