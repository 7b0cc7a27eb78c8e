//! The `GetContainerEvents` follower.

use std::time::Duration;

use tokio::sync::broadcast;
use wasmlet_proto::cri::v1 as cri;
use wasmlet_runtime::{
    ContainerConfig, ContainerEventKind, PodMetadata, PodSandboxConfig, Runtime, RuntimeEvent,
};
use wasmlet_runtime_cri::CriRuntime;

use crate::fake::{EventsMode, Fake};
use crate::{config, eventually, setup, socket_dir};

async fn next(rx: &mut broadcast::Receiver<RuntimeEvent>) -> RuntimeEvent {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("an event within 10s")
        .expect("the event channel is open")
}

fn pod() -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: PodMetadata {
            name: "p".into(),
            namespace: "default".into(),
            uid: "uid-7".into(),
            attempt: 0,
        },
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_events_are_republished_with_the_pod_uid() {
    let s = setup(Fake::default());
    let mut rx = s.runtime.subscribe();
    eventually("the event stream to open", || {
        s.fake.state().open_event_streams == 1
    })
    .await;

    let sandbox = s.runtime.run_pod_sandbox(&pod()).await.unwrap();
    let id = s
        .runtime
        .create_container(&sandbox, &ContainerConfig::default(), &pod())
        .await
        .unwrap();
    let created = next(&mut rx).await;
    assert_eq!(created.kind, ContainerEventKind::Created);
    assert_eq!(created.container_id, id);
    assert_eq!(created.sandbox_id, sandbox);
    assert_eq!(created.pod_uid, "uid-7");

    s.runtime.start_container(&id).await.unwrap();
    s.fake.exit(&id, 0);
    let stopped = next(&mut rx).await;
    assert_eq!(stopped.kind, ContainerEventKind::Stopped);
    assert_eq!(stopped.pod_uid, "uid-7");
    assert!(stopped.at >= created.at);

    // An event type newer than this client is skipped, not fatal.
    s.fake.send_event(cri::ContainerEventResponse {
        container_id: "x".into(),
        container_event_type: 99,
        ..Default::default()
    });
    s.fake.send_event(cri::ContainerEventResponse {
        container_id: "y".into(),
        container_event_type: cri::ContainerEventType::ContainerDeletedEvent.into(),
        ..Default::default()
    });
    let deleted = next(&mut rx).await;
    assert_eq!(
        (deleted.container_id.as_str(), deleted.kind),
        ("y", ContainerEventKind::Deleted)
    );
    s.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_without_events_is_asked_once() {
    let s = setup(Fake::with(|s| s.events_mode = EventsMode::Unimplemented));
    eventually("the first GetContainerEvents", || {
        s.fake.state().event_calls == 1
    })
    .await;
    // Retrying would have asked again after 0.5s and 1.5s.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(s.fake.state().event_calls, 1);
    // Everything else works as before.
    s.runtime.version().await.unwrap();
    s.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stream_is_reopened() {
    let s = setup(Fake::with(|s| s.events_mode = EventsMode::EndAtOnce));
    eventually("the stream to be reopened", || {
        s.fake.state().event_calls >= 2
    })
    .await;
    s.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_resume_after_the_runtime_restarts() {
    let (_dir, path) = socket_dir();
    // The runtime is down when the node starts.
    let runtime = CriRuntime::connect(config(&path)).unwrap();
    let mut rx = runtime.subscribe();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let fake = Fake::default();
    let server = fake.serve(&path);
    eventually("the event stream to open", || {
        fake.state().open_event_streams == 1
    })
    .await;
    server.stop().await;
    assert_eq!(fake.state().open_event_streams, 0);

    let calls_before = fake.state().event_calls;
    let server = fake.serve(&path);
    eventually("the event stream to reopen", || {
        fake.state().open_event_streams == 1
    })
    .await;
    assert!(fake.state().event_calls > calls_before);
    fake.send_event(cri::ContainerEventResponse {
        container_id: "after-restart".into(),
        container_event_type: cri::ContainerEventType::ContainerStartedEvent.into(),
        ..Default::default()
    });
    assert_eq!(next(&mut rx).await.container_id, "after-restart");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_runtime_ends_the_event_task() {
    let s = setup(Fake::default());
    let mut rx = s.runtime.subscribe();
    let clone = s.runtime.clone();
    eventually("the event stream to open", || {
        s.fake.state().open_event_streams == 1
    })
    .await;
    drop(s.runtime);
    // A clone keeps it alive.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(s.fake.state().open_event_streams, 1);
    drop(clone);
    eventually("the event stream to close", || {
        s.fake.state().open_event_streams == 0
    })
    .await;
    // And with it the sender: subscribers see the end.
    let end = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("the channel closes");
    assert!(matches!(end, Err(broadcast::error::RecvError::Closed)));
    s.server.stop().await;
}
