//! Failure policies, disabling with back-off, events and metrics.

use std::time::Duration;

use wasmlet_plugin_host::types::{Decision, NodeState};
use wasmlet_plugin_host::{BackoffPolicy, CallError, FailurePolicy, PluginEventKind, World};

use crate::{candidates, components, config, host, host_with, pod};

fn node() -> NodeState {
    NodeState {
        node_name: "n".into(),
        allocatable: vec![],
        requested: vec![],
        pod_count: 0,
        labels: vec![],
    }
}

#[tokio::test]
async fn admission_fails_closed_by_default_and_open_when_ignored() {
    let (host, _) = host();
    let trap = components::trapping("admission-plugin");
    host.load_bytes(config("closed", World::Admission), trap.clone())
        .await
        .unwrap();
    let mut open = config("open", World::Admission);
    open.failure_policy = Some(FailurePolicy::Ignore);
    host.load_bytes(open, trap).await.unwrap();
    let d = host.admit("closed", pod("p", 0), node()).await;
    let Decision::Deny(denial) = d else {
        panic!("{d:?}")
    };
    assert_eq!(denial.reason, "PluginError");
    assert!(
        denial
            .message
            .contains("admission plugin closed failed: trapped"),
        "{}",
        denial.message
    );
    assert_eq!(
        host.admit("open", pod("p", 0), node()).await,
        Decision::Admit
    );
}

#[tokio::test]
async fn repeated_failures_disable_then_a_good_call_enables() {
    let (host, events) = host_with(BackoffPolicy {
        failure_threshold: 3,
        initial: Duration::from_millis(300),
        max: Duration::from_secs(1),
    });
    host.load_bytes(
        config("flaky", World::Eviction),
        components::trapping("eviction-plugin"),
    )
    .await
    .unwrap();
    for _ in 0..3 {
        let err = host
            .try_rank("flaky", "memory.available", &[])
            .await
            .unwrap_err();
        assert!(matches!(err, CallError::Trap(_)));
    }
    let events_now = events.take();
    assert_eq!(events_now.len(), 1, "{events_now:?}");
    let PluginEventKind::Disabled {
        failures,
        backoff,
        last_error,
    } = &events_now[0].kind
    else {
        panic!("{events_now:?}")
    };
    assert_eq!((*failures, *backoff), (3, Duration::from_millis(300)));
    assert!(matches!(last_error, CallError::Trap(_)));
    let err = host
        .try_rank("flaky", "memory.available", &[])
        .await
        .unwrap_err();
    assert!(
        matches!(err, CallError::Disabled { failures: 3, .. }),
        "{err}"
    );
    // Refused calls fall back too.
    assert_eq!(
        host.rank("flaky", "memory.available", &candidates()).await,
        [1, 2, 0]
    );
    let info = &host.plugins()[0];
    assert!(info.disabled_until.is_some());
    assert!(
        host.metrics_text()
            .contains("wasmlet_plugin_disabled{plugin=\"flaky\"} 1")
    );

    // After the back-off a trial call runs; a failed trial doubles it.
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert!(matches!(
        host.try_rank("flaky", "memory.available", &[]).await,
        Err(CallError::Trap(_))
    ));
    let e = events.take();
    assert!(
        matches!(&e[..], [ev] if matches!(ev.kind, PluginEventKind::Disabled { backoff, .. } if backoff == Duration::from_millis(600))),
        "{e:?}"
    );

    // A fixed version: after the back-off the good call enables the plugin.
    host.reload_bytes("flaky", components::ranking(&[]))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(650)).await;
    host.try_rank("flaky", "memory.available", &[])
        .await
        .unwrap();
    let kinds: Vec<PluginEventKind> = events.take().into_iter().map(|e| e.kind).collect();
    assert_eq!(kinds, [PluginEventKind::Reloaded, PluginEventKind::Enabled]);
    assert!(host.plugins()[0].disabled_until.is_none());
}

#[tokio::test]
async fn metrics_count_calls_failures_and_durations() {
    let (host, _) = host();
    crate::load_good(&host).await;
    host.load_bytes(
        config("trap", World::Eviction),
        components::trapping("eviction-plugin"),
    )
    .await
    .unwrap();
    for _ in 0..3 {
        host.try_rank("good", "memory.available", &candidates())
            .await
            .unwrap();
    }
    host.try_rank("trap", "memory.available", &[])
        .await
        .unwrap_err();
    let infos = host.plugins();
    let good = infos.iter().find(|i| i.name == "good").unwrap();
    assert_eq!(good.metrics.calls, 3);
    assert_eq!(good.metrics.duration_count, 3);
    assert_eq!(good.metrics.failures_total(), 0);
    let text = host.metrics_text();
    for line in [
        "wasmlet_plugin_calls_total{plugin=\"good\",world=\"eviction-plugin\"} 3",
        "wasmlet_plugin_calls_total{plugin=\"trap\",world=\"eviction-plugin\"} 1",
        "wasmlet_plugin_failures_total{plugin=\"trap\",kind=\"trap\"} 1",
        "wasmlet_plugin_call_duration_seconds_count{plugin=\"good\",world=\"eviction-plugin\"} 3",
        "wasmlet_plugin_disabled{plugin=\"good\"} 0",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
    }
}
