#!/usr/bin/env bash
# Installs what building and testing ugds needs on a fresh Debian bookworm machine:
# the Debian packages in ci/packages.txt, bindgen-cli 0.73.0 (the version the
# module's bindings were generated and checked with; docs/testing.md names it), and
# for `cargo xtask fuzz` a nightly toolchain (minimal profile) and cargo-fuzz.
# Idempotent and quiet when everything is present.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
mapfile -t pkgs < <(grep -Ev '^\s*(#|$)' "$here/packages.txt")
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
export PATH="$HOME/.cargo/bin:$PATH"
if ! bindgen --version 2>/dev/null | grep -q '0\.73\.0'; then
  echo "setup: installing bindgen-cli 0.73.0"
  cargo install --locked bindgen-cli@0.73.0
fi
# QEMU >= 9 for the VM variants that set CAP.MQES (the nvme device's `mqes` property; bookworm's
# QEMU 7.2 has none): bookworm-backports' build, downloaded with a private apt configuration (the
# system's sources, lists and installed packages stay as they are) and extracted into the cache;
# `cargo xtask vm` runs it only for controllers with `mqes=`. Keyed by the package version.
qemu_bpo_version='1:10.0.2+ds-2+deb13u1~bpo12+1'
cache="${UGDS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ugds}"
qemu_dir="$cache/qemu-${qemu_bpo_version#*:}"
if [[ ! -e "$qemu_dir/ready" ]]; then
  echo "setup: fetching qemu-system-x86 $qemu_bpo_version (bookworm-backports) into $qemu_dir"
  apt_dir="$(mktemp -d)"
  trap 'rm -rf "$apt_dir"' EXIT
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial" "$apt_dir/debs"
  echo 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm-backports main' \
    >"$apt_dir/sources.list"
  apt_opts=(-q -o "Dir::Etc::sourcelist=$apt_dir/sources.list" -o Dir::Etc::sourceparts=-
    -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache::archives=$apt_dir/archives"
    -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache= -o Dir::State::status=/dev/null
    -o APT::Sandbox::User=root)
  apt-get "${apt_opts[@]}" update >/dev/null
  (cd "$apt_dir/debs" && apt-get "${apt_opts[@]}" download >/dev/null \
    "qemu-system-x86=$qemu_bpo_version" "qemu-system-common=$qemu_bpo_version" \
    "qemu-system-data=$qemu_bpo_version" seabios/bookworm-backports)
  rm -rf "$qemu_dir" && mkdir -p "$qemu_dir"
  for deb in "$apt_dir"/debs/*.deb; do dpkg-deb -x "$deb" "$qemu_dir"; done
  # The firmware (-L) and modules of this build, never the system QEMU's.
  qemu=("$qemu_dir/usr/bin/qemu-system-x86_64" -L "$qemu_dir/usr/share/qemu" -L "$qemu_dir/usr/share/seabios")
  if ldd "$qemu_dir/usr/bin/qemu-system-x86_64" | grep 'not found'; then
    echo "setup: $qemu_dir/usr/bin/qemu-system-x86_64 needs libraries bookworm lacks" >&2; exit 1
  fi
  QEMU_MODULE_DIR="$qemu_dir/usr/lib/x86_64-linux-gnu/qemu" "${qemu[@]}" --version | grep -q "version 10\."
  QEMU_MODULE_DIR="$qemu_dir/usr/lib/x86_64-linux-gnu/qemu" "${qemu[@]}" -device nvme,help | grep -q 'mqes='
  touch "$qemu_dir/ready"
  rm -rf "$apt_dir"
  trap - EXIT
fi
if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "setup: installing the nightly toolchain (for cargo-fuzz)"
  rustup toolchain install nightly --profile minimal
fi
if ! cargo +nightly fuzz --version 2>/dev/null | grep -q '0\.13\.'; then
  echo "setup: installing cargo-fuzz 0.13.2"
  cargo install --locked cargo-fuzz@0.13.2
fi
