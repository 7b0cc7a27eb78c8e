//! The node's certificates from the cluster: the TLS bootstrap of its client
//! certificate with a bootstrap token, its rotation while the node runs, and the
//! serving certificate of `serverTLSBootstrap`, against the testkit API server over
//! HTTPS with its built-in approver and signer.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Node, Pod};
use wasmlet_testkit::apiserver::{
    ApiServer, Credentials, KUBELET_CLIENT_SIGNER, KUBELET_SERVING_SIGNER,
};
use wasmlet_testkit::node::{NodeApiAuth, NodeOptions, https_get};

use crate::cluster::{NODE, api_pod, node_ready, wait};
use crate::*;

pub(crate) const TOKEN: &str = "abcdef.0123456789abcdef";

/// A test API server over HTTPS with a bootstrap token, and the node's paths.
pub(crate) struct TlsCluster {
    pub(crate) api: ApiServer,
    bootstrap: PathBuf,
    kubeconfig: PathBuf,
    pub(crate) cert_dir: PathBuf,
    _rt: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
}

pub(crate) fn tls_cluster() -> TlsCluster {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let api = ApiServer::new();
    rt.block_on(api.serve_tls(0)).unwrap();
    api.add_bootstrap_token(TOKEN).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bootstrap = dir.path().join("bootstrap-kubelet.conf");
    api.write_kubeconfig_tls(&bootstrap, &Credentials::Token(TOKEN.into()))
        .unwrap();
    TlsCluster {
        api,
        bootstrap,
        kubeconfig: dir.path().join("kubelet.conf"),
        cert_dir: dir.path().join("pki"),
        _rt: rt,
        _dir: dir,
    }
}

/// A node with only the bootstrap kubeconfig; `config` is more of the config file
/// (top-level lines).
pub(crate) fn options(
    c: &TlsCluster,
    images: &[&str],
    extra: &[&str],
    config: &str,
) -> NodeOptions {
    let mut extra_args: Vec<String> = vec![
        "--bootstrap-kubeconfig".into(),
        c.bootstrap.display().to_string(),
        "--kubeconfig".into(),
        c.kubeconfig.display().to_string(),
        "--cert-dir".into(),
        c.cert_dir.display().to_string(),
        "--node-ip".into(),
        "127.0.0.1".into(),
    ];
    extra_args.extend(extra.iter().map(|s| s.to_string()));
    NodeOptions {
        images: images.iter().map(|s| s.to_string()).collect(),
        extra_args,
        kubelet_config: config.to_owned(),
        ..Default::default()
    }
}

fn csrs(api: &ApiServer) -> Vec<CertificateSigningRequest> {
    api.list::<CertificateSigningRequest>(None)
}

fn usages(csr: &CertificateSigningRequest) -> Vec<String> {
    csr.spec.usages.clone().unwrap_or_default()
}

fn current_target(cert_dir: &Path) -> Option<PathBuf> {
    std::fs::read_link(cert_dir.join("kubelet-client-current.pem")).ok()
}

/// Whether the API server saw `system:node:<NODE>` make this kind of request.
fn made_as_node(api: &ApiServer, resource: &str, verb: &str) -> bool {
    api.requests().iter().any(|r| {
        r.resource == resource
            && r.verb == verb
            && r.user == format!("system:node:{NODE}")
            && r.groups.iter().any(|g| g == "system:nodes")
            && r.status < 300
    })
}

/// How many pod watches the node has opened.
fn pod_watches(api: &ApiServer) -> usize {
    api.requests()
        .iter()
        .filter(|r| r.resource == "pods" && r.verb == "watch")
        .count()
}

fn running_here(node: &Fixture, name: &str) -> bool {
    node.pods().ok().is_some_and(|pods| {
        pods.iter()
            .any(|p| p.metadata.name.as_deref() == Some(name))
    })
}

