//! CertificateSigningRequests: the strategy, the built-in approver and signer.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

use super::{WAIT, api_status, tls_client};
use crate::apiserver::{ApiServer, Credentials, KUBELET_CLIENT_SIGNER, KUBELET_SERVING_SIGNER};
use crate::pki;

fn csr(name: &str, request_pem: &str, signer: &str, usages: &[&str]) -> CertificateSigningRequest {
    CertificateSigningRequest {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(request_pem.as_bytes().to_vec()),
            signer_name: signer.into(),
            usages: Some(usages.iter().map(|u| u.to_string()).collect()),
            ..Default::default()
        },
        status: None,
    }
}

fn conditions(csr: &CertificateSigningRequest) -> Vec<(String, String, String)> {
    csr.status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|c| (c.type_, c.status, c.reason.unwrap_or_default()))
        .collect()
}

fn certificate(csr: &CertificateSigningRequest) -> Option<String> {
    let cert = csr.status.as_ref()?.certificate.as_ref()?;
    Some(String::from_utf8(cert.0.clone()).expect("PEM is text"))
}

fn row(kind: &str, status: &str, reason: &str) -> (String, String, String) {
    (kind.into(), status.into(), reason.into())
}

const CLIENT_USAGES: [&str; 3] = ["digital signature", "key encipherment", "client auth"];

#[tokio::test]
async fn bootstrap_csr_is_approved_and_signed() -> anyhow::Result<()> {
    let server = ApiServer::new();
    server.serve_tls(0).await?;
    server.add_bootstrap_token("abcdef.0123456789abcdef")?;
    server.auto_approve_and_sign(&[KUBELET_CLIENT_SIGNER], Duration::from_secs(24 * 3600));
    let (client, _dir) = tls_client(
        &server,
        &Credentials::Token("abcdef.0123456789abcdef".into()),
    )
    .await?;
    let csrs: Api<CertificateSigningRequest> = Api::all(client);
    let (request, key) = pki::generate_csr("system:node:n1", &["system:nodes"], &[])?;
    let mut new = csr(
        "node-csr-1",
        &request,
        KUBELET_CLIENT_SIGNER,
        &CLIENT_USAGES,
    );
    new.spec.expiration_seconds = Some(3600);
    new.spec.username = Some("someone-else".into());
    let mut events = csrs
        .watch(
            &WatchParams::default().fields("metadata.name=node-csr-1"),
            "0",
        )
        .await?
        .boxed();
    let created = csrs.create(&PostParams::default(), &new).await?;
    // The requester is recorded from the request, whatever the body said.
    assert_eq!(
        created.spec.username.as_deref(),
        Some("system:bootstrap:abcdef")
    );
    assert_eq!(
        created.spec.groups,
        Some(vec![
            "system:bootstrappers".to_string(),
            "system:bootstrappers:kubeadm:default-node-token".to_string(),
            "system:authenticated".to_string(),
        ])
    );
    assert!(conditions(&created).is_empty(), "created pending");
    assert!(certificate(&created).is_none());

    // Three changes, as the controllers make them: created, approved, issued.
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let event = tokio::time::timeout(WAIT, events.try_next()).await??;
        match event {
            Some(WatchEvent::Added(c)) => {
                seen.push(("ADDED", conditions(&c).len(), certificate(&c).is_some()))
            }
            Some(WatchEvent::Modified(c)) => {
                seen.push(("MODIFIED", conditions(&c).len(), certificate(&c).is_some()))
            }
            Some(_) => {}
            None => break,
        }
    }
    assert_eq!(
        seen,
        [
            ("ADDED", 0, false),
            ("MODIFIED", 1, false),
            ("MODIFIED", 1, true)
        ]
    );

    let signed = csrs.get("node-csr-1").await?;
    assert_eq!(
        conditions(&signed),
        [row("Approved", "True", "AutoApproved")]
    );
    let approved = &signed
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default()[0];
    assert!(approved.last_update_time.is_some() && approved.last_transition_time.is_some());
    let pem = certificate(&signed).expect("issued");
    let info = server.ca().verify(&pem)?;
    assert_eq!(info.common_name, "system:node:n1");
    assert_eq!(info.organizations, ["system:nodes"]);
    assert_eq!(info.public_key, pki::public_key_of(&key)?);
    assert_eq!(
        info.usages,
        ["digital signature", "key encipherment", "client auth"]
    );
    // Backdated five minutes; the requested hour (shorter than the signer's day) is honoured.
    let lifetime = info.not_after.as_second() - info.not_before.as_second();
    assert_eq!(lifetime, 3600 + 300);
    let ago = jiff::Timestamp::now().as_second() - info.not_before.as_second();
    assert!((299..=302).contains(&ago), "backdated {ago}s");

    // The certificate works as a client certificate of the node.
    let (node_client, _d) = tls_client(
        &server,
        &Credentials::ClientCert {
            cert_pem: pem,
            key_pem: key,
        },
    )
    .await?;
    Api::<CertificateSigningRequest>::all(node_client)
        .list(&Default::default())
        .await?;
    let last = server.requests().pop().expect("recorded");
    assert_eq!(last.user, "system:node:n1");
    Ok(())
}

