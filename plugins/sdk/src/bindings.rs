//! Every `wit_bindgen::generate!` of the SDK, one module per world.
//!
//! The probe world is generated first and owns the shared interfaces (`types`,
//! `host`, `pod-network`); the other worlds point at them with `with`, so a
//! [`crate::types::PodInfo`] is one Rust type whichever world uses it.
//!
//! Plugins rarely need this module: the world modules ([`crate::probe`], ...)
//! re-export its types, and the SDK's `export_*!` macros call the generated
//! (hidden, `pub`) export macros with a bridge type implementing the generated
//! `Guest` trait. Each export macro also emits its world's `component-type`
//! custom section into the plugin crate, so a plugin's component exports exactly
//! the world it implements.

/// The `probe-plugin` world: the shared imports plus the `probe` export.
pub mod probe_world {
    wit_bindgen::generate!({
        path: "../wit",
        world: "wasmlet:plugin/probe-plugin@0.1.0",
        additional_derives: [PartialEq, Eq],
        pub_export_macro: true,
        export_macro_name: "__export_probe_plugin",
        default_bindings_module: "wasmlet_plugin_sdk::bindings::probe_world",
        runtime_path: "wasmlet_plugin_sdk::bindings::rt",
    });
}

/// The `admission-plugin` world.
pub mod admission_world {
    wit_bindgen::generate!({
        path: "../wit",
        world: "wasmlet:plugin/admission-plugin@0.1.0",
        with: {
            "wasmlet:plugin/types@0.1.0": crate::bindings::probe_world::wasmlet::plugin::types,
            "wasmlet:plugin/host@0.1.0": crate::bindings::probe_world::wasmlet::plugin::host,
        },
        additional_derives: [PartialEq, Eq],
        pub_export_macro: true,
        export_macro_name: "__export_admission_plugin",
        default_bindings_module: "wasmlet_plugin_sdk::bindings::admission_world",
        runtime_path: "wasmlet_plugin_sdk::bindings::rt",
    });
}

/// The `eviction-plugin` world.
pub mod eviction_world {
    wit_bindgen::generate!({
        path: "../wit",
        world: "wasmlet:plugin/eviction-plugin@0.1.0",
        with: {
            "wasmlet:plugin/types@0.1.0": crate::bindings::probe_world::wasmlet::plugin::types,
            "wasmlet:plugin/host@0.1.0": crate::bindings::probe_world::wasmlet::plugin::host,
        },
        additional_derives: [PartialEq, Eq],
        pub_export_macro: true,
        export_macro_name: "__export_eviction_plugin",
        default_bindings_module: "wasmlet_plugin_sdk::bindings::eviction_world",
        runtime_path: "wasmlet_plugin_sdk::bindings::rt",
    });
}

/// The `device-adapter-plugin` world.
pub mod device_world {
    wit_bindgen::generate!({
        path: "../wit",
        world: "wasmlet:plugin/device-adapter-plugin@0.1.0",
        with: {
            "wasmlet:plugin/types@0.1.0": crate::bindings::probe_world::wasmlet::plugin::types,
            "wasmlet:plugin/host@0.1.0": crate::bindings::probe_world::wasmlet::plugin::host,
        },
        additional_derives: [PartialEq, Eq],
        pub_export_macro: true,
        export_macro_name: "__export_device_adapter_plugin",
        default_bindings_module: "wasmlet_plugin_sdk::bindings::device_world",
        runtime_path: "wasmlet_plugin_sdk::bindings::rt",
    });
}

/// The `wit-bindgen` runtime the generated code calls into (`runtime_path`), so a
/// plugin crate needs no `wit-bindgen` dependency of its own.
pub use wit_bindgen::rt;
