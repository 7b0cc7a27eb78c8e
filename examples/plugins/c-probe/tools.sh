#!/usr/bin/env bash
# Installs what build.sh needs, once: run it as often as you like.
#
# - Debian 12 (bookworm) packages: clang-19 (with lld-19), wasi-libc (the C
#   library for wasm32-wasi) and libclang-rt-19-dev-wasm32 (compiler-rt's
#   builtins for wasm32);
# - wit-bindgen-cli, pinned, with only its C generator, from crates.io
#   (about 4 minutes to build on 2 cores).
set -euo pipefail

WIT_BINDGEN_VERSION=0.63.0
packages=(clang-19 lld-19 wasi-libc libclang-rt-19-dev-wasm32)

missing=()
for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done
if ((${#missing[@]})); then
    sudo=()
    if ((EUID != 0)); then sudo=(sudo); fi
    "${sudo[@]}" apt-get update
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y "${missing[@]}"
fi

if [[ $(wit-bindgen --version 2>/dev/null || true) != "wit-bindgen-cli $WIT_BINDGEN_VERSION" ]]; then
    cargo install --locked wit-bindgen-cli --version "$WIT_BINDGEN_VERSION" \
        --no-default-features --features c
fi

clang-19 --version | head -n 1
wit-bindgen --version
