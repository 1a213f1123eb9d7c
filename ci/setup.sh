#!/usr/bin/env bash
# Installs what building and testing ugds needs on a fresh Debian bookworm machine:
# the Debian packages in ci/packages.txt, bindgen-cli (the version KERNEL_NOTES.md verified), and
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
if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "setup: installing the nightly toolchain (for cargo-fuzz)"
  rustup toolchain install nightly --profile minimal
fi
if ! cargo +nightly fuzz --version 2>/dev/null | grep -q '0\.13\.'; then
  echo "setup: installing cargo-fuzz 0.13.2"
  cargo install --locked cargo-fuzz@0.13.2
fi
