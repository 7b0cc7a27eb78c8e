//! The node's plugin host: the configured plugins (`wasmlet.plugins`), loaded, and
//! their lifecycle as events on the Node. The host's file watcher starts with the node.

use std::sync::Arc;

use wasmlet_plugin_host::{EventSink, PluginConfig, PluginEventKind, PluginHost, PluginSource};
use wasmlet_runtime_wasm::image::ImageStore;

use crate::cluster::events::{EventRecorder, NORMAL, WARNING};
use crate::config::NodeConfig;

/// Loads the configured plugins, if any. A plugin that cannot be loaded is an error in
/// the log and a `PluginLoadFailed` event, not the node's end: calls to it fail by its
/// world's policy. Disables, re-enables and reloads become events on the Node.
pub(super) async fn load_plugins(
    config: &NodeConfig,
    images: &ImageStore,
    events: &EventRecorder,
) -> Option<PluginHost> {
    if config.plugins.is_empty() {
        return None;
    }
    let host = match PluginHost::new(wasmlet_plugin_host::HostOptions {
        events: Some(event_sink(&config.node_name, events)),
        ..Default::default()
    }) {
        Ok(host) => host,
        Err(e) => {
            tracing::error!("plugins: cannot start the plugin host: {e:#}; no plugin runs");
            return None;
        }
    };
    for plugin in &config.plugins {
        let name = &plugin.name;
        match load_plugin(&host, plugin, images).await {
            Ok(()) => {
                tracing::info!(plugin = %name, world = %plugin.world.as_str(), "plugin loaded")
            }
            Err(e) => {
                tracing::error!(plugin = %name, "plugin not loaded: {e}");
                events.node(
                    &config.node_name,
                    WARNING,
                    "PluginLoadFailed",
                    &format!("plugin {name} not loaded: {e}"),
                );
            }
        }
    }
    Some(host)
}

/// Loads one plugin, from its file or from an image in the node's Wasm image store
/// (imported or pulled for a pod).
async fn load_plugin(
    host: &PluginHost,
    plugin: &PluginConfig,
    images: &ImageStore,
) -> Result<(), String> {
    match &plugin.source {
        PluginSource::File(_) => host
            .load(plugin.clone())
            .await
            .map_err(|e| format!("{e:#}")),
        PluginSource::Image(reference) => match images.resolve(reference) {
            Ok(entry) => match std::fs::read(images.blob_path(&entry.image.wasm_digest)) {
                Ok(bytes) => host
                    .load_bytes(plugin.clone(), bytes)
                    .await
                    .map_err(|e| format!("{e:#}")),
                Err(e) => Err(format!("reading image {reference}: {e}")),
            },
            Err(e) => Err(format!("image {reference}: {e}")),
        },
    }
}

/// Turns the host's plugin events into events on the Node (and warnings in the log).
fn event_sink(node_name: &str, events: &EventRecorder) -> EventSink {
    let node_name = node_name.to_owned();
    let recorder = events.clone();
    Arc::new(move |event| {
        let (type_, reason, message) = match &event.kind {
            PluginEventKind::Disabled {
                failures,
                backoff,
                last_error,
            } => (
                WARNING,
                "PluginDisabled",
                format!(
                    "plugin {} disabled for {backoff:?} after {failures} failures in a row: {last_error}",
                    event.plugin
                ),
            ),
            PluginEventKind::Enabled => (
                NORMAL,
                "PluginEnabled",
                format!("plugin {} answers again", event.plugin),
            ),
            PluginEventKind::Reloaded => (
                NORMAL,
                "PluginReloaded",
                format!("plugin {} reloaded from its changed file", event.plugin),
            ),
            PluginEventKind::ReloadFailed { error } => (
                WARNING,
                "PluginReloadFailed",
                format!(
                    "plugin {}: its changed file cannot be loaded; the previous version keeps running: {error}",
                    event.plugin
                ),
            ),
        };
        tracing::warn!(plugin = %event.plugin, reason, "{message}");
        recorder.node(&node_name, type_, reason, &message);
    })
}
