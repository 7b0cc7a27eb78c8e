#!/usr/bin/env bash
# Builds js-probe.component.wasm from probe.js: jco componentize (componentize-js;
# both pinned in package-lock.json) against the repository's WIT, world
# `probe-plugin`, with every WASI feature of the JS runtime disabled, so the
# component imports nothing but wasmlet:plugin. See plugins/guides/javascript.md.
#
# REPO: the repository's root, for plugins/wit [default: three levels up].
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="${REPO:-$(cd "$here/../../.." && pwd)}"
wit="$repo/plugins/wit"
out=js-probe.component.wasm
cd "$here"

[[ -f "$wit/plugin.wit" ]] || { echo "build.sh: no $wit/plugin.wit (set REPO to the repository's root)" >&2; exit 1; }

# The tools' dependencies (rolldown, oxc) need node ^20.19 or >= 22.12.
node -e '
  const [maj, min] = process.versions.node.split(".").map(Number);
  if (maj < 20 || (maj === 20 && min < 19) || maj === 21 || (maj === 22 && min < 12)) {
    console.error(`build.sh: node ${process.versions.node} is too old: 20.19 or 22.12 and later`);
    process.exit(1);
  }'

# npm ci only when node_modules is missing or older than the lock: npm writes
# node_modules/.package-lock.json at each install.
installed=node_modules/.package-lock.json
if [[ ! -f $installed || package-lock.json -nt $installed || package.json -nt $installed ]]; then
  npm ci --no-audit --no-fund
fi

# `--disable all`: none of the JS runtime's WASI features, so no console (stdio),
# no Math.random/crypto entropy (random), no timers (clocks), no fetch (http,
# fetch-event). The plugin logs through host.log and reaches the pod through
# pod-network; the component imports only wasmlet:plugin.
start=$(date +%s%N)
node_modules/.bin/jco componentize probe.js \
  --wit "$wit" --world-name probe-plugin \
  --disable all \
  -o "$out"
took=$(( ($(date +%s%N) - start) / 1000000 ))

# Refuse a component that picked up a WASI import after all.
world="$(node_modules/.bin/jco wit "$out")"
if grep -q 'import wasi:' <<<"$world"; then
  echo "build.sh: $out imports WASI:" >&2
  echo "$world" >&2
  exit 1
fi
echo "$out: $(stat -c %s "$out") bytes in ${took} ms"
echo "$world"
