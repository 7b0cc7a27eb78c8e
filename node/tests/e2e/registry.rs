//! Wasm images from a registry: a loopback docker-registry with TLS from a test CA
//! and basic auth; pods bring their credentials as `imagePullSecrets`.

use base64::Engine as _;
use k8s_openapi::api::core::v1::{Pod, Secret};
use serde_json::json;
use wasmlet_testkit::registry::{PASSWORD, Registry, USER};

use crate::cluster::*;
use crate::*;

fn pull_secret(name: &str, host: &str, password: &str) -> Secret {
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{password}"));
    let config = json!({ "auths": { host: { "auth": auth } } });
    serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": "default" },
        "type": "kubernetes.io/dockerconfigjson",
        "data": {
            ".dockerconfigjson": base64::engine::general_purpose::STANDARD
                .encode(serde_json::to_vec(&config).unwrap()),
        },
    }))
    .unwrap()
}

fn registry_pod(name: &str, image: &str, secret: Option<&str>) -> Pod {
    let mut spec = json!({
        "nodeName": NODE,
        "restartPolicy": "Never",
        "tolerations": [{ "key": "wasm", "operator": "Exists" }],
        "containers": [{ "name": "main", "image": image }],
    });
    if let Some(s) = secret {
        spec["imagePullSecrets"] = json!([{ "name": s }]);
    }
    pod_with_spec(name, spec)
}

/// Runs a push to the registry (the tests themselves are not async).
fn block_on<F: std::future::Future>(push: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(push)
}

#[test]
fn a_wasm_pod_pulls_its_image_with_its_pull_secret_by_tag_and_by_digest() {
    let registry = Registry::start().expect("the registry starts");
    let wasm = std::fs::read(
        wasmlet_testkit::images::ensure_example_images()
            .unwrap()
            .join("hello.wasm"),
    )
    .unwrap();
    let digest = block_on(registry.push_wasm("edge/hello", "v1", &wasm)).expect("the push");
    let c = cluster();
    let mut opts = node_options(&c, &[]);
    opts.wasmlet_config = format!("  registryCertsDir: {}\n", registry.certs_dir().display());
    let _node = start_with(opts);
    let by_tag = format!("{}/edge/hello:v1", registry.host);
    c.api
        .create(&pull_secret("regcred", &registry.host, PASSWORD))
        .unwrap();
    c.api
        .create(&pull_secret("wrongcred", &registry.host, "not-it"))
        .unwrap();

    // Without a secret, with the wrong password, or with a secret that does not
    // exist: the registry's refusal.
    c.api
        .create(&registry_pod("anonymous", &by_tag, None))
        .unwrap();
    c.api
        .create(&registry_pod("wrong", &by_tag, Some("wrongcred")))
        .unwrap();
    c.api
        .create(&registry_pod("missing", &by_tag, Some("nosuchcred")))
        .unwrap();
    for name in ["anonymous", "wrong", "missing"] {
        let p = wait(&format!("{name} to fail its pull"), LONG, || {
            get(&c, name).filter(|p| {
                matches!(
                    waiting_reason(p).as_deref(),
                    Some("ErrImagePull" | "ImagePullBackOff")
                )
            })
        });
        let message = waiting_message(&p);
        assert!(message.contains("unauthorized"), "{name}: {message}");
        assert!(
            !message.contains(PASSWORD) && !message.contains("not-it"),
            "{message}"
        );
    }

    wait("a FailedToRetrieveImagePullSecret event", LONG, || {
        let events = c
            .api
            .list::<k8s_openapi::api::core::v1::Event>(Some("default"));
        events
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("FailedToRetrieveImagePullSecret")
                    && e.involved_object.name.as_deref() == Some("missing")
            })
            .then_some(())
    });

    // With it: pulled, run to completion, the image id the pushed digest.
    c.api
        .create(&registry_pod("tagged", &by_tag, Some("regcred")))
        .unwrap();
    let done = wait("the tagged pod to succeed", LONG, || {
        get(&c, "tagged").filter(|p| phase(p) == "Succeeded")
    });
    assert!(
        container(&done).image_id.ends_with(&digest),
        "{:?}",
        container(&done).image_id
    );

    // By digest, also with the secret.
    let by_digest = format!("{}/edge/hello@{digest}", registry.host);
    c.api
        .create(&registry_pod("pinned", &by_digest, Some("regcred")))
        .unwrap();
    wait("the pinned pod to succeed", LONG, || {
        get(&c, "pinned").filter(|p| phase(p) == "Succeeded")
    });
}

#[test]
fn a_container_pod_pulls_its_image_through_containerd_with_its_pull_secret() {
    use wasmlet_testkit::containerd::{Containerd, images};
    let registry = Registry::start().expect("the registry starts");
    let busybox = images::test_images(std::path::Path::new(images::BUSYBOX_BINARY))
        .unwrap()
        .into_iter()
        .find(|i| i.reference == images::BUSYBOX_IMAGE)
        .unwrap();
    let digest =
        block_on(registry.push_image("edge/busybox", "v1", &busybox.oci)).expect("the push");
    let containerd = Containerd::start().expect("containerd starts");
    containerd.import_test_images().expect("test images import");
    containerd
        .trust_registry(&registry.host, registry.ca.pem())
        .unwrap();
    let c = cluster();
    let _node = start_with(node_options(&c, &[]).with_cri(containerd.address()));
    c.api
        .create(&pull_secret("regcred", &registry.host, PASSWORD))
        .unwrap();
    let image = format!("{}/edge/busybox:v1", registry.host);
    let boxed = |name: &str, secret: Option<&str>| {
        let mut pod = registry_pod(name, &image, secret);
        let spec = pod.spec.as_mut().unwrap();
        spec.containers[0].command = Some(vec!["sh".into(), "-c".into(), "echo pulled".into()]);
        pod
    };

    c.api.create(&boxed("anonymous", None)).unwrap();
    let p = wait("the anonymous pull to fail", LONG, || {
        get(&c, "anonymous").filter(|p| {
            matches!(
                waiting_reason(p).as_deref(),
                Some("ErrImagePull" | "ImagePullBackOff")
            )
        })
    });
    let message = waiting_message(&p);
    assert!(
        message.to_lowercase().contains("unauthorized") || message.contains("401"),
        "{message}"
    );

    c.api
        .create(&boxed("with-secret", Some("regcred")))
        .unwrap();
    let done = wasmlet_testkit::node::poll(LONG, || {
        get(&c, "with-secret").filter(|p| phase(p) == "Succeeded")
    })
    .unwrap_or_else(|| {
        panic!(
            "the pod with the secret did not succeed: {:?}",
            get(&c, "with-secret").and_then(|p| p.status)
        )
    });
    let id = container(&done).image_id;
    assert!(id.ends_with(&digest), "{id}");
    drop(containerd);
}
