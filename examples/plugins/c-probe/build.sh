#!/usr/bin/env bash
# Builds the C probe plugin into a component: target/c-probe.component.wasm.
#
#   ./build.sh                      # from examples/plugins/c-probe
#   REPO=/path/to/wasmlet ./build.sh   # from a copy of this directory elsewhere
#
# Needs the tools of tools.sh (clang-19, wasi-libc, compiler-rt for wasm32,
# wit-bindgen-cli) and, to componentize, `wasmlet plugin componentize`.
#
# Environment:
#   REPO         the wasmlet repository, for plugins/wit [this directory's ../../..]
#   OUT          where everything is written [target]
#   CC           the compiler [clang-19]
#   WASMLET      the wasmlet binary [wasmlet]
#   COMPONENTIZE a command run as `$COMPONENTIZE CORE.wasm -o OUT.component.wasm`
#                instead of `$WASMLET plugin componentize` (split on spaces)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=${REPO:-$(cd "$here/../../.." && pwd)}
WIT=$REPO/plugins/wit
OUT=${OUT:-target}
CC=${CC:-clang-19}
WORLD=probe-plugin
NAME=c-probe

if [[ ! -f $WIT/plugin.wit ]]; then
    echo "build.sh: no $WIT/plugin.wit: set REPO to the wasmlet repository" >&2
    exit 1
fi

# Turns a core module into a component, with the WASI preview 1 reactor adapter
# of the node's wasmtime. The hook: COMPONENTIZE, same arguments.
componentize() { # CORE OUT
    if [[ -n ${COMPONENTIZE:-} ]]; then
        local -a cmd
        read -r -a cmd <<<"$COMPONENTIZE"
        "${cmd[@]}" "$1" -o "$2"
    else
        "${WASMLET:-wasmlet}" plugin componentize "$1" -o "$2"
    fi
}

# (a) Bindings for the world: probe_plugin.{h,c} and probe_plugin_component_type.o,
# the object that carries the world into the module's `component-type` section.
rm -rf "$OUT/gen"
mkdir -p "$OUT/gen"
wit-bindgen c "$WIT" --world "$WORLD" --out-dir "$OUT/gen"

# (b) A wasm32 reactor module. Debian lays wasi-libc out for the triple
# `wasm32-wasi` (/usr/include/wasm32-wasi, /usr/lib/wasm32-wasi), and clang-19
# finds it and compiler-rt (lib/wasi/libclang_rt.builtins-wasm32.a) under
# --sysroot=/usr for that triple; -nostdlibinc keeps the host's /usr/include out.
# At the link, -mexec-model=reactor (a link option: clang-19 refuses it with -c)
# links crt1-reactor.o: its `_initialize` runs the C constructors, and the
# component runs `_initialize` once per instance. (crt1-command.o wants a `main`;
# with no crt at all, wasm-ld makes every export, cabi_realloc included, run the
# constructors and destructors around each call.)
# Every export (the world's function, cabi_realloc, cabi_post_*) is named in the
# bindings with export_name, so nothing else needs exporting.
cflags=(
    --target=wasm32-wasi --sysroot=/usr
    -nostdlibinc -isystem /usr/include/wasm32-wasi
    -O2 -std=c11 -Wall -Wextra -Werror
    -I "$OUT/gen"
)
"$CC" "${cflags[@]}" -c "$OUT/gen/probe_plugin.c" -o "$OUT/probe_plugin.o"
"$CC" "${cflags[@]}" -c "$here/probe.c" -o "$OUT/probe.o"
"$CC" "${cflags[@]}" -mexec-model=reactor -Wl,--strip-debug \
    "$OUT/probe.o" "$OUT/probe_plugin.o" "$OUT/gen/probe_plugin_component_type.o" \
    -o "$OUT/$NAME.core.wasm"

# (c) The component.
componentize "$OUT/$NAME.core.wasm" "$OUT/$NAME.component.wasm"
echo "$OUT/$NAME.component.wasm"
