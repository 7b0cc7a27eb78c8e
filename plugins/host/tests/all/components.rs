//! Tiny plugin components for the tests: WAT core modules that implement the
//! canonical ABI by hand, wrapped into components with `wit-component`.

use wit_component::{ComponentEncoder, StringEncoding};
use wit_parser::{LiftLowerAbi, ManglingAndAbi, Resolve};

/// A bump allocator for the canonical ABI, starting at 4096.
const ALLOC: &str = r#"
  (global $heap (mut i32) (i32.const 4096))
  (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32)
    (local $p i32)
    (local.set $p
      (i32.and
        (i32.add (global.get $heap) (i32.sub (local.get 2) (i32.const 1)))
        (i32.xor (i32.sub (local.get 2) (i32.const 1)) (i32.const -1))))
    (global.set $heap (i32.add (local.get $p) (local.get 3)))
    (if (i32.gt_u (global.get $heap) (i32.mul (memory.size) (i32.const 65536)))
      (then (drop (memory.grow (i32.const 16)))))
    (local.get $p))
"#;

fn resolve(wit: &str) -> (Resolve, wit_parser::PackageId) {
    let mut resolve = Resolve::default();
    let pkg = resolve.push_str("plugin.wit", wit).unwrap();
    (resolve, pkg)
}

/// Wraps a core module (WAT, given its body without `(module` and the allocator)
/// into a component for `world`.
pub fn component(world: &str, body: &str) -> Vec<u8> {
    component_for(wasmlet_plugin_host::WIT, world, body)
}

/// Same, against another version of the ABI's text.
pub fn component_for(wit: &str, world: &str, body: &str) -> Vec<u8> {
    let (resolve, pkg) = resolve(wit);
    let world = resolve.select_world(&[pkg], Some(world)).unwrap();
    // Imports (in `body`) come before any definition.
    let wat = format!("(module {body} (memory (export \"memory\") 1) {ALLOC})");
    let mut module = wat::parse_str(&wat).unwrap_or_else(|e| panic!("{e}\n{wat}"));
    wit_component::embed_component_metadata(&mut module, &resolve, world, StringEncoding::UTF8)
        .unwrap();
    ComponentEncoder::default()
        .module(&module)
        .unwrap()
        .validate(true)
        .encode()
        .unwrap()
}

/// A component whose every export traps (`unreachable`).
pub fn trapping(world: &str) -> Vec<u8> {
    let (resolve, pkg) = resolve(wasmlet_plugin_host::WIT);
    let world = resolve.select_world(&[pkg], Some(world)).unwrap();
    let mut module =
        wit_component::dummy_module(&resolve, world, ManglingAndAbi::Legacy(LiftLowerAbi::Sync));
    wit_component::embed_component_metadata(&mut module, &resolve, world, StringEncoding::UTF8)
        .unwrap();
    ComponentEncoder::default()
        .module(&module)
        .unwrap()
        .validate(true)
        .encode()
        .unwrap()
}

const RANK: &str = "wasmlet:plugin/eviction@0.1.0#rank";

/// An eviction plugin whose `rank` returns `indexes`.
pub fn ranking(indexes: &[u32]) -> Vec<u8> {
    let mut stores = String::new();
    for (i, idx) in indexes.iter().enumerate() {
        stores.push_str(&format!(
            "(i32.store (i32.const {}) (i32.const {idx}))\n",
            64 + 4 * i
        ));
    }
    component(
        "eviction-plugin",
        &format!(
            r#"(func (export "{RANK}") (param i32 i32 i32 i32) (result i32)
                 {stores}
                 (i32.store (i32.const 16) (i32.const 64))
                 (i32.store (i32.const 20) (i32.const {len}))
                 (i32.const 16))"#,
            len = indexes.len()
        ),
    )
}

/// An eviction plugin whose `rank` returns a list of `len` zeros (4 bytes each).
pub fn huge_ranking(len: u32) -> Vec<u8> {
    component(
        "eviction-plugin",
        &format!(
            r#"(func (export "{RANK}") (param i32 i32 i32 i32) (result i32)
                 (drop (memory.grow (i32.const {pages})))
                 (i32.store (i32.const 16) (i32.const 65536))
                 (i32.store (i32.const 20) (i32.const {len}))
                 (i32.const 16))"#,
            pages = len * 4 / 65536 + 2
        ),
    )
}

/// An eviction plugin whose `rank` returns `[n]`, `n` twice the calls its instance
/// had before this one: it counts them both in a global and in linear memory.
pub fn counting() -> Vec<u8> {
    component(
        "eviction-plugin",
        &format!(
            r#"(global $calls (mut i32) (i32.const 0))
               (func (export "{RANK}") (param i32 i32 i32 i32) (result i32)
                 (i32.store (i32.const 64)
                   (i32.add (global.get $calls) (i32.load (i32.const 1024))))
                 (global.set $calls (i32.add (global.get $calls) (i32.const 1)))
                 (i32.store (i32.const 1024) (i32.add (i32.load (i32.const 1024)) (i32.const 1)))
                 (i32.store (i32.const 16) (i32.const 64))
                 (i32.store (i32.const 20) (i32.const 1))
                 (i32.const 16))"#
        ),
    )
}

/// An eviction plugin whose `rank` never returns.
pub fn looping() -> Vec<u8> {
    component(
        "eviction-plugin",
        &format!(
            r#"(func (export "{RANK}") (param i32 i32 i32 i32) (result i32)
                 (loop $l (br $l))
                 (i32.const 0))"#
        ),
    )
}

