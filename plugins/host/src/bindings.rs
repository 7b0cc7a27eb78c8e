//! Every `bindgen!` of the plugin ABI, one per world.
//!
//! The probe world is generated first and owns the shared interfaces (`types`,
//! `host`); the other worlds reuse them through `with`, so a [`PodInfo`] is one type
//! whichever world it is passed to.
//!
//! [`PodInfo`]: crate::types::PodInfo

pub(crate) mod probe {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "probe-plugin",
        imports: { default: async | trappable },
        exports: { default: async },
        additional_derives: [PartialEq],
    });
}

pub(crate) mod admission {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "admission-plugin",
        imports: { default: async | trappable },
        exports: { default: async },
        additional_derives: [PartialEq],
        with: {
            "wasmlet:plugin/types": super::probe::wasmlet::plugin::types,
            "wasmlet:plugin/host": super::probe::wasmlet::plugin::host,
        },
    });
}

pub(crate) mod eviction {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "eviction-plugin",
        imports: { default: async | trappable },
        exports: { default: async },
        additional_derives: [PartialEq],
        with: {
            "wasmlet:plugin/types": super::probe::wasmlet::plugin::types,
            "wasmlet:plugin/host": super::probe::wasmlet::plugin::host,
        },
    });
}

pub(crate) mod device_adapter {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "device-adapter-plugin",
        imports: { default: async | trappable },
        exports: { default: async },
        additional_derives: [PartialEq],
        with: {
            "wasmlet:plugin/types": super::probe::wasmlet::plugin::types,
            "wasmlet:plugin/host": super::probe::wasmlet::plugin::host,
        },
    });
}