#[test]
fn a_node_with_only_a_bootstrap_kubeconfig_gets_its_client_certificate_through_a_csr() {
    let c = tls_cluster();
    c.api
        .auto_approve_and_sign(&[KUBELET_CLIENT_SIGNER], Duration::from_secs(3600));
    let node = start_with(options(&c, &[], &[], ""));
    wait("the Node to be Ready", LONG, || {
        c.api.get::<Node>(None, NODE).filter(node_ready)
    });

    let all = csrs(&c.api);
    assert_eq!(all.len(), 1, "{all:#?}");
    let csr = &all[0];
    let name = csr.metadata.name.as_deref().unwrap();
    assert!(name.starts_with("node-csr-"), "{name}");
    assert_eq!(csr.spec.signer_name, KUBELET_CLIENT_SIGNER);
    assert_eq!(
        usages(csr),
        ["digital signature", "key encipherment", "client auth"]
    );
    assert_eq!(
        csr.spec.username.as_deref(),
        Some("system:bootstrap:abcdef")
    );
    let info = wasmlet_testkit::pki::parse_csr(&csr.spec.request.0).unwrap();
    assert_eq!(info.common_name, format!("system:node:{NODE}"));
    assert_eq!(info.organizations, ["system:nodes"]);
    assert!(info.sans.is_empty(), "{:?}", info.sans);

    // The pair, private, behind the current link; the kubeconfig names it.
    let target = current_target(&c.cert_dir).expect("kubelet-client-current.pem");
    assert!(
        target.to_str().unwrap().starts_with("kubelet-client-"),
        "{target:?}"
    );
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(c.cert_dir.join(&target))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let kubeconfig = std::fs::read_to_string(&c.kubeconfig).unwrap();
    let current = c.cert_dir.join("kubelet-client-current.pem");
    assert!(
        kubeconfig.contains(&format!(
            "\"client-certificate\": \"{}\"",
            current.display()
        )),
        "{kubeconfig}"
    );
    assert!(
        !kubeconfig.contains(TOKEN),
        "no bootstrap token in {kubeconfig}"
    );

    // Everything after the CSR is the node's own identity.
    assert!(
        made_as_node(&c.api, "nodes", "create"),
        "registered as the node"
    );
    assert!(
        made_as_node(&c.api, "pods", "watch"),
        "watches its pods as the node"
    );
    let bootstrap_user = "system:bootstrap:abcdef";
    let by_token: Vec<_> = c
        .api
        .requests()
        .into_iter()
        .filter(|r| r.user == bootstrap_user)
        .map(|r| (r.verb, r.resource))
        .collect();
    assert!(
        by_token
            .iter()
            .all(|(_, resource)| resource == "certificatesigningrequests"),
        "the token only asks for the certificate: {by_token:?}"
    );
    drop(node);
}

#[test]
fn with_rotate_certificates_the_client_certificate_is_renewed_while_the_node_runs() {
    let c = tls_cluster();
    // Issued for 60 s (backdated 5 minutes by the signer, as kube-controller-manager's):
    // the deadline comes within seconds, and over again until one falls in the future.
    c.api
        .auto_approve_and_sign(&[KUBELET_CLIENT_SIGNER], Duration::from_secs(60));
    let node = start_with(options(
        &c,
        &["ticker"],
        &["--rotate-certificates", "true"],
        "",
    ));
    wait("the Node to be Ready", LONG, || {
        c.api.get::<Node>(None, NODE).filter(node_ready)
    });
    c.api.create(&api_pod("before", "ticker")).unwrap();
    wait("the first pod on the node", LONG, || {
        running_here(&node, "before").then_some(())
    });
    let first = current_target(&c.cert_dir).unwrap();
    let watches_before = pod_watches(&c.api);

    // A second CSR, made by the node with its current certificate.
    let rotated = wait("a rotation CSR", LONG, || {
        csrs(&c.api).into_iter().find(|csr| {
            csr.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("csr-"))
                && csr.status.as_ref().is_some_and(|s| s.certificate.is_some())
        })
    });
    assert_eq!(rotated.spec.signer_name, KUBELET_CLIENT_SIGNER);
    assert_eq!(
        rotated.spec.username.as_deref(),
        Some(format!("system:node:{NODE}").as_str()),
        "renewed with the current client certificate, not the bootstrap token"
    );
    assert_eq!(usages(&rotated), ["digital signature", "client auth"]);
    let info = wasmlet_testkit::pki::parse_csr(&rotated.spec.request.0).unwrap();
    assert_eq!(info.common_name, format!("system:node:{NODE}"));
    assert_eq!(info.organizations, ["system:nodes"]);
    wait("kubelet-client-current.pem to move", LONG, || {
        current_target(&c.cert_dir).filter(|t| *t != first)
    });
    let rotated_at = Instant::now();

    // The node keeps working: new requests, and its pod watch, deliver a pod made
    // after the rotation.
    c.api.create(&api_pod("after", "ticker")).unwrap();
    wait("the pod made after the rotation on the node", LONG, || {
        running_here(&node, "after").then_some(())
    });
    wait("its status in the API", LONG, || {
        c.api
            .get::<Pod>(Some("default"), "after")
            .filter(|p| phase(p) == "Running")
    });
    // A status write after the rotation: the Node stays Ready.
    std::thread::sleep(Duration::from_secs(12).saturating_sub(rotated_at.elapsed()));
    let n = c.api.get::<Node>(None, NODE).unwrap();
    assert!(node_ready(&n), "{:?}", n.status);
    assert!(c.api.open_watches() > 0, "the node still watches");
    assert_eq!(
        pod_watches(&c.api),
        watches_before,
        "the pod watch opened before the rotation kept its connection"
    );
    assert!(
        node.log().contains("rotated the certificate"),
        "{}",
        node.log()
    );
    drop(node);
}