/// An eviction plugin whose `rank` grows its memory until it cannot, then traps.
pub fn memory_bomb() -> Vec<u8> {
    component(
        "eviction-plugin",
        &format!(
            r#"(func (export "{RANK}") (param i32 i32 i32 i32) (result i32)
                 (loop $l
                   (br_if $l (i32.ne (memory.grow (i32.const 16)) (i32.const -1))))
                 unreachable)"#
        ),
    )
}

/// An admission plugin that denies every pod, with the first setting's value as
/// the reason and its key as the message, after logging `log_lines` lines.
pub fn denying(log_lines: u32) -> Vec<u8> {
    component(
        "admission-plugin",
        &format!(
            r#"(import "wasmlet:plugin/host@0.1.0" "settings" (func $settings (param i32)))
               (import "wasmlet:plugin/host@0.1.0" "log" (func $log (param i32 i32 i32)))
               (data (i32.const 200) "hello from the plugin")
               (func (export "wasmlet:plugin/admission@0.1.0#admit") (param i32) (result i32)
                 (local $i i32)
                 (local $pairs i32)
                 (block $done
                   (loop $l
                     (br_if $done (i32.ge_u (local.get $i) (i32.const {log_lines})))
                     (call $log (i32.const 2) (i32.const 200) (i32.const 21))
                     (local.set $i (i32.add (local.get $i) (i32.const 1)))
                     (br $l)))
                 (call $settings (i32.const 64))
                 (local.set $pairs (i32.load (i32.const 64)))
                 (i32.store8 (i32.const 128) (i32.const 1))
                 (i32.store (i32.const 132) (i32.load offset=8 (local.get $pairs)))
                 (i32.store (i32.const 136) (i32.load offset=12 (local.get $pairs)))
                 (i32.store (i32.const 140) (i32.load offset=0 (local.get $pairs)))
                 (i32.store (i32.const 144) (i32.load offset=4 (local.get $pairs)))
                 (i32.const 128))"#
        ),
    )
}

/// A probe plugin that `tcp-connect`s to the request's `container` (as an IP) on
/// port `pod.priority`, and passes if it connects; else fails with the error.
pub fn connecting_probe() -> Vec<u8> {
    component(
        "probe-plugin",
        r#"(import "wasmlet:plugin/pod-network@0.1.0" "tcp-connect"
             (func $connect (param i32 i32 i32 i32)))
           (func (export "wasmlet:plugin/probe@0.1.0#check") (param $req i32) (result i32)
             (call $connect
               (i32.load offset=68 (local.get $req))
               (i32.load offset=72 (local.get $req))
               (i32.load offset=48 (local.get $req))
               (i32.const 200))
             (if (i32.eqz (i32.load8_u (i32.const 200)))
               (then
                 (i32.store8 (i32.const 300) (i32.const 0))
                 (return (i32.const 300))))
             (i32.store8 (i32.const 300) (i32.const 1))
             (i32.store (i32.const 304) (i32.load (i32.const 204)))
             (i32.store (i32.const 308) (i32.load (i32.const 208)))
             (i32.const 300))"#,
    )
}

/// A probe plugin that loops forever.
pub fn looping_probe() -> Vec<u8> {
    component(
        "probe-plugin",
        r#"(func (export "wasmlet:plugin/probe@0.1.0#check") (param i32) (result i32)
             (loop $l (br $l))
             (i32.const 0))"#,
    )
}

/// A device adapter for `example.com/widget` with devices `w0` (healthy, NUMA 1)
/// and `w1`; `discover` traps when `broken`.
pub fn device_adapter(broken: bool) -> Vec<u8> {
    let discover = if broken {
        "unreachable".to_string()
    } else {
        r#"(i32.store (i32.const 16) (i32.const 512))
           (i32.store (i32.const 20) (i32.const 2))
           (i32.const 16)"#
            .to_string()
    };
    component(
        "device-adapter-plugin",
        &format!(
            r#"(data (i32.const 300) "example.com/widget")
               (data (i32.const 330) "w0w1")
               ;; device 0 at 512: id (330, 2), healthy, numa some(1)
               (data (i32.const 512) "\4a\01\00\00\02\00\00\00\01\00\00\00\01\00\00\00\01\00\00\00")
               ;; device 1 at 532: id (332, 2), unhealthy, numa none
               (data (i32.const 532) "\4c\01\00\00\02\00\00\00\00\00\00\00\00\00\00\00\00\00\00\00")
               (func (export "wasmlet:plugin/device-adapter@0.1.0#resource-name") (result i32)
                 (i32.store (i32.const 16) (i32.const 300))
                 (i32.store (i32.const 20) (i32.const 18))
                 (i32.const 16))
               (func (export "wasmlet:plugin/device-adapter@0.1.0#discover") (result i32)
                 {discover})
               (func (export "wasmlet:plugin/device-adapter@0.1.0#allocate") (param i32 i32) (result i32)
                 unreachable)
               (func (export "wasmlet:plugin/device-adapter@0.1.0#preferred-allocation")
                   (param i32 i32 i32 i32 i32) (result i32)
                 (i32.store (i32.const 16) (i32.const 0))
                 (i32.store (i32.const 20) (i32.const 0))
                 (i32.const 16))"#
        ),
    )
}
