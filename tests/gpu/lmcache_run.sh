#!/bin/bash
# LMCache 0.5.6 on the GPU machine with the ugds package: installs the wheels of the bundle
# directory this script lies in (made by tests/gpu/lmcache_bundle.sh: the ugds wheel, LMCache's
# wheel, and the pure-Python packages LMCache imports that the machine may lack; only the missing
# ones are installed, with pip --no-deps, nothing from a registry), then runs
#   test_ugds_kv.py             the store and connector tests (files, fallback path)
#   lmcache_native_plugin.py    LMCache's native-plugin adapter loading ugds.lmcache.UgdsConnector;
#                               throughput against LMCache's file-system L2 adapters
#   kv_recovery.py              reopening a store of 100 000 objects
#   kv_connector_bench.py       when the bundle holds installed builds py-NAME/ (lmcache_bundle.sh
#                               BUILDS="NAME=DIR ..."): the connector's throughput with each,
#                               alternating, twice (before/after comparisons in one run)
# Output: stdout and $OUT/lmcache-run.txt.
set -u
B=$(cd "$(dirname "$0")" && pwd)
DIR=${UGDS_TEST_DIR:-/tmp}
X=$DIR/lmc-py
run() {
  local t=${T:-300}
  echo
  echo "\$ $*"
  timeout -k 10 "$t" "$@" 2>&1
  local rc=$?
  echo "(exit $rc)"
  return $rc
}
{
  echo "lmcache_run.sh $(date -u +%FT%TZ)"
  [ -f "$B/BUILT_FROM" ] && cat "$B/BUILT_FROM"
  run nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  run python3 -c "import sys, torch, numpy; print(sys.version.split()[0], 'torch', torch.__version__, 'numpy', numpy.__version__)"
  run df -T "$DIR"
  rm -rf "$X" "$DIR/lmc-plugin"
  mkdir -p "$X"
  # Which of LMCache's imports the machine lacks: only those are installed.
  missing=()
  for w in "$B"/deps/*.whl; do
    dist=$(basename "$w" | cut -d- -f1)
    case $dist in
      py_cpuinfo) mod=cpuinfo ;; PyYAML | pyyaml) mod=yaml ;; attrs) mod=attr ;; *) mod=$dist ;;
    esac
    if python3 -c "import $mod" 2>/dev/null; then
      echo "present: $mod ($(python3 -c "import importlib.metadata as m; print(m.version('$dist'))" 2>/dev/null))"
    else
      echo "missing: $mod -> $(basename "$w")"
      missing+=("$w")
    fi
  done
  run python3 -m pip install -q --no-deps --no-index --no-compile --no-cache-dir --target "$X" \
    "$B"/ugds-*.whl "$B"/lmcache-*.whl "${missing[@]}"
  export PYTHONPATH=$X PYTHONUNBUFFERED=1
  run python3 -c "import lmcache, lmcache.lmcache_native, lmcache.lmcache_fs; print('lmcache', lmcache.__version__, 'native extensions load')"
  T=300 run python3 "$B/test_ugds_kv.py"
  T=${BENCH_T:-420} run python3 "$B/lmcache_native_plugin.py" "$DIR" "${ROUND_MIB:-256}" "${ROUNDS:-3}"
  T=180 run python3 "$B/kv_recovery.py" "$DIR" "${RECOVERY_N:-100000}"
  rm -rf "$DIR/lmc-plugin"
  builds=$(ls -d "$B"/py-* 2>/dev/null)
  for r in 1 2; do
    for d in $builds; do
      echo
      echo "--- connector throughput, build ${d##*/py-}, pass $r"
      T=200 run env PYTHONPATH="$d" python3 "$B/kv_connector_bench.py" "$DIR" "${ROUND_MIB:-256}" 3 0
    done
  done
  echo
  echo "lmcache_run.sh done $(date -u +%FT%TZ)"
} 2>&1 | tee "${OUT:-/tmp}/lmcache-run.txt"
