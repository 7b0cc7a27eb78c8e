//! Loading: what is refused, with which message.

use wasmlet_plugin_host::{Error, PluginSource, World};

use crate::components;
use crate::{config, host};

#[tokio::test]
async fn invalid_bytes_are_a_load_error() {
    let (host, _) = host();
    let err = host
        .load_bytes(config("junk", World::Eviction), b"not wasm at all".to_vec())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidComponent { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("plugin junk: not a valid Wasm component"),
        "{err}"
    );
    assert!(host.plugins().is_empty());
}

#[tokio::test]
async fn a_core_module_is_refused_with_a_hint() {
    let (host, _) = host();
    let module = wat::parse_str("(module)").unwrap();
    let err = host
        .load_bytes(config("core", World::Eviction), module)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("core module, not a component"),
        "{err}"
    );
}

#[tokio::test]
async fn a_component_for_another_world_is_refused() {
    let (host, _) = host();
    let err = host
        .load_bytes(config("p", World::Probe), components::ranking(&[]))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::WrongWorld { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("plugin p: not for the probe-plugin world"),
        "{msg}"
    );
    assert!(
        msg.contains("does not export wasmlet:plugin/probe@0.1.0"),
        "{msg}"
    );
    assert!(msg.contains("wasmlet:plugin/eviction@0.1.0"), "{msg}");
}

#[tokio::test]
async fn a_probe_component_is_not_an_admission_plugin() {
    // It exports probe, and imports pod-network, which admission does not offer.
    let (host, _) = host();
    let err = host
        .load_bytes(
            config("p", World::Admission),
            components::connecting_probe(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::WrongWorld { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("not for the admission-plugin world"),
        "{err}"
    );
}

#[tokio::test]
async fn another_abi_version_is_refused() {
    let (host, _) = host();
    let wit = wasmlet_plugin_host::WIT.replace("wasmlet:plugin@0.1.0", "wasmlet:plugin@0.2.0");
    let bytes = components::component_for(
        &wit,
        "eviction-plugin",
        r#"(func (export "wasmlet:plugin/eviction@0.2.0#rank") (param i32 i32 i32 i32) (result i32)
             (i32.const 16))"#,
    );
    let err = host
        .load_bytes(config("v2", World::Eviction), bytes)
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("does not export wasmlet:plugin/eviction@0.1.0"),
        "{msg}"
    );
    assert!(msg.contains("eviction@0.2.0"), "{msg}");
}

#[tokio::test]
async fn bad_config_is_refused_naming_the_field() {
    let (host, _) = host();
    let mut c = config("Bad", World::Eviction);
    c.limits.memory_bytes = 1 << 40;
    let err = host
        .load_bytes(c, components::ranking(&[]))
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("name: \"Bad\" is not a DNS label"), "{msg}");
    assert!(msg.contains("limits.memoryBytes"), "{msg}");
}

#[tokio::test]
async fn names_are_unique_and_unload_frees_them() {
    let (host, _) = host();
    host.load_bytes(config("a", World::Eviction), components::ranking(&[]))
        .await
        .unwrap();
    let err = host
        .load_bytes(config("a", World::Eviction), components::ranking(&[]))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::AlreadyLoaded(_)), "{err}");
    host.unload("a").unwrap();
    assert!(matches!(host.unload("a"), Err(Error::NotLoaded(_))));
    host.load_bytes(config("a", World::Eviction), components::ranking(&[]))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_file_source_is_read_and_an_image_source_needs_bytes() {
    let (host, _) = host();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rank.wasm");
    std::fs::write(&path, components::ranking(&[0])).unwrap();
    let mut c = config("file", World::Eviction);
    c.source = PluginSource::File(path);
    host.load(c).await.unwrap();
    let err = host
        .load(config("image", World::Eviction))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::ImageSource(_)), "{err}");
    let mut c = config("missing", World::Eviction);
    c.source = PluginSource::File(dir.path().join("missing.wasm"));
    let err = host.load(c).await.unwrap_err();
    assert!(err.to_string().contains("missing.wasm"), "{err}");
}

#[tokio::test]
async fn a_device_adapter_is_asked_its_resource_name_at_load() {
    let (host, _) = host();
    host.load_bytes(
        config("widgets", World::DeviceAdapter),
        components::device_adapter(false),
    )
    .await
    .unwrap();
    assert_eq!(
        host.resource_name("widgets").as_deref(),
        Some("example.com/widget")
    );
    // One whose resource-name traps does not load.
    let err = host
        .load_bytes(
            config("broken", World::DeviceAdapter),
            components::trapping("device-adapter-plugin"),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("plugin broken: trapped"), "{err}");
}
