//! Reloading a file plugin when its file changes.

use tokio_util::sync::CancellationToken;
use wasmlet_plugin_host::{PluginEventKind, PluginSource, World};

use crate::{candidates, components, config, host};

#[tokio::test]
async fn a_changed_file_is_reloaded_and_a_bad_one_keeps_the_old_version() {
    let (host, events) = host();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rank.wasm");
    std::fs::write(&path, components::ranking(&[0])).unwrap();
    let mut c = config("watched", World::Eviction);
    c.source = PluginSource::File(path.clone());
    host.load(c).await.unwrap();
    let cancel = CancellationToken::new();
    let watcher = tokio::spawn({
        let host = host.clone();
        let cancel = cancel.clone();
        async move { host.watch(cancel).await }
    });
    // Let the watcher start watching.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(
        host.try_rank("watched", "s", &candidates()).await.unwrap(),
        [0, 1, 2]
    );

    // Replaced by a rename, as deploy tools do.
    let tmp = dir.path().join("rank.wasm.tmp");
    std::fs::write(&tmp, components::ranking(&[2])).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    events
        .wait_for(|e| e.kind == PluginEventKind::Reloaded)
        .await;
    assert_eq!(
        host.try_rank("watched", "s", &candidates()).await.unwrap(),
        [2, 1, 0]
    );
    assert_eq!(host.plugins()[0].reloads, 1);

    // A broken new version: an event, and the old version keeps answering.
    std::fs::write(&path, b"garbage").unwrap();
    let e = events
        .wait_for(|e| matches!(e.kind, PluginEventKind::ReloadFailed { .. }))
        .await;
    let PluginEventKind::ReloadFailed { error } = e.kind else {
        unreachable!()
    };
    assert!(error.contains("not a valid Wasm component"), "{error}");
    assert_eq!(
        host.try_rank("watched", "s", &candidates()).await.unwrap(),
        [2, 1, 0]
    );
    cancel.cancel();
    watcher.await.unwrap();
}

#[tokio::test]
async fn reload_of_an_unchanged_file_does_nothing() {
    let (host, events) = host();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rank.wasm");
    std::fs::write(&path, components::ranking(&[0])).unwrap();
    let mut c = config("same", World::Eviction);
    c.source = PluginSource::File(path);
    host.load(c).await.unwrap();
    assert!(!host.reload("same").await.unwrap());
    assert!(events.take().is_empty());
}
