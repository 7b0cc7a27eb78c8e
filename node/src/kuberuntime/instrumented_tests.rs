use std::path::PathBuf;
use std::sync::Arc;

use wasmlet_runtime::{ContainerConfig, ContainerMetadata, Error, PodSandboxConfig, Runtime};
use wasmlet_testkit::fake_runtime::{Call, CallKind, FakeRuntime};

use super::InstrumentedRuntime;
use crate::metrics::NodeMetrics;

/// A fake behind the decorator, recording into metrics of the test's own. They are
/// leaked: the decorator holds `&'static` metrics, as the node's are.
fn instrumented() -> (Arc<FakeRuntime>, InstrumentedRuntime, &'static NodeMetrics) {
    let fake = Arc::new(FakeRuntime::new());
    let metrics: &'static NodeMetrics = Box::leak(Box::new(NodeMetrics::new()));
    let runtime = InstrumentedRuntime::new(fake.clone().into_dyn(), metrics);
    (fake, runtime, metrics)
}

/// The value of the sample `series` in the metrics' text, if there is one.
fn sample(metrics: &NodeMetrics, series: &str) -> Option<f64> {
    let text = metrics.encode("node-1", 0, &[]);
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn sandbox_config() -> PodSandboxConfig {
    let mut config = PodSandboxConfig::default();
    config.metadata.name = "web".into();
    config.metadata.namespace = "default".into();
    config.metadata.uid = "uid-1".into();
    config.log_directory = PathBuf::from("/logs/default_web_uid-1");
    config
}

/// A started container `app` in a new sandbox, through the decorator.
async fn running_container(runtime: &InstrumentedRuntime) -> String {
    let sandbox_config = sandbox_config();
    let sandbox = runtime.run_pod_sandbox(&sandbox_config).await.unwrap();
    runtime.pull_image("img:1", None).await.unwrap();
    let config = ContainerConfig {
        metadata: ContainerMetadata {
            name: "app".into(),
            attempt: 0,
        },
        image: "img:1".into(),
        log_path: PathBuf::from("app/0.log"),
        ..Default::default()
    };
    let id = runtime
        .create_container(&sandbox, &config, &sandbox_config)
        .await
        .unwrap();
    runtime.start_container(&id).await.unwrap();
    id
}

#[tokio::test]
async fn each_call_is_counted_and_timed_under_its_operation_type() {
    let (fake, runtime, metrics) = instrumented();
    running_container(&runtime).await;
    runtime.list_containers().await.unwrap();
    runtime.list_containers().await.unwrap();

    assert!(fake.calls().contains(&Call::ListContainers), "forwarded");
    for (operation, n) in [
        ("run_podsandbox", 1.0),
        ("pull_image", 1.0),
        ("create_container", 1.0),
        ("start_container", 1.0),
        ("list_containers", 2.0),
    ] {
        let labels = format!("{{operation_type=\"{operation}\"}}");
        assert_eq!(
            sample(
                metrics,
                &format!("kubelet_runtime_operations_total{labels}")
            ),
            Some(n),
            "{operation}"
        );
        assert_eq!(
            sample(
                metrics,
                &format!("kubelet_runtime_operations_duration_seconds_count{labels}")
            ),
            Some(n),
            "{operation}"
        );
    }
    assert_eq!(
        sample(
            metrics,
            "kubelet_runtime_operations_errors_total{operation_type=\"create_container\"}"
        ),
        None,
        "no errors"
    );
}

#[tokio::test]
async fn a_call_that_returns_an_error_is_counted_as_one() {
    let (fake, runtime, metrics) = instrumented();
    fake.fail_next(CallKind::Version, Error::unavailable("down"));
    assert!(
        runtime.version().await.is_err(),
        "the inner error comes back"
    );
    runtime.version().await.unwrap();

    assert_eq!(
        sample(
            metrics,
            "kubelet_runtime_operations_total{operation_type=\"version\"}"
        ),
        Some(2.0)
    );
    assert_eq!(
        sample(
            metrics,
            "kubelet_runtime_operations_errors_total{operation_type=\"version\"}"
        ),
        Some(1.0)
    );
}

#[tokio::test]
async fn a_method_with_a_default_body_reaches_the_inner_runtimes_own() {
    let (fake, runtime, metrics) = instrumented();
    let id = running_container(&runtime).await;
    // The trait's default refuses a log reopen as unsupported; the fake's succeeds.
    runtime.reopen_container_log(&id).await.unwrap();
    runtime.image_fs_info().await.unwrap();

    assert!(fake.calls().contains(&Call::ReopenContainerLog(id)));
    assert!(fake.calls().contains(&Call::ImageFsInfo));
    assert_eq!(
        sample(
            metrics,
            "kubelet_runtime_operations_total{operation_type=\"reopen_container_log\"}"
        ),
        Some(1.0)
    );
    assert_eq!(runtime.name(), fake.name());
}

#[tokio::test]
async fn the_exposition_carries_the_three_families_with_the_kubelets_help() {
    let (fake, runtime, metrics) = instrumented();
    runtime.status().await.unwrap();
    fake.fail_next(CallKind::Status, Error::unavailable("down"));
    runtime.status().await.unwrap_err();
    let text = metrics.encode("node-1", 0, &[]);

    for line in [
        "# HELP kubelet_runtime_operations [ALPHA] Cumulative number of runtime operations by operation type.",
        "# TYPE kubelet_runtime_operations counter",
        "# HELP kubelet_runtime_operations_errors [ALPHA] Cumulative number of runtime operation errors by operation type.",
        "# TYPE kubelet_runtime_operations_errors counter",
        "# HELP kubelet_runtime_operations_duration_seconds [ALPHA] Duration in seconds of runtime operations. Broken down by operation type.",
        "# TYPE kubelet_runtime_operations_duration_seconds histogram",
        "kubelet_runtime_operations_total{operation_type=\"status\"} 2",
        "kubelet_runtime_operations_errors_total{operation_type=\"status\"} 1",
        "kubelet_runtime_operations_duration_seconds_bucket{le=\"+Inf\",operation_type=\"status\"} 2",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
}
