#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs what it needs, checks formatting and
# lints, builds the Wasm guests, runs every test, then runs the README's node for a
# few seconds. Needs root (apt, and the node writes under /tmp).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh

# Disk: a CI machine may be small. Incremental state (several GiB for this tree) only
# helps a warm machine, and clippy's check artifacts are not reused by the test build,
# so under CI they live in a directory of their own that goes once clippy has passed.
clippy_target=target
if [ -n "${CI:-}" ]; then
  export CARGO_INCREMENTAL=0
  clippy_target=target/clippy
fi
disk() { echo "disk: target $(du -sm target 2>/dev/null | cut -f1) MiB, $(df -m --output=avail . | tail -1 | tr -d ' ') MiB free"; }

echo "--- fmt"
cargo fmt --all -- --check
echo "--- clippy"
CARGO_TARGET_DIR=$clippy_target cargo clippy --workspace --all-targets --locked -- -D warnings
disk
if [ "$clippy_target" != target ]; then rm -rf "$clippy_target"; fi
echo "--- fuzz targets, ${WASMLET_FUZZ_SECONDS:-60} s each"
# An instrumented build of its own (target/fuzz); under CI it goes once the targets
# ran, before the test build needs the disk.
cargo xtask fuzz --seconds "${WASMLET_FUZZ_SECONDS:-60}"
disk
if [ -n "${CI:-}" ]; then rm -rf target/fuzz; fi
echo "--- guest images"
# The guests build with a cargo home of their own under target/ (empty in a clean
# clone), so every crate they compile, std's own included, is downloaded here.
guest_home=${WASMLET_GUEST_CARGO_HOME:-target/guest-cargo-home}
cached=0
if [ -d "$guest_home/registry/cache" ]; then
  cached=$(find "$guest_home/registry/cache" -name '*.crate' | wc -l)
fi
echo "guest cargo home $guest_home: $cached crates cached before the build"
cargo xtask images >/dev/null
disk
echo "--- tests"
cargo test --workspace --locked 2>&1 | tee target/test.log
disk
echo "--- soak, ${WASMLET_SOAK_MINUTES:-2} min"
# Pods of both kinds churned on the node the e2e tests ran; fails on any leftover or
# on RSS growth past 10 % (docs/status.md has a long run's figures).
cargo xtask soak --minutes "${WASMLET_SOAK_MINUTES:-2}" --debug --binary target/debug/wasmlet --wasm 20 --boxes 4
echo "--- the plugin author guides, run as written"
scripts/plugin-guides.sh
echo "--- the README's standalone node, 15 s"
cgroup_root="/wasmlet-ci-run-$$"
# The binary the e2e tests just ran (a build of the node alone unifies features
# differently and would compile most of the tree again).
demo_dir="$(mktemp -d /tmp/wasmlet-ci-run.XXXX)"
WASMLET_BIN=target/debug/wasmlet WASMLET_RUN_SECONDS=15 WASMLET_DEMO_DIR="$demo_dir" \
  WASMLET_PORT=18255 WASMLET_CGROUP_ROOT="$cgroup_root" scripts/run.sh | tee target/run.log
# Its state directory goes too (the node has stopped; nothing is mounted there).
if ! grep -q " $demo_dir" /proc/self/mountinfo; then rm -rf "$demo_dir"; fi
# The node removed its pods' cgroups when it stopped; the empty hierarchy goes too.
for hierarchy in /sys/fs/cgroup/*/; do
  if [ -d "$hierarchy${cgroup_root#/}" ]; then
    find "$hierarchy${cgroup_root#/}" -depth -type d -exec rmdir {} + 2>/dev/null || true
  fi
done
grep -q "ticker-.*Running" target/run.log || { echo "the standalone node did not show the ticker pod Running" >&2; exit 1; }

passed=$(grep -Eo '^test result: ok\. [0-9]+ passed' target/test.log | awk '{s+=$4} END {print s+0}')
failed=$(grep -Eo '[0-9]+ failed' target/test.log | awk '{s+=$1} END {print s+0}')
echo "${passed} passed, ${failed} failed"
