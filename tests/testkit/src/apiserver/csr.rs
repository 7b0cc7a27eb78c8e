//! `certificates.k8s.io/v1` CertificateSigningRequests: the registry strategy
//! (requester recorded on create, spec immutable, `/approval` changes conditions
//! only, `/status` the certificate and other conditions, the real validation where
//! cheap) and a built-in approver and signer standing in for kube-controller-manager.
//!
//! The signer follows kube-controller-manager's: only approved, not failed CSRs are
//! signed; the kubelet signers refuse a request that is not a node's with a `Failed`
//! condition (reason `SignerValidationFailure`); the certificate is backdated five
//! minutes, lives for the signer's duration or the shorter `spec.expirationSeconds`
//! (at least ten minutes), and carries the subject, SANs and usages of the request.
//! The approver differs: it approves every CSR for the enabled signers (the real
//! `csrapproving` controller recognises node client CSRs first and asks a
//! SubjectAccessReview; nothing approves `kubelet-serving` in a stock cluster).

use std::collections::BTreeSet;
use std::time::Duration;

use jiff::Timestamp;
use serde_json::{Value, json};

use super::auth::UserInfo;
use super::b64;
use super::errors::{ApiError, FieldError};
use super::resources::{self, ResourceType};
use super::store::{Store, Target, format_time, meta_str};
use super::{ApiServer, lock};
use crate::pki::{self, KNOWN_USAGES};

/// Kubelet client certificates for talking to the API server.
pub const KUBELET_CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// Kubelet serving certificates.
pub const KUBELET_SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";
/// Other client certificates for the API server.
pub const APISERVER_CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client";

const BACKDATE_SECS: u64 = 5 * 60;
/// Certificates shorter-lived than this are not backdated at the end.
const SHORT_SECS: u64 = 8 * 3600;
const MIN_SECS: u64 = 10 * 60;

/// The approver's and signer's settings ([`ApiServer::auto_approve_and_sign`]).
#[derive(Clone, Debug)]
pub(crate) struct AutoSigner {
    pub signers: Vec<String>,
    pub validity: Duration,
}

/// Go's `%#v` of a `[]byte`, as field errors print a request.
fn go_bytes(data: &[u8]) -> String {
    let bytes: Vec<String> = data.iter().map(|b| format!("0x{b:x}")).collect();
    format!("[]byte{{{}}}", bytes.join(", "))
}

fn request_bytes(obj: &Value) -> Result<Vec<u8>, ApiError> {
    let text = obj
        .pointer("/spec/request")
        .and_then(Value::as_str)
        .unwrap_or("");
    b64::decode(text).ok_or_else(|| {
        ApiError::bad_request(
            "CertificateSigningRequest in version \"v1\" cannot be handled as a CertificateSigningRequest: illegal base64 data in spec.request",
        )
    })
}