#[tokio::test]
async fn kubelet_signers_refuse_requests_that_are_not_a_nodes() -> anyhow::Result<()> {
    let server = ApiServer::new();
    server.auto_approve_and_sign(
        &[KUBELET_CLIENT_SIGNER, KUBELET_SERVING_SIGNER],
        Duration::from_secs(3600),
    );
    let csrs: Api<CertificateSigningRequest> = Api::all(server.client("system:node:n1"));
    let pp = PostParams::default();
    let cases = [
        (
            pki::generate_csr("mallory", &["system:nodes"], &[])?.0,
            KUBELET_CLIENT_SIGNER,
            &CLIENT_USAGES[..],
            "subject common name does not begin with system:node:",
        ),
        (
            pki::generate_csr("system:node:n1", &["system:masters"], &[])?.0,
            KUBELET_CLIENT_SIGNER,
            &CLIENT_USAGES[..],
            "subject organization is not system:nodes",
        ),
        (
            pki::generate_csr("system:node:n1", &["system:nodes"], &[])?.0,
            KUBELET_CLIENT_SIGNER,
            &["digital signature", "server auth"][..],
            "usages did not match [client auth digital signature key encipherment]",
        ),
        (
            pki::generate_csr("system:node:n1", &["system:nodes"], &[])?.0,
            KUBELET_SERVING_SIGNER,
            &["digital signature", "server auth"][..],
            "DNS or IP subjectAltName is required",
        ),
    ];
    for (i, (request, signer, usages, why)) in cases.iter().enumerate() {
        let name = format!("bad-{i}");
        csrs.create(&pp, &csr(&name, request, signer, usages))
            .await?;
        let failed = csrs.get(&name).await?;
        assert_eq!(
            conditions(&failed),
            [
                row("Approved", "True", "AutoApproved"),
                row("Failed", "True", "SignerValidationFailure")
            ],
            "{name}"
        );
        let message = failed
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .map(|c| c[1].message.clone());
        assert_eq!(message.flatten().as_deref(), Some(*why), "{name}");
        assert!(certificate(&failed).is_none(), "{name}");
    }

    // A good serving request is signed with its SANs.
    let (request, _) =
        pki::generate_csr("system:node:n1", &["system:nodes"], &["n1", "127.0.0.1"])?;
    csrs.create(
        &pp,
        &csr(
            "serving",
            &request,
            KUBELET_SERVING_SIGNER,
            &["digital signature", "server auth"],
        ),
    )
    .await?;
    let pem = certificate(&csrs.get("serving").await?).expect("issued");
    let info = server.ca().verify(&pem)?;
    assert_eq!(info.sans, ["n1", "127.0.0.1"]);
    assert_eq!(info.usages, ["digital signature", "server auth"]);
    Ok(())
}