#[test]
fn with_server_tls_bootstrap_the_node_api_serves_a_certificate_issued_through_a_csr() {
    let c = tls_cluster();
    // Serving CSRs wait for an approver, as in a stock cluster.
    c.api
        .auto_approve_and_sign(&[KUBELET_CLIENT_SIGNER], Duration::from_secs(3600));
    let node = start_with(options(&c, &[], &[], "serverTLSBootstrap: true\n"));
    let pending = wait("a kubelet-serving CSR", LONG, || {
        csrs(&c.api)
            .into_iter()
            .find(|csr| csr.spec.signer_name == KUBELET_SERVING_SIGNER)
    });
    // Longer than a request's deadline: the node keeps waiting for the same CSR, and
    // meanwhile has no certificate to present: the server ends every handshake with an
    // alert (a self-signed certificate would fail on the client's side instead).
    std::thread::sleep(Duration::from_secs(12));
    let serving_csrs = csrs(&c.api)
        .into_iter()
        .filter(|csr| csr.spec.signer_name == KUBELET_SERVING_SIGNER)
        .count();
    assert_eq!(serving_csrs, 1, "one request while it waits");
    let refused = https_get(
        node.api_port,
        c.api.ca().pem(),
        "/healthz",
        NodeApiAuth::None,
    )
    .expect_err("no certificate is served before one is issued");
    assert!(
        format!("{refused:#}").contains("received fatal alert"),
        "the server refuses the handshake: {refused:#}"
    );
    assert!(
        !c.cert_dir.join("kubelet.crt").exists(),
        "no self-signed pair is made"
    );
    let name = pending.metadata.name.clone().unwrap();
    c.api.approve_csr(&name).unwrap();
    let serving = c.api.sign_csr(&name, Duration::from_secs(3600)).unwrap();
    assert!(
        serving
            .metadata
            .name
            .as_deref()
            .is_some_and(|n| n.starts_with("csr-")),
        "{:?}",
        serving.metadata.name
    );
    assert_eq!(
        serving.spec.username.as_deref(),
        Some(format!("system:node:{NODE}").as_str()),
        "asked with the node's client credentials"
    );
    assert_eq!(usages(&serving), ["digital signature", "server auth"]);
    let info = wasmlet_testkit::pki::parse_csr(&serving.spec.request.0).unwrap();
    assert_eq!(info.common_name, format!("system:node:{NODE}"));
    assert_eq!(info.organizations, ["system:nodes"]);
    assert_eq!(info.dns_names, [NODE]);
    assert_eq!(
        info.ip_addresses,
        ["127.0.0.1".parse::<std::net::IpAddr>().unwrap()]
    );

    // The node API now presents it: a client trusting only the cluster CA completes
    // the handshake (the request itself is unauthenticated: 401).
    let (code, _) = wait("a handshake trusting the cluster CA", LONG, || {
        https_get(
            node.api_port,
            c.api.ca().pem(),
            "/healthz",
            NodeApiAuth::None,
        )
        .ok()
    });
    assert_eq!(code, 401);
    assert!(c.cert_dir.join("kubelet-server-current.pem").exists());
    drop(node);
}

#[test]
fn a_denied_bootstrap_csr_ends_the_node_with_the_reason() {
    let c = tls_cluster();
    let _serial = crate::SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let api = c.api.clone();
    let denier = std::thread::spawn(move || {
        let csr = wait("the bootstrap CSR", LONG, || csrs(&api).into_iter().next());
        api.deny_csr(csr.metadata.name.as_deref().unwrap()).unwrap();
    });
    let started = wasmlet_testkit::node::TestNode::start(
        env!("CARGO_BIN_EXE_wasmlet").as_ref(),
        options(&c, &[], &[], ""),
    );
    denier.join().unwrap();
    let err = match started {
        Ok(_) => panic!("the node started without a certificate"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        err.contains("TLS bootstrap") && err.contains("is denied, reason: KubectlDeny"),
        "{err}"
    );
}
