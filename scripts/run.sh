#!/usr/bin/env bash
# Builds wasmlet and the example Wasm images, then runs a standalone node (no API
# server) on examples/manifests, printing its pods and their latest log lines.
#
#   WASMLET_PROFILE=release|dev   cargo profile to build (default release)
#   WASMLET_RUN_SECONDS=N         stop after N seconds (default: run until Ctrl-C)
#   WASMLET_DEMO_DIR=DIR          state, logs and the node's own log (default /tmp/wasmlet-demo)
#   WASMLET_PORT=PORT             read-only port on 127.0.0.1 (default 10255)
#   WASMLET_CGROUP_ROOT=PATH      the node's cgroupRoot (default: the kubelet's, /)
#   WASMLET_BIN=PATH              run this wasmlet binary instead of building one (the
#                                 test script passes the one its tests just built)
set -euo pipefail
cd "$(dirname "$0")/.."

profile=${WASMLET_PROFILE:-release}
demo=${WASMLET_DEMO_DIR:-/tmp/wasmlet-demo}
port=${WASMLET_PORT:-10255}
healthz_port=$((port + 1))

scripts/install-deps.sh
if [ -n "${WASMLET_BIN:-}" ]; then
  wasmlet=$WASMLET_BIN
else
  cargo build --profile "$profile" -p wasmlet-node --bin wasmlet
  wasmlet=target/$([ "$profile" = dev ] && echo debug || echo "$profile")/wasmlet
fi
cargo xtask images >/dev/null

rm -rf "$demo"
mkdir -p "$demo/root/images" "$demo/pods"
cp target/images/*.tar "$demo/root/images/"   # imported by the node at start

"$wasmlet" \
  --root-dir "$demo/root" \
  --pod-logs-dir "$demo/pods" \
  --pod-manifest-path examples/manifests \
  --hostname-override "$(hostname | tr '[:upper:]' '[:lower:]')" \
  --address 127.0.0.1 --read-only-port "$port" \
  --healthz-port "$healthz_port" \
  ${WASMLET_CGROUP_ROOT:+--cgroup-root "$WASMLET_CGROUP_ROOT"} \
  2>"$demo/wasmlet.log" &
node=$!
trap 'kill -TERM $node 2>/dev/null; wait $node 2>/dev/null; echo "node stopped; its log: $demo/wasmlet.log"' EXIT

echo "wasmlet (pid $node) is running on examples/manifests; read-only API at http://127.0.0.1:$port/pods"
started=$SECONDS
until "$wasmlet" get pods --server "127.0.0.1:$port" >/dev/null 2>&1; do
  kill -0 $node 2>/dev/null || { cat "$demo/wasmlet.log" >&2; exit 1; }
  sleep 0.2
done
while :; do
  sleep 3
  kill -0 $node 2>/dev/null || { echo "the node exited" >&2; tail -20 "$demo/wasmlet.log" >&2; exit 1; }
  echo
  echo "=== $(date +%T)"
  "$wasmlet" get pods --server "127.0.0.1:$port"
  for dir in "$demo"/pods/*/*/; do
    # A container's logs go with it when container GC removes it: an empty directory
    # is skipped, not an error.
    log=$(ls -t "$dir"*.log 2>/dev/null | head -n 1 || true)
    [ -n "$log" ] || continue
    pod=$(basename "$(dirname "$dir")" | cut -d_ -f2)
    tail -n 2 "$log" | sed "s|^|  $pod/$(basename "$dir") #$(basename "$log" .log): |"
  done
  if [ -n "${WASMLET_RUN_SECONDS:-}" ] && (( SECONDS - started >= WASMLET_RUN_SECONDS )); then
    break
  fi
done
