#!/usr/bin/env bash
# Runs the plugin author guides' commands as written: every ```sh block of
# plugins/guides/<lang>.md, in order, in one bash (set -euo pipefail), in a scratch
# copy of the guide's example directory with REPO set to this repository.
#
#   scripts/plugin-guides.sh            # every guide
#   scripts/plugin-guides.sh c          # plugins/guides/c.md only
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

declare -A example=([c]=c-probe [javascript]=js-probe)
guides=("$@")
if ((${#guides[@]} == 0)); then
  for g in "$repo"/plugins/guides/*.md; do guides+=("$(basename "$g" .md)"); done
fi

for guide in "${guides[@]}"; do
  md=$repo/plugins/guides/$guide.md
  dir=${example[$guide]:-}
  [[ -f $md && -n $dir ]] || { echo "plugin-guides: no guide or example for $guide" >&2; exit 2; }
  scratch=$(mktemp -d "/tmp/wasmlet-guide-$guide.XXXX")
  # The example's sources, not what an earlier build left.
  tar -C "$repo/examples/plugins/$dir" --exclude=./target --exclude=./node_modules -cf - . | tar -C "$scratch" -xf -
  awk '/^```sh$/ {inside=1; next} /^```/ {inside=0} inside' "$md" > "$scratch/.guide.sh"
  echo "--- plugins/guides/$guide.md: $(grep -c '' "$scratch/.guide.sh") lines of commands in $scratch"
  started=$(date +%s)
  (cd "$scratch" && REPO=$repo bash -euo pipefail .guide.sh)
  echo "--- plugins/guides/$guide.md: ran as written in $(( $(date +%s) - started )) s"
  rm -rf "$scratch"
done
