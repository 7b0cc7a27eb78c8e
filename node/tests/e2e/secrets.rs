//! Secrets never reach the node's log, an event or a status message: Secret values as
//! environment and as a volume, a projected service-account token, image pull
//! credentials (right, wrong and malformed), the bootstrap token and the node's own
//! private key, with the node logging at `trace`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod, Secret, ServiceAccount};
use serde_json::json;
use wasmlet_testkit::apiserver::KUBELET_CLIENT_SIGNER;
use wasmlet_testkit::registry::{PASSWORD, Registry, USER};

use crate::bootstrap::{TOKEN, options, tls_cluster};
use crate::cluster::{NODE, here, pod_with_spec, wait};
use crate::registry::{pull_secret, push_hello};
use crate::*;

/// Values no log line may hold: each is distinctive, so a hit is a leak, not chance.
const ENV_SECRET: &str = "env-secret-7Hq2xZ";
const FILE_SECRET: &str = "file-secret-Kp39Wd";
const WRONG_PASSWORD: &str = "wrong-password-Vb81Lm";
const GARBLED_SECRET: &str = "garbled-secret-Qs55Tn";

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// Every regular file below `dir` that `wanted` accepts, not descending into `skip`.
/// Links are not followed (atomic-writer volumes link `token` to `..data/token`).
fn files_below(dir: &Path, skip: &Path, wanted: &dyn Fn(&Path) -> bool, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() && path != skip {
            files_below(&path, skip, wanted, out);
        } else if kind.is_file() && wanted(&path) {
            out.push(path);
        }
    }
}

/// The base64 lines of every private key PEM block in the files of `dir`.
fn private_key_lines(dir: &Path) -> Vec<String> {
    let mut lines = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let mut inside = false;
        for line in text.lines() {
            if line.starts_with("-----BEGIN") {
                inside = line.contains("PRIVATE KEY");
            } else if line.starts_with("-----END") {
                inside = false;
            } else if inside && line.len() >= 32 {
                lines.push(line.to_owned());
            }
        }
    }
    lines
}