fn usages(obj: &Value) -> Vec<String> {
    obj.pointer("/spec/usages")
        .and_then(Value::as_array)
        .map(|u| {
            u.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn conditions(obj: &Value) -> Vec<Value> {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn has_condition(obj: &Value, kind: &str) -> bool {
    conditions(obj)
        .iter()
        .any(|c| c.get("type").and_then(Value::as_str) == Some(kind))
}

fn certificate(obj: &Value) -> &str {
    obj.pointer("/status/certificate")
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn status_mut(obj: &mut Value) -> &mut serde_json::Map<String, Value> {
    super::strategy::ensure_object(obj, "status")
}

/// `ValidateSignerName`, without the path-segment details.
fn check_signer(signer: &str, errors: &mut Vec<FieldError>) {
    const FIELD: &str = "spec.signerName";
    if signer.is_empty() {
        errors.push(FieldError::required(FIELD));
        return;
    }
    if signer == "kubernetes.io/legacy-unknown" {
        errors.push(FieldError::invalid(
            FIELD,
            &format!("{signer:?}"),
            "the legacy signerName is not allowed via this API version",
        ));
        return;
    }
    let Some((domain, path)) = signer.split_once('/').filter(|(_, p)| !p.contains('/')) else {
        errors.push(FieldError::invalid(
            FIELD,
            &format!("{signer:?}"),
            "must be a fully qualified domain and path of the form 'example.com/signer-name'",
        ));
        return;
    };
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if let Some(bad) = domain.split('.').find(|l| !label_ok(l)) {
        errors.push(FieldError::invalid(
            FIELD,
            &format!("{domain:?}"),
            &format!(
                "validating label {bad:?}: a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character"
            ),
        ));
    } else if !domain.contains('.') {
        errors.push(FieldError::invalid(
            FIELD,
            &format!("{domain:?}"),
            "should be a domain with at least two segments separated by dots",
        ));
    }
    if path.is_empty() {
        errors.push(FieldError::invalid(
            FIELD,
            &format!("{path:?}"),
            "validating path: must not be empty",
        ));
    }
}

/// `validateConditions`.
fn check_conditions(obj: &Value, errors: &mut Vec<FieldError>) {
    let mut seen = BTreeSet::new();
    let (mut approved, mut denied) = (false, false);
    for (i, c) in conditions(obj).iter().enumerate() {
        let kind = c.get("type").and_then(Value::as_str).unwrap_or("");
        let status = c.get("status").and_then(Value::as_str).unwrap_or("");
        let field = |f: &str| format!("status.conditions[{i}].{f}");
        if kind.is_empty() {
            errors.push(FieldError::required(field("type")));
        }
        let true_only = matches!(kind, "Approved" | "Denied" | "Failed");
        let allowed: &[&str] = if true_only {
            &["True"]
        } else {
            &["False", "True", "Unknown"]
        };
        if status.is_empty() {
            errors.push(FieldError::required(field("status")));
        } else if !allowed.contains(&status) {
            errors.push(FieldError::not_supported(field("status"), status, allowed));
        }
        match kind {
            "Approved" => {
                approved = true;
                if denied {
                    errors.push(FieldError::invalid(
                        field("type"),
                        "\"Approved\"",
                        "Approved and Denied conditions are mutually exclusive",
                    ));
                }
            }
            "Denied" => {
                denied = true;
                if approved {
                    errors.push(FieldError::invalid(
                        field("type"),
                        "\"Denied\"",
                        "Approved and Denied conditions are mutually exclusive",
                    ));
                }
            }
            _ => {}
        }
        if !seen.insert(kind.to_string()) {
            errors.push(FieldError::duplicate(field("type"), kind));
        }
    }
}

/// `validateCertificate`: one or more `CERTIFICATE` PEM blocks, nothing else.
fn check_certificate(pem: &[u8]) -> Result<(), String> {
    let mut blocks = 0;
    for block in x509_parser::pem::Pem::iter_from_buffer(pem) {
        let block = block.map_err(|e| e.to_string())?;
        if block.label != "CERTIFICATE" {
            return Err(format!(
                "only CERTIFICATE PEM blocks are allowed, found {:?}",
                block.label
            ));
        }
        block.parse_x509().map_err(|e| e.to_string())?;
        blocks += 1;
    }
    if blocks == 0 {
        return Err("must contain at least one CERTIFICATE PEM block".into());
    }
    Ok(())
}

/// `PrepareForCreate` and create validation: the requester recorded from `user`
/// (`None` for the test's own admin writes), status cleared.
pub(crate) fn prepare_create(
    res: &ResourceType,
    obj: &mut Value,
    user: Option<&UserInfo>,
) -> Result<(), ApiError> {
    if !obj.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    let spec = super::strategy::ensure_object(obj, "spec");
    for key in ["username", "uid", "groups", "extra"] {
        spec.remove(key);
    }
    if let Some(user) = user {
        spec.insert("username".into(), json!(user.username));
        if !user.uid.is_empty() {
            spec.insert("uid".into(), json!(user.uid));
        }
        spec.insert("groups".into(), json!(user.groups));
        if !user.extra.is_empty() {
            spec.insert("extra".into(), json!(user.extra));
        }
    }
    if let Value::Object(map) = obj {
        map.insert("status".into(), json!({}));
    }
    let mut errors = Vec::new();
    let request = request_bytes(obj)?;
    let well_formed = if request.starts_with(b"-----") {
        pki::parse_request(&request)
            .map(|_| ())
            .map_err(|e| e.to_string())
    } else {
        Err("PEM block type must be CERTIFICATE REQUEST".to_string())
    };
    if let Err(why) = well_formed {
        let why = if why.starts_with("no CERTIFICATE REQUEST") {
            "PEM block type must be CERTIFICATE REQUEST".to_string()
        } else {
            why
        };
        errors.push(FieldError::invalid(
            "spec.request",
            &go_bytes(&request),
            &why,
        ));
    }
    let usages = usages(obj);
    if usages.is_empty() {
        errors.push(FieldError::required("spec.usages"));
    }
    let mut seen = BTreeSet::new();
    for (i, usage) in usages.iter().enumerate() {
        if !KNOWN_USAGES.contains(&usage.as_str()) {
            errors.push(FieldError::not_supported(
                format!("spec.usages[{i}]"),
                usage,
                &KNOWN_USAGES,
            ));
        }
        if !seen.insert(usage.clone()) {
            errors.push(FieldError::duplicate(format!("spec.usages[{i}]"), usage));
        }
    }
    let signer = obj
        .pointer("/spec/signerName")
        .and_then(Value::as_str)
        .unwrap_or("");
    check_signer(signer, &mut errors);
    if let Some(seconds) = obj
        .pointer("/spec/expirationSeconds")
        .and_then(Value::as_i64)
        && seconds < 600
    {
        errors.push(FieldError::invalid(
            "spec.expirationSeconds",
            &seconds.to_string(),
            "may not specify a duration less than 600 seconds (10 minutes)",
        ));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid_fields(
            res.group,
            res.kind,
            meta_str(obj, "name"),
            &errors,
        ))
    }
}

/// `populateConditionTimestamps`: missing `lastUpdateTime` is now; a missing
/// `lastTransitionTime` is the old one of the same type and status, else now.
fn populate_timestamps(new: &mut Value, old: &Value) {
    let now = format_time(Timestamp::now());
    let old_conditions = conditions(old);
    let Some(Value::Array(list)) = new.pointer_mut("/status/conditions") else {
        return;
    };
    for c in list.iter_mut().filter_map(Value::as_object_mut) {
        let status = c.entry("status").or_insert_with(|| json!(""));
        if status.as_str() == Some("") {
            // v1 defaulting: a condition without a status is True.
            *status = json!("True");
        }
        if c.get("lastUpdateTime").is_none_or(Value::is_null) {
            c.insert("lastUpdateTime".into(), json!(now));
        }
        if c.get("lastTransitionTime").is_none_or(Value::is_null) {
            let same = old_conditions.iter().find(|o| {
                o.get("type") == c.get("type")
                    && o.get("status") == c.get("status")
                    && o.get("lastTransitionTime").is_some_and(|t| !t.is_null())
            });
            let at = same
                .and_then(|o| o.get("lastTransitionTime").cloned())
                .unwrap_or_else(|| json!(now));
            c.insert("lastTransitionTime".into(), at);
        }
    }
}

/// `PrepareForUpdate` and update validation of the main resource (`""`),
/// `approval` or `status`.
pub(crate) fn prepare_update(
    res: &ResourceType,
    subresource: &str,
    old: &Value,
    new: &mut Value,
) -> Result<(), ApiError> {
    if !new.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    let set = |obj: &mut Value, key: &str, value: Option<Value>| {
        if let Value::Object(map) = obj {
            match value {
                Some(v) => map.insert(key.to_string(), v),
                None => map.remove(key),
            };
        }
    };
    set(new, "spec", old.get("spec").cloned());
    match subresource {
        "approval" => {
            let cert = old.pointer("/status/certificate").cloned();
            let status = status_mut(new);
            match cert {
                Some(c) => status.insert("certificate".into(), c),
                None => status.remove("certificate"),
            };
        }
        "status" => {
            // Approval conditions are the approval subresource's: keep the old ones.
            let kept: Vec<Value> = conditions(old)
                .into_iter()
                .filter(|c| matches!(c["type"].as_str(), Some("Approved" | "Denied")))
                .collect();
            let mut others: Vec<Value> = conditions(new)
                .into_iter()
                .filter(|c| !matches!(c["type"].as_str(), Some("Approved" | "Denied")))
                .collect();
            let mut all = kept;
            all.append(&mut others);
            status_mut(new).insert("conditions".into(), json!(all));
        }
        _ => set(new, "status", old.get("status").cloned()),
    }
    populate_timestamps(new, old);
    let mut errors = Vec::new();
    check_conditions(new, &mut errors);
    for kind in ["Approved", "Denied", "Failed"] {
        let count = |obj: &Value| {
            conditions(obj)
                .iter()
                .filter(|c| c["type"].as_str() == Some(kind))
                .count()
        };
        if count(new) < count(old) {
            errors.push(FieldError::forbidden(
                "status.conditions",
                &format!("updates may not remove a condition of type {kind:?}"),
            ));
        }
    }
    let (new_cert, old_cert) = (certificate(new), certificate(old));
    if new_cert != old_cert {
        if !old_cert.is_empty() {
            errors.push(FieldError::forbidden(
                "status.certificate",
                "updates may not modify existing certificate content",
            ));
        } else {
            let checked = b64::decode(new_cert)
                .ok_or_else(|| "illegal base64 data".to_string())
                .and_then(|pem| check_certificate(&pem));
            if let Err(why) = checked {
                errors.push(FieldError::invalid(
                    "status.certificate",
                    "\"<certificate data>\"",
                    &why,
                ));
            }
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid_fields(
            res.group,
            res.kind,
            meta_str(old, "name"),
            &errors,
        ))
    }
}

/// Writes `update` of the CSR through the strategy of `subresource`.
fn write(
    store: &mut Store,
    name: &str,
    subresource: &str,
    update: impl FnOnce(&mut Value),
) -> Result<Value, ApiError> {
    let res = resources::csrs();
    store.update(res, "", name, Target::Whole, |old| {
        let mut new = old.clone();
        update(&mut new);
        prepare_update(res, subresource, old, &mut new)?;
        Ok(new)
    })
}

fn append_condition(obj: &mut Value, kind: &str, reason: &str, message: &str) {
    let condition = json!({ "type": kind, "status": "True", "reason": reason, "message": message });
    let status = status_mut(obj);
    match status.get_mut("conditions") {
        Some(Value::Array(list)) => list.push(condition),
        _ => {
            status.insert("conditions".into(), json!([condition]));
        }
    }
}

/// Adds a `kind` (`Approved`/`Denied`) condition through `/approval`.
pub(crate) fn decide(
    server: &ApiServer,
    name: &str,
    kind: &str,
    reason: &str,
    message: &str,
) -> Result<Value, ApiError> {
    let mut store = lock(&server.inner.store);
    write(&mut store, name, "approval", |csr| {
        append_condition(csr, kind, reason, message)
    })
}

/// Why the built-in signer for `signer` refuses the request (`Err`), or `Ok(false)`
/// when it has no rules for the signer (the test's own signers).
fn signer_check(signer: &str, info: &pki::CertInfo, usages: &[String]) -> Result<bool, String> {
    let set: BTreeSet<&str> = usages.iter().map(String::as_str).collect();
    let exactly = |want: &[&str]| set == want.iter().copied().collect();
    match signer {
        KUBELET_CLIENT_SIGNER => {
            if info.organizations != ["system:nodes"] {
                return Err("subject organization is not system:nodes".into());
            }
            if !info.dns_names.is_empty() {
                return Err("DNS subjectAltNames are not allowed".into());
            }
            if !info.emails.is_empty() {
                return Err("Email subjectAltNames are not allowed".into());
            }
            if !info.ip_addresses.is_empty() {
                return Err("IP subjectAltNames are not allowed".into());
            }
            if !info.uris.is_empty() {
                return Err("URI subjectAltNames are not allowed".into());
            }
            if !info.common_name.starts_with("system:node:") {
                return Err("subject common name does not begin with system:node:".into());
            }
            if !exactly(&["client auth", "digital signature", "key encipherment"])
                && !exactly(&["client auth", "digital signature"])
            {
                return Err(
                    "usages did not match [client auth digital signature key encipherment]".into(),
                );
            }
            Ok(true)
        }
        KUBELET_SERVING_SIGNER => {
            if info.organizations != ["system:nodes"] {
                return Err("subject organization is not system:nodes".into());
            }
            if info.dns_names.is_empty() && info.ip_addresses.is_empty() {
                return Err("DNS or IP subjectAltName is required".into());
            }
            if !info.emails.is_empty() {
                return Err("Email subjectAltNames are not allowed".into());
            }
            if !info.uris.is_empty() {
                return Err("URI subjectAltNames are not allowed".into());
            }
            if !exactly(&["digital signature", "key encipherment", "server auth"])
                && !exactly(&["digital signature", "server auth"])
            {
                return Err(
                    "usages did not match [digital signature key encipherment server auth]".into(),
                );
            }
            if !info.common_name.starts_with("system:node:") {
                return Err("subject common name does not begin with system:node:".into());
            }
            Ok(true)
        }
        APISERVER_CLIENT_SIGNER => {
            for usage in usages {
                if !matches!(
                    usage.as_str(),
                    "digital signature" | "key encipherment" | "client auth"
                ) {
                    return Err(format!("invalid usage for client certificate: {usage}"));
                }
            }
            if !set.contains("client auth") {
                return Err("missing required usage for client certificate: client auth".into());
            }
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// What [`sign`] did.
pub(crate) enum Signed {
    Issued(Value),
    /// The signer refused the request (why) and set a `Failed` condition.
    Failed(String),
}

/// The signer: issues `status.certificate` for an approved CSR, or sets `Failed`.
/// `max` is the signer's duration (`--cluster-signing-duration`).
pub(crate) fn sign(
    store: &mut Store,
    ca: &pki::Ca,
    name: &str,
    max: Duration,
) -> Result<Signed, ApiError> {
    let res = resources::csrs();
    let csr = store.get(res, "", name)?;
    if !has_condition(&csr, "Approved") {
        return Err(ApiError::bad_request(format!(
            "certificatesigningrequest {name:?} is not approved"
        )));
    }
    if has_condition(&csr, "Failed") || has_condition(&csr, "Denied") {
        return Err(ApiError::bad_request(format!(
            "certificatesigningrequest {name:?} is denied or failed"
        )));
    }
    if !certificate(&csr).is_empty() {
        return Ok(Signed::Issued(csr));
    }
    let request = request_bytes(&csr)?;
    let parsed = pki::parse_request(&request)
        .map_err(|e| ApiError::bad_request(format!("unable to parse csr {name:?}: {e}")))?;
    let usages = usages(&csr);
    let signer = csr
        .pointer("/spec/signerName")
        .and_then(Value::as_str)
        .unwrap_or("");
    if let Err(why) = signer_check(signer, &parsed.info, &usages) {
        write(store, name, "status", |csr| {
            append_condition(csr, "Failed", "SignerValidationFailure", &why)
        })?;
        return Ok(Signed::Failed(why));
    }
    let mut ttl = max.as_secs();
    if let Some(requested) = csr
        .pointer("/spec/expirationSeconds")
        .and_then(Value::as_u64)
    {
        ttl = if requested > ttl {
            ttl
        } else {
            requested.max(MIN_SECS)
        };
    }
    let now = pki::unix_now();
    let not_before = now.saturating_sub(BACKDATE_SECS);
    let not_after = if ttl < SHORT_SECS {
        now + ttl
    } else {
        now + ttl - BACKDATE_SECS
    };
    let usage_refs: Vec<&str> = usages.iter().map(String::as_str).collect();
    let cert = ca
        .sign_parsed(&parsed, &usage_refs, not_before, not_after)
        .map_err(|e| ApiError::internal(&format!("error auto signing csr: {e}")))?;
    let issued = write(store, name, "status", |csr| {
        status_mut(csr).insert("certificate".into(), json!(b64::encode(cert.as_bytes())));
    })?;
    Ok(Signed::Issued(issued))
}

/// The controllers' reaction to a change of CSR `name`: with auto-signing on and
/// the CSR's signer enabled, approve it if undecided, then sign it.
pub(crate) fn reconcile(server: &ApiServer, name: &str) {
    let Some(auto) = lock(&server.inner.signer).clone() else {
        return;
    };
    let mut store = lock(&server.inner.store);
    let Ok(csr) = store.get(resources::csrs(), "", name) else {
        return;
    };
    let signer = csr
        .pointer("/spec/signerName")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if !auto.signers.contains(&signer) || !certificate(&csr).is_empty() {
        return;
    }
    if !has_condition(&csr, "Approved") && !has_condition(&csr, "Denied") {
        let message = match signer.as_str() {
            KUBELET_CLIENT_SIGNER => {
                "Auto approving kubelet client certificate after SubjectAccessReview."
            }
            KUBELET_SERVING_SIGNER => "Auto approving kubelet serving certificate (test approver).",
            _ => "Auto approved by the test approver.",
        };
        let approved = write(&mut store, name, "approval", |csr| {
            append_condition(csr, "Approved", "AutoApproved", message)
        });
        if let Err(err) = approved {
            tracing::warn!(csr = name, "test approver: {err}");
            return;
        }
    }
    let approved = store
        .get(resources::csrs(), "", name)
        .is_ok_and(|c| has_condition(&c, "Approved") && !has_condition(&c, "Failed"));
    if approved && let Err(err) = sign(&mut store, &server.inner.ca, name, auto.validity) {
        tracing::warn!(csr = name, "test signer: {err}");
    }
}
