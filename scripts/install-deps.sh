#!/usr/bin/env bash
# Installs the Debian packages wasmlet's build, run and tests use. Idempotent; needs root.
#
#   rustc-web cargo-web rust-web-src  Debian's Rust with std sources: builds Wasm guests
#                                     (wasm32-wasip1 via -Zbuild-std; rustup has no wasm
#                                     targets on these machines)
#   lld-19 wasi-libc                  wasm-ld and the WASI C library the guests link with
#   containerd runc                   the real CRI runtime tests run a private instance of
#   containernetworking-plugins       CNI plugins (bridge, host-local, loopback) in /usr/lib/cni
#   busybox-static                    /bin/busybox, the test container images' only binary
#   e2fsprogs mount                   mkfs.ext4 and loop mounts: the disk-pressure tests'
#                                     small filesystems
#   dbus-daemon                       a private system bus the graceful-shutdown tests
#                                     serve a stand-in logind on
#   docker-registry apache2-utils     the loopback OCI registry image pulls are tested
#                                     against, and htpasswd for its basic auth
#   clang-19 libclang-rt-19-dev-wasm32  the C plugin example and its guide (wasm32-wasi
#                                     with wasi-libc and compiler-rt's builtins)
# and, from crates.io, wit-bindgen-cli (its C generator only): the C plugin's bindings;
# cargo-fuzz: the fuzz targets (`cargo xtask fuzz`, libFuzzer).
set -euo pipefail

packages=(rustc-web cargo-web rust-web-src lld-19 wasi-libc
          containerd runc containernetworking-plugins busybox-static e2fsprogs mount
          dbus-daemon docker-registry apache2-utils clang-19 libclang-rt-19-dev-wasm32)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null; then
  echo "cargo (rustup's) is required on PATH" >&2
  exit 1
fi

# Built once per machine (about 4 minutes on 2 cores), kept in cargo's bin directory.
wit_bindgen_version=0.63.0
if [[ $(wit-bindgen --version 2>/dev/null || true) != "wit-bindgen-cli $wit_bindgen_version" ]]; then
  echo "installing wit-bindgen-cli $wit_bindgen_version (C generator)" >&2
  cargo install --quiet --locked wit-bindgen-cli --version "$wit_bindgen_version" \
    --no-default-features --features c
fi

# Built once per machine (about 2 minutes on 2 cores).
cargo_fuzz_version=0.13.2
if [[ $(cargo fuzz --version 2>/dev/null || true) != "cargo-fuzz $cargo_fuzz_version" ]]; then
  echo "installing cargo-fuzz $cargo_fuzz_version" >&2
  cargo install --quiet --locked cargo-fuzz --version "$cargo_fuzz_version"
fi

# The JavaScript plugin example and its guide: jco/componentize-js from npm need
# Node.js 20.19+ (22.12+ on 22) with npm; Debian 12's nodejs (18) is too old, so it
# comes with the machine and is checked, not installed.
if ! node -e 'const [a,b]=process.versions.node.split(".").map(Number); process.exit((a===20&&b>=19)||(a===22&&b>=12)||a>22?0:1)' 2>/dev/null \
   || ! command -v npm >/dev/null; then
  echo "Node.js 20.19+ with npm is required on PATH for the JavaScript plugin example" >&2
  exit 1
fi

# The node API's logs tests drive the real kubectl (v1.32) through the test API
# server. It comes with the machine (its apt source is not reachable from here), so it
# is checked, not installed.
if ! command -v kubectl >/dev/null; then
  echo "kubectl (v1.32) is required on PATH for the node API tests; it cannot be installed from the registries this machine reaches" >&2
  exit 1
fi