#[test]
fn no_secret_reaches_the_nodes_log_its_events_or_its_status_messages() {
    let c = tls_cluster();
    c.api
        .auto_approve_and_sign(&[KUBELET_CLIENT_SIGNER], Duration::from_secs(3600));
    let registry = Registry::start().expect("the registry starts");
    push_hello(&registry, "edge/hello");
    let image = format!("{}/edge/hello:v1", registry.host);

    let mut opts = options(&c, &[], &[], "");
    opts.wasmlet_config = format!("  registryCertsDir: {}\n", registry.certs_dir().display());
    // As much as the node and every library in it will say.
    opts.env.push(("RUST_LOG".into(), "trace".into()));
    let node = start_with(opts);

    let secret: Secret = serde_json::from_value(json!({
        "metadata": { "name": "creds", "namespace": "default" },
        "data": { "password": b64(ENV_SECRET), "file.txt": b64(FILE_SECRET) },
    }))
    .unwrap();
    c.api.create(&secret).unwrap();
    c.api
        .create(&pull_secret("regcred", &registry.host, PASSWORD))
        .unwrap();
    c.api
        .create(&pull_secret("wrongcred", &registry.host, WRONG_PASSWORD))
        .unwrap();
    // A pull secret that is not JSON, holding a credential all the same.
    let garbled: Secret = serde_json::from_value(json!({
        "metadata": { "name": "garbled", "namespace": "default" },
        "type": "kubernetes.io/dockerconfigjson",
        "data": { ".dockerconfigjson": b64(&format!(
            r#"{{"auths": {{"{}": {{"auth": "{}", "password": "{GARBLED_SECRET}""#,
            registry.host,
            b64(&format!("{USER}:{GARBLED_SECRET}")),
        )) },
    }))
    .unwrap();
    c.api.create(&garbled).unwrap();
    let ca: ConfigMap = serde_json::from_value(json!({
        "metadata": { "name": "kube-root-ca.crt", "namespace": "default" },
        "data": { "ca.crt": "-----BEGIN CERTIFICATE-----\nfake\n-----END CERTIFICATE-----\n" },
    }))
    .unwrap();
    c.api.create(&ca).unwrap();
    let sa: ServiceAccount = serde_json::from_value(json!({
        "metadata": { "name": "robot", "namespace": "default" },
    }))
    .unwrap();
    c.api.create(&sa).unwrap();

    let pod = |name: &str, pull: &str, env: serde_json::Value| {
        pod_with_spec(
            name,
            json!({
                "nodeName": NODE,
                "restartPolicy": "Never",
                "serviceAccountName": "robot",
                "imagePullSecrets": [{ "name": pull }],
                "containers": [{
                    "name": "main",
                    "image": image,
                    // Each pod pulls with its own credentials, even when another has
                    // pulled the image already.
                    "imagePullPolicy": "Always",
                    "env": env,
                    "envFrom": [{ "prefix": "S_", "secretRef": { "name": "creds" } }],
                    "volumeMounts": [
                        { "name": "creds", "mountPath": "/creds", "readOnly": true },
                        { "name": "api", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true },
                    ],
                }],
                "volumes": [
                    { "name": "creds", "secret": { "secretName": "creds" } },
                    { "name": "api", "projected": { "sources": [
                        { "serviceAccountToken": { "expirationSeconds": 3607, "path": "token" } },
                        { "configMap": { "name": "kube-root-ca.crt", "items": [{ "key": "ca.crt", "path": "ca.crt" }] } },
                    ] } },
                ],
            }),
        )
    };
    let uses_secret = json!([
        { "name": "PW", "valueFrom": { "secretKeyRef": { "name": "creds", "key": "password" } } },
        { "name": "READ_FILE", "value": "/creds/file.txt" },
    ]);
    let missing_key = json!([
        { "name": "PW", "valueFrom": { "secretKeyRef": { "name": "creds", "key": "nope" } } },
    ]);
    let pods: [(&str, &str, &serde_json::Value); 4] = [
        ("uses", "regcred", &uses_secret),
        ("wrong-pull", "wrongcred", &uses_secret),
        ("garbled-pull", "garbled", &uses_secret),
        ("missing-key", "regcred", &missing_key),
    ];
    for (name, pull, env) in pods {
        c.api.create::<Pod>(&pod(name, pull, env.clone())).unwrap();
    }

    // The secrets were used: the pod that may read them ran, and read them.
    let get = |name: &str| c.api.get::<Pod>(Some("default"), name);
    wait("the pod using the secrets to succeed", LONG, || {
        get("uses").filter(|p| phase(p) == "Succeeded")
    });
    let local = here(&node, "uses").expect("the node has the pod");
    let out: Vec<String> = node
        .container_log(&local, "main", 0)
        .unwrap()
        .into_iter()
        .map(|r| r.text)
        .collect();
    for want in [format!("env PW={ENV_SECRET}"), FILE_SECRET.to_owned()] {
        assert!(out.iter().any(|l| l.contains(&want)), "{want} in {out:#?}");
    }
    // Every failure the others meet, reported.
    for name in ["wrong-pull", "garbled-pull"] {
        let failed = wasmlet_testkit::node::poll(LONG, || {
            get(name).filter(|p| {
                matches!(
                    waiting_reason(p).as_deref(),
                    Some("ErrImagePull" | "ImagePullBackOff")
                )
            })
        });
        assert!(
            failed.is_some(),
            "{name} did not fail its pull: {:#?}",
            get(name).and_then(|p| p.status)
        );
    }
    wait("missing-key to be refused its config", LONG, || {
        get("missing-key")
            .filter(|p| waiting_reason(p).as_deref() == Some("CreateContainerConfigError"))
    });

    // What must appear nowhere: the values, their base64 (as the API carries them),
    // the pull credentials and their `user:password` encoding, the bootstrap token's
    // secret half, the issued service-account token and the node's private keys.
    let mut secrets: Vec<String> = Vec::new();
    for value in [
        ENV_SECRET,
        FILE_SECRET,
        PASSWORD,
        WRONG_PASSWORD,
        GARBLED_SECRET,
    ] {
        secrets.push(value.to_owned());
        secrets.push(b64(value));
        secrets.push(b64(&format!("{USER}:{value}")));
    }
    secrets.push(TOKEN.split_once('.').unwrap().1.to_owned());
    let mut tokens = Vec::new();
    files_below(
        node.dir(),
        Path::new(""),
        &|p| p.file_name().is_some_and(|n| n == "token"),
        &mut tokens,
    );
    assert!(!tokens.is_empty(), "the projected token was written");
    for token in tokens {
        let token = std::fs::read_to_string(token).unwrap();
        assert!(token.len() > 16, "{token:?}");
        secrets.push(token.trim().to_owned());
    }
    let keys = private_key_lines(&c.cert_dir);
    assert!(
        !keys.is_empty(),
        "the node's private key is in {:?}",
        c.cert_dir
    );
    secrets.extend(keys);

    // Where they must not be: every log the node and its sandboxes wrote (not the
    // containers' own output, which is the workload's), every event, every pod status.
    let mut places: Vec<(String, String)> = Vec::new();
    let mut logs = Vec::new();
    files_below(
        node.dir(),
        &node.dir().join("pods"),
        &|p| p.extension().is_some_and(|e| e == "log"),
        &mut logs,
    );
    assert!(logs.iter().any(|l| l.ends_with("wasmlet.log")), "{logs:?}");
    for log in logs {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        places.push((log.display().to_string(), text));
    }
    for event in c.api.list::<Event>(Some("default")) {
        places.push((
            format!("event {:?}", event.metadata.name),
            serde_json::to_string(&event).unwrap(),
        ));
    }
    for name in ["uses", "wrong-pull", "garbled-pull", "missing-key"] {
        let status = get(name).and_then(|p| p.status);
        places.push((
            format!("status of {name}"),
            serde_json::to_string(&status).unwrap(),
        ));
    }
    let node_log = node.log();
    assert!(
        node_log.lines().filter(|l| l.contains("TRACE")).count() > 100,
        "the node logged at trace:\n{node_log}"
    );
    let mut leaks = Vec::new();
    for (place, text) in &places {
        for secret in &secrets {
            if let Some(at) = text.find(secret.as_str()) {
                let from = text[..at].rfind('\n').map_or(0, |i| i + 1);
                let to = text[at..].find('\n').map_or(text.len(), |i| at + i);
                leaks.push(format!("{place}: {}", &text[from..to]));
            }
        }
    }
    assert!(leaks.is_empty(), "secrets leaked:\n{}", leaks.join("\n"));
}
