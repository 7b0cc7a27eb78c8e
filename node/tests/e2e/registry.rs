//! Wasm images from a registry: a loopback docker-registry with TLS from a test CA
//! and basic auth; pods bring their credentials as `imagePullSecrets`.

use base64::Engine as _;
use k8s_openapi::api::core::v1::{Pod, Secret};
use serde_json::json;
use wasmlet_testkit::registry::{PASSWORD, Registry, USER};

use crate::cluster::*;
use crate::*;

pub(crate) fn pull_secret(name: &str, host: &str, password: &str) -> Secret {
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

/// Pushes the hello example's module to `registry` as `<repository>:v1`; its digest.
pub(crate) fn push_hello(registry: &Registry, repository: &str) -> String {
    let wasm = std::fs::read(
        wasmlet_testkit::images::ensure_example_images()
            .unwrap()
            .join("hello.wasm"),
    )
    .unwrap();
    block_on(registry.push_wasm(repository, "v1", &wasm)).expect("the push")
}

/// Runs a push to the registry (the tests themselves are not async).
pub(crate) fn block_on<F: std::future::Future>(push: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(push)
}

#[test]
fn a_wasm_pod_pulls_its_image_with_its_pull_secret_by_tag_and_by_digest() {
    let registry = Registry::start().expect("the registry starts");
    let digest = push_hello(&registry, "edge/hello");
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

/// A kubelet credential provider plugin (a script of the test's) gives the node the
/// registry's credentials for images its `matchImages` covers; its answer is cached for
/// its `cacheDuration`, so two pulls (`imagePullPolicy: Always`) run it once. The
/// `Pulled` event carries the kubelet's times and the image's size.
#[test]
fn a_credential_provider_plugin_supplies_the_credentials_for_matching_images() {
    use std::os::unix::fs::PermissionsExt;
    let registry = Registry::start().expect("the registry starts");
    push_hello(&registry, "edge/provided");
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let requests = dir.path().join("requests");
    let plugin = bin.join("test-provider");
    std::fs::write(
        &plugin,
        format!(
            "#!/bin/sh\ncat >> {requests}\necho >> {requests}\ncat <<'END'\n{{\"apiVersion\":\"credentialprovider.kubelet.k8s.io/v1\",\"kind\":\"CredentialProviderResponse\",\"cacheKeyType\":\"Registry\",\"cacheDuration\":\"10m\",\"auth\":{{\"{host}\":{{\"username\":\"{USER}\",\"password\":\"{PASSWORD}\"}}}}}}\nEND\n",
            requests = requests.display(),
            host = registry.host,
        ),
    )
    .unwrap();
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = dir.path().join("providers.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n- name: test-provider\n  matchImages: [\"{}/edge\"]\n  defaultCacheDuration: 1m\n  apiVersion: credentialprovider.kubelet.k8s.io/v1\n",
            registry.host
        ),
    )
    .unwrap();
    let c = cluster();
    let mut opts = node_options(&c, &[]);
    opts.wasmlet_config = format!("  registryCertsDir: {}\n", registry.certs_dir().display());
    opts.extra_args.extend([
        "--image-credential-provider-config".into(),
        config.display().to_string(),
        "--image-credential-provider-bin-dir".into(),
        bin.display().to_string(),
    ]);
    let node = start_with(opts);
    let image = format!("{}/edge/provided:v1", registry.host);
    for name in ["provided-1", "provided-2"] {
        let mut pod = registry_pod(name, &image, None);
        pod.spec.as_mut().unwrap().containers[0].image_pull_policy = Some("Always".into());
        c.api.create(&pod).unwrap();
        wait(&format!("{name} to succeed"), LONG, || {
            get(&c, name).filter(|p| phase(p) == "Succeeded")
        });
    }
    let asked = std::fs::read_to_string(&requests).unwrap();
    let asked: Vec<serde_json::Value> = asked
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        asked,
        [json!({
            "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
            "kind": "CredentialProviderRequest",
            "image": format!("{}/edge/provided", registry.host),
        })],
        "one request, the second pull answered from the cache"
    );
    let pulled: Vec<String> = c
        .api
        .list::<k8s_openapi::api::core::v1::Event>(Some("default"))
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("Pulled"))
        .filter_map(|e| e.message)
        .collect();
    let prefix = format!("Successfully pulled image {image:?} in ");
    assert!(
        pulled.iter().any(|m| m.starts_with(&prefix)
            && m.contains(" including waiting). Image size: ")
            && m.ends_with(" bytes.")),
        "{pulled:?}"
    );
    // The password never reached the node's log.
    assert!(!node.log().contains(PASSWORD));
    // An image the plugin does not cover is not asked about.
    let other = format!("{}/elsewhere/app:v1", registry.host);
    c.api
        .create(&registry_pod("uncovered", &other, None))
        .unwrap();
    wait("the uncovered pod to fail its pull", LONG, || {
        get(&c, "uncovered").filter(|p| {
            matches!(
                waiting_reason(p).as_deref(),
                Some("ErrImagePull" | "ImagePullBackOff")
            )
        })
    });
    assert_eq!(
        std::fs::read_to_string(&requests)
            .unwrap()
            .lines()
            .filter(|l| !l.is_empty())
            .count(),
        1
    );
}