#[tokio::test]
async fn manual_approval_signing_and_validation() -> anyhow::Result<()> {
    let server = ApiServer::new();
    let csrs: Api<CertificateSigningRequest> = Api::all(server.client("system:node:n1"));
    let pp = PostParams::default();
    let (request, _) = pki::generate_csr("system:node:n1", &["system:nodes"], &[])?;
    csrs.create(
        &pp,
        &csr("c1", &request, KUBELET_CLIENT_SIGNER, &CLIENT_USAGES),
    )
    .await?;
    let pending = csrs.get("c1").await?;
    assert!(conditions(&pending).is_empty(), "nothing approves it");
    assert_eq!(pending.spec.username.as_deref(), Some("system:node:n1"));
    assert!(
        server.sign_csr("c1", Duration::from_secs(600)).is_err(),
        "not approved yet"
    );

    // The status subresource cannot approve; the approval subresource can.
    let approve = json!({ "status": { "conditions": [{ "type": "Approved", "status": "True", "reason": "Sneaky" }] } });
    let via_status = csrs
        .patch_status("c1", &PatchParams::default(), &Patch::Merge(&approve))
        .await?;
    assert!(conditions(&via_status).is_empty());
    let approved = csrs
        .patch_subresource(
            "approval",
            "c1",
            &PatchParams::default(),
            &Patch::Merge(&approve),
        )
        .await?;
    assert_eq!(conditions(&approved), [row("Approved", "True", "Sneaky")]);
    // Spec is immutable through the main resource.
    let change = json!({ "spec": { "signerName": "example.com/other" }, "metadata": { "labels": { "a": "b" } } });
    let changed = csrs
        .patch("c1", &PatchParams::default(), &Patch::Merge(&change))
        .await?;
    assert_eq!(changed.spec.signer_name, KUBELET_CLIENT_SIGNER);
    assert_eq!(
        changed
            .metadata
            .labels
            .and_then(|l| l.get("a").cloned())
            .as_deref(),
        Some("b")
    );

    let signed = server.sign_csr("c1", Duration::from_secs(3600))?;
    let pem = certificate(&signed).expect("issued");
    server.ca().verify(&pem)?;
    // Once issued, the certificate stays.
    let (other_cert, _) = server
        .ca()
        .issue_client("x", &[], Duration::from_secs(60))?;
    let replace = json!({ "status": { "certificate": crate::apiserver::b64::encode(other_cert.as_bytes()) } });
    let refused = api_status(
        csrs.patch_status("c1", &PatchParams::default(), &Patch::Merge(&replace))
            .await,
    );
    assert_eq!(refused.code, 422);
    assert!(
        refused
            .message
            .contains("updates may not modify existing certificate content"),
        "{}",
        refused.message
    );

    // kubectl certificate approve, then the signer.
    csrs.create(
        &pp,
        &csr("c2", &request, KUBELET_CLIENT_SIGNER, &CLIENT_USAGES),
    )
    .await?;
    let approved = server.approve_csr("c2")?;
    assert_eq!(
        conditions(&approved),
        [row("Approved", "True", "KubectlApprove")]
    );
    server.auto_approve_and_sign(&[KUBELET_CLIENT_SIGNER], Duration::from_secs(3600));
    assert!(
        certificate(&csrs.get("c2").await?).is_some(),
        "waiting CSRs are signed when the signer starts"
    );
    csrs.create(
        &pp,
        &csr("c3", &request, KUBELET_CLIENT_SIGNER, &CLIENT_USAGES),
    )
    .await?;
    let denied = server.deny_csr("c3");
    assert!(
        denied.is_err(),
        "already approved and signed: Approved and Denied exclude each other"
    );

    // Validation of new requests.
    let bad = api_status(
        csrs.create(
            &pp,
            &csr(
                "bad",
                "not a request",
                KUBELET_CLIENT_SIGNER,
                &CLIENT_USAGES,
            ),
        )
        .await,
    );
    assert_eq!(bad.code, 422);
    assert!(
        bad.message
            .contains("spec.request: Invalid value: []byte{0x6e, 0x6f")
            && bad
                .message
                .contains("PEM block type must be CERTIFICATE REQUEST"),
        "{}",
        bad.message
    );
    let mut no_usages = csr("bad", &request, "", &[]);
    no_usages.spec.expiration_seconds = Some(60);
    let bad = api_status(csrs.create(&pp, &no_usages).await);
    assert_eq!(
        bad.message,
        "CertificateSigningRequest.certificates.k8s.io \"bad\" is invalid: [spec.usages: Required value, spec.signerName: Required value, spec.expirationSeconds: Invalid value: 60: may not specify a duration less than 600 seconds (10 minutes)]"
    );
    let bad = api_status(
        csrs.create(
            &pp,
            &csr("bad", &request, KUBELET_CLIENT_SIGNER, &["flying"]),
        )
        .await,
    );
    assert!(
        bad.message
            .contains("spec.usages[0]: Unsupported value: \"flying\""),
        "{}",
        bad.message
    );
    assert!(csrs.get_opt("bad").await?.is_none());
    Ok(())
}
