#!/usr/bin/env bash
# Installs containerd-shim-wasmlet-v1 for a containerd that keeps the upstream
# kubelet: builds it (release), puts it next to containerd's own shims, and prints
# the containerd config and the RuntimeClass that route pods to it.
#
#   WASMLET_SHIM_PREFIX=DIR   where the binary goes (default /usr/local/bin, on the
#                             PATH of containerd's systemd unit)
#   WASMLET_PROFILE=release|dev
set -euo pipefail
cd "$(dirname "$0")/.."

prefix=${WASMLET_SHIM_PREFIX:-/usr/local/bin}
profile=${WASMLET_PROFILE:-release}
cargo build --profile "$profile" -p containerd-shim-wasmlet --bin containerd-shim-wasmlet-v1
built=target/$([ "$profile" = dev ] && echo debug || echo "$profile")/containerd-shim-wasmlet-v1
install -D -m 0755 "$built" "$prefix/containerd-shim-wasmlet-v1"
"$prefix/containerd-shim-wasmlet-v1" -v

cat <<SNIPPET

Installed $prefix/containerd-shim-wasmlet-v1.

1. containerd (/etc/containerd/config.toml, version 2), then restart containerd:

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.wasmlet]
  runtime_type = "io.containerd.wasmlet.v1"
  runtime_path = "$prefix/containerd-shim-wasmlet-v1"

2. The cluster:

apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata:
  name: wasmlet
handler: wasmlet

3. Pods with runtimeClassName: wasmlet run their images' .wasm entrypoint in the
   shim; 'ctr run --runtime io.containerd.wasmlet.v1 IMAGE ID' does the same.
SNIPPET
