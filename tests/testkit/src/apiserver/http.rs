//! The HTTP API: request parsing (as the apiserver's `RequestInfo`), dispatch to
//! the store, responses and `Status` errors, and request recording.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::header::{ACCEPT, CONTENT_TYPE};
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};

use super::auth::{self, UserInfo};
use super::errors::ApiError;
use super::patch::{self, PatchType};
use super::resources::{self, ResourceType};
use super::selectors::{FieldSelector, LabelSelector};
use super::store::{DeleteOptions, Deletion, Filter, Target, WatchStart, format_time, meta_str};
use super::watch::{self, WatchOptions};
use super::{ApiServer, Request, b64, csr, lock, proxy, strategy};

/// The largest request body accepted.
const MAX_BODY: usize = 16 << 20;

/// A watch without `timeoutSeconds` (or with 0) ends after this long.
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

/// The identity of an in-process client's requests (TCP requests authenticate).
#[derive(Clone, Debug)]
pub(crate) struct AuthUser(pub Arc<str>);

/// What a request addresses, as the apiserver's authorization sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct RequestInfo {
    pub resource_request: bool,
    pub verb: String,
    pub group: String,
    pub version: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    /// More path segments than `resource/name/subresource`.
    pub extra_segments: bool,
}

impl RequestInfo {
    pub(crate) fn parse(
        method: &Method,
        path: &str,
        query: &HashMap<String, String>,
    ) -> RequestInfo {
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let (group, version, mut rest) = match segments.as_slice() {
            ["api", version, rest @ ..] => ("", *version, rest),
            ["apis", group, version, rest @ ..] => (*group, *version, rest),
            _ => ("", "", &[] as &[&str]),
        };
        if rest.is_empty() {
            return RequestInfo {
                verb: method.as_str().to_ascii_lowercase(),
                ..RequestInfo::default()
            };
        }
        let mut watch = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
        if rest[0] == "watch" {
            watch = true;
            rest = &rest[1..];
        }
        let mut namespace = "";
        if rest.first() == Some(&"namespaces") && rest.len() > 1 {
            namespace = rest[1];
            // `namespaces/{name}/status` and `/finalize` address the namespace itself.
            if rest.len() > 2 && !matches!(rest[2], "status" | "finalize") {
                rest = &rest[2..];
            }
        }
        let resource = rest.first().copied().unwrap_or("");
        let name = rest.get(1).copied().unwrap_or("");
        let subresource = rest.get(2).copied().unwrap_or("");
        let named = !name.is_empty();
        let verb = match *method {
            Method::GET | Method::HEAD if watch => "watch",
            Method::GET | Method::HEAD if named => "get",
            Method::GET | Method::HEAD => "list",
            Method::POST => "create",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE if named => "delete",
            Method::DELETE => "deletecollection",
            _ => "",
        };
        RequestInfo {
            resource_request: true,
            verb: if verb.is_empty() {
                method.as_str().to_ascii_lowercase()
            } else {
                verb.to_string()
            },
            group: group.to_string(),
            version: version.to_string(),
            resource: resource.to_string(),
            subresource: subresource.to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
            extra_segments: rest.len() > 3,
        }
    }
}

/// Answers every request: authentication, faults, then the API; every request
/// is recorded.
pub(crate) async fn handle(
    State(server): State<ApiServer>,
    req: axum::extract::Request,
) -> Response {
    let authenticated = auth::authenticate(&server, &req);
    let content_type = header(&req, CONTENT_TYPE);
    let accept = header(&req, ACCEPT);
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = parse_query(req.uri());
    let info = RequestInfo::parse(&method, &path, query.as_ref().unwrap_or(&HashMap::new()));
    let selector = |key: &str| {
        query
            .as_ref()
            .ok()
            .and_then(|q| q.get(key).cloned())
            .unwrap_or_default()
    };
    let (field_selector, label_selector) = (selector("fieldSelector"), selector("labelSelector"));
    let (user, groups) = match &authenticated {
        Ok(user) => (user.username.clone(), user.groups.clone()),
        Err(_) => (String::new(), Vec::new()),
    };
    let faults = server.faults();
    if let Some(delay) = faults.delay() {
        tokio::time::sleep(delay).await;
    }
    let injected = if info.verb == "watch" {
        None
    } else {
        faults.take_failure()
    };
    let response = if faults.is_down() {
        error_response(&ApiError::unavailable())
    } else if let Err(err) = &authenticated {
        error_response(err)
    } else if let Some(code) = injected {
        error_response(&ApiError::injected(code))
    } else {
        let user = authenticated.unwrap_or_else(|_| UserInfo::anonymous());
        let kubelet_bound = info.resource_request && info.group.is_empty() && info.version == "v1";
        let result = match query {
            Ok(_) if kubelet_bound && info.resource == "nodes" && info.subresource == "proxy" => {
                proxy::node_proxy(&server, &info.name, req).await
            }
            Ok(_)
                if kubelet_bound
                    && info.resource == "pods"
                    && matches!(info.subresource.as_str(), "exec" | "attach" | "portforward")
                    && !info.extra_segments
                    && !info.namespace.is_empty() =>
            {
                proxy::pod_stream(&server, &info.namespace, &info.name, &info.subresource, req)
                    .await
            }
            Ok(query)
                if kubelet_bound
                    && info.resource == "pods"
                    && info.subresource == "log"
                    && !info.extra_segments
                    && !info.namespace.is_empty() =>
            {
                if info.verb == "get" {
                    proxy::pod_log(&server, &info.namespace, &info.name, &query).await
                } else {
                    Err(ApiError::method_not_allowed(format!(
                        "{} is not supported on pods/log",
                        info.verb
                    )))
                }
            }
            Ok(query) if info.resource_request => {
                let call = Call {
                    server: &server,
                    info: &info,
                    content_type: &content_type,
                    accept: &accept,
                    user: &user,
                };
                call.resource(&query, req.into_body()).await
            }
            Ok(_) => non_resource(&path),
            Err(err) => Err(err),
        };
        result.unwrap_or_else(|err| error_response(&err))
    };
    server.record(Request {
        user,
        groups,
        verb: info.verb.clone(),
        api_group: info.group.clone(),
        resource: info.resource.clone(),
        subresource: info.subresource.clone(),
        namespace: info.namespace.clone(),
        name: info.name.clone(),
        field_selector,
        label_selector,
        content_type,
        status: response.status().as_u16(),
        path,
    });
    response
}

fn header(req: &axum::extract::Request, name: axum::http::HeaderName) -> String {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

fn parse_query(uri: &Uri) -> Result<HashMap<String, String>, ApiError> {
    Query::<HashMap<String, String>>::try_from_uri(uri)
        .map(|Query(q)| q)
        .map_err(|e| ApiError::bad_request(format!("invalid query: {e}")))
}

/// A JSON response.
pub(crate) fn json_response(code: u16, body: Value) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, Json(body)).into_response()
}

/// A `Status` failure response.
pub(crate) fn error_response(err: &ApiError) -> Response {
    json_response(err.code, err.to_status())
}

/// Discovery, version and health endpoints.
fn non_resource(path: &str) -> Result<Response, ApiError> {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let body = match segments.as_slice() {
        ["healthz" | "livez" | "readyz", ..] => return Ok((StatusCode::OK, "ok").into_response()),
        ["version"] => json!({
            "major": "1",
            "minor": "33",
            "gitVersion": "v1.33.0",
            "gitCommit": "60a317eadfcb839692a68eab88b2096f4d708f4f",
            "gitTreeState": "clean",
            "buildDate": "2025-04-23T13:07:52Z",
            "goVersion": "go1.24.2",
            "compiler": "gc",
            "platform": "linux/amd64",
        }),
        ["api"] => json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{ "clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1" }],
        }),
        ["apis"] => {
            let groups: Vec<Value> = resources::groups()
                .into_iter()
                .map(|group| {
                    let version = json!({ "groupVersion": format!("{group}/v1"), "version": "v1" });
                    json!({ "name": group, "versions": [version.clone()], "preferredVersion": version })
                })
                .collect();
            json!({ "kind": "APIGroupList", "apiVersion": "v1", "groups": groups })
        }
        ["api", version] => resource_list("", version),
        ["apis", group, version] => resource_list(group, version),
        _ => return Err(ApiError::no_such_resource()),
    };
    if body
        .get("resources")
        .and_then(Value::as_array)
        .is_some_and(Vec::is_empty)
    {
        return Err(ApiError::no_such_resource());
    }
    Ok(json_response(200, body))
}

fn resource_list(group: &str, version: &str) -> Value {
    let mut list = Vec::new();
    for res in resources::RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        let verbs: &[&str] = if res.create_only {
            &["create"]
        } else {
            &[
                "create",
                "delete",
                "deletecollection",
                "get",
                "list",
                "patch",
                "update",
                "watch",
            ]
        };
        list.push(json!({
            "name": res.plural,
            "singularName": res.kind.to_ascii_lowercase(),
            "namespaced": res.namespaced,
            "kind": res.kind,
            "verbs": verbs,
        }));
        for sub in res.subresources {
            let (kind, verbs): (&str, &[&str]) = match *sub {
                "token" => ("TokenRequest", &["create"]),
                "log" => ("Pod", &["get"]),
                "proxy" => (
                    "NodeProxyOptions",
                    &["create", "delete", "get", "patch", "update"],
                ),
                _ => (res.kind, &["get", "patch", "update"]),
            };
            list.push(json!({
                "name": format!("{}/{sub}", res.plural),
                "singularName": "",
                "namespaced": res.namespaced,
                "kind": kind,
                "verbs": verbs,
            }));
        }
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    json!({ "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": list })
}

/// Full objects, or `PartialObjectMetadata` when the client asks for metadata only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    Full,
    Metadata,
}

impl Shape {
    fn from_accept(accept: &str) -> Shape {
        if accept.contains("as=PartialObjectMetadata") {
            Shape::Metadata
        } else {
            Shape::Full
        }
    }

    fn projector(self) -> fn(Value) -> Value {
        match self {
            Shape::Full => |obj| obj,
            Shape::Metadata => |obj| {
                json!({
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
                })
            },
        }
    }

    fn list(self, res: &ResourceType, items: Vec<Value>, rv: u64) -> Value {
        let (kind, api_version) = match self {
            Shape::Full => (format!("{}List", res.kind), res.api_version()),
            Shape::Metadata => (
                "PartialObjectMetadataList".to_string(),
                "meta.k8s.io/v1".to_string(),
            ),
        };
        let project = self.projector();
        let items: Vec<Value> = items.into_iter().map(project).collect();
        json!({
            "kind": kind,
            "apiVersion": api_version,
            "metadata": { "resourceVersion": rv.to_string() },
            "items": items,
        })
    }
}

/// One resource request being served.
struct Call<'a> {
    server: &'a ApiServer,
    info: &'a RequestInfo,
    content_type: &'a str,
    accept: &'a str,
    user: &'a UserInfo,
}

impl Call<'_> {
    async fn resource(
        &self,
        query: &HashMap<String, String>,
        body: Body,
    ) -> Result<Response, ApiError> {
        let info = self.info;
        let res = resources::find(&info.group, &info.version, &info.resource)
            .ok_or_else(ApiError::no_such_resource)?;
        let is_namespace = res.is("", "namespaces");
        let bad_scope = info.extra_segments
            || (!res.namespaced && !info.namespace.is_empty() && !is_namespace)
            || (res.namespaced && info.namespace.is_empty() && !info.name.is_empty());
        let bad_subresource =
            !info.subresource.is_empty() && !res.subresources.contains(&info.subresource.as_str());
        if bad_scope || bad_subresource {
            return Err(ApiError::no_such_resource());
        }
        let namespace = if res.namespaced {
            info.namespace.as_str()
        } else {
            ""
        };
        if res.create_only {
            if info.verb != "create" || !info.name.is_empty() || !info.subresource.is_empty() {
                return Err(ApiError::method_not_allowed(format!(
                    "{} is not supported on {}",
                    info.verb,
                    res.qualified()
                )));
            }
            let review = read_json(self.content_type, body, false).await?;
            return if res.plural == "tokenreviews" {
                auth::token_review(self.server, review)
            } else {
                auth::subject_access_review(self.server, res, review)
            };
        }
        if res.id() == resources::csrs().id()
            && matches!(info.verb.as_str(), "create" | "update" | "patch")
            && (info.verb == "create") == info.name.is_empty()
        {
            return self.csr_write(res, body).await;
        }
        let shape = Shape::from_accept(self.accept);
        let store = &self.server.inner.store;
        let name = info.name.as_str();
        let target = match info.subresource.as_str() {
            "status" => Target::Status,
            _ => Target::Main,
        };
        match info.verb.as_str() {
            "get" => {
                let obj = lock(store).get(res, namespace, name)?;
                Ok(json_response(200, shape.projector()(obj)))
            }
            "list" => {
                let filter = filter(query, namespace, "")?;
                let (items, rv) = lock(store).list(res, &filter);
                Ok(json_response(200, shape.list(res, items, rv)))
            }
            "watch" => self.watch(res, query, namespace, shape),
            "create" if info.subresource == "token" => {
                let request = read_json(self.content_type, body, true).await?;
                token_request(self.server, res, namespace, name, request)
            }
            "create" if info.subresource.is_empty() && name.is_empty() => {
                let obj = read_json(self.content_type, body, false).await?;
                let created = lock(store).create(res, namespace, obj)?;
                Ok(json_response(201, shape.projector()(created)))
            }
            "update" if !name.is_empty() => {
                let obj = read_json(self.content_type, body, false).await?;
                let updated = lock(store).update(res, namespace, name, target, |_| Ok(obj))?;
                Ok(json_response(200, shape.projector()(updated)))
            }
            "patch" if !name.is_empty() => {
                let patch_type = PatchType::from_content_type(self.content_type)?;
                let bytes = read_bytes(body).await?;
                let patched = lock(store).update(res, namespace, name, target, |old| {
                    let mut new = old.clone();
                    patch::apply(res.kind, patch_type, &mut new, &bytes)?;
                    Ok(new)
                })?;
                Ok(json_response(200, shape.projector()(patched)))
            }
            "delete" if info.subresource.is_empty() => {
                let options = delete_options(query, body).await?;
                let deletion = lock(store).delete(res, namespace, name, &options)?;
                Ok(match deletion {
                    Deletion::Removed(obj) if !strategy::returns_deleted_object(res) => {
                        json_response(200, success_status(res, &obj))
                    }
                    Deletion::Removed(obj) | Deletion::Pending(obj) => {
                        json_response(200, shape.projector()(obj))
                    }
                })
            }
            "deletecollection" if info.subresource.is_empty() => {
                let options = delete_options(query, body).await?;
                let filter = filter(query, namespace, "")?;
                let mut store = lock(store);
                let (matching, _) = store.list(res, &filter);
                let mut deleted = Vec::new();
                for obj in matching {
                    let (ns, name) = (meta_str(&obj, "namespace"), meta_str(&obj, "name"));
                    match store.delete(res, ns, name, &options)? {
                        Deletion::Removed(obj) | Deletion::Pending(obj) => deleted.push(obj),
                    }
                }
                let rv = store.rv();
                Ok(json_response(200, shape.list(res, deleted, rv)))
            }
            verb => Err(ApiError::method_not_allowed(format!(
                "{verb} is not supported on {}{}",
                res.qualified(),
                if info.subresource.is_empty() {
                    String::new()
                } else {
                    format!("/{}", info.subresource)
                }
            ))),
        }
    }

    /// CSR writes go through the CSR strategy and wake the approver and signer.
    async fn csr_write(
        &self,
        res: &'static ResourceType,
        body: Body,
    ) -> Result<Response, ApiError> {
        let info = self.info;
        let shape = Shape::from_accept(self.accept);
        let store = &self.server.inner.store;
        let written = match info.verb.as_str() {
            "create" => {
                let mut obj = read_json(self.content_type, body, false).await?;
                csr::prepare_create(res, &mut obj, Some(self.user))?;
                lock(store).create(res, "", obj)?
            }
            verb => {
                let (replacement, patch) = if verb == "update" {
                    (Some(read_json(self.content_type, body, false).await?), None)
                } else {
                    let patch_type = PatchType::from_content_type(self.content_type)?;
                    (None, Some((patch_type, read_bytes(body).await?)))
                };
                let sub = info.subresource.as_str();
                lock(store).update(res, "", &info.name, Target::Whole, |old| {
                    let mut new = match (&replacement, &patch) {
                        (Some(obj), _) => obj.clone(),
                        (None, Some((patch_type, bytes))) => {
                            let mut new = old.clone();
                            patch::apply(res.kind, *patch_type, &mut new, bytes)?;
                            new
                        }
                        (None, None) => old.clone(),
                    };
                    csr::prepare_update(res, sub, old, &mut new)?;
                    Ok(new)
                })?
            }
        };
        let code = if info.verb == "create" { 201 } else { 200 };
        csr::reconcile(self.server, meta_str(&written, "name"));
        Ok(json_response(code, shape.projector()(written)))
    }

    fn watch(
        &self,
        res: &'static ResourceType,
        query: &HashMap<String, String>,
        namespace: &str,
        shape: Shape,
    ) -> Result<Response, ApiError> {
        let filter = filter(query, namespace, &self.info.name)?;
        let flag = |key: &str| query.get(key).map(String::as_str);
        let send_initial_events = flag("sendInitialEvents") == Some("true");
        let start =
            match flag("resourceVersion") {
                None | Some("" | "0") => WatchStart::Now,
                Some(rv) => WatchStart::After(rv.parse().map_err(|_| {
                    ApiError::bad_request(format!("invalid resourceVersion \"{rv}\""))
                })?),
            };
        let start = if send_initial_events {
            WatchStart::Now
        } else {
            start
        };
        let timeout = match flag("timeoutSeconds") {
            None | Some("" | "0") => DEFAULT_WATCH_TIMEOUT,
            Some(secs) => Duration::from_secs(secs.parse().map_err(|_| {
                ApiError::bad_request(format!("invalid timeoutSeconds \"{secs}\""))
            })?),
        };
        let options = WatchOptions {
            bookmarks: matches!(flag("allowWatchBookmarks"), Some("true" | "1")),
            initial_events_end: send_initial_events,
            timeout,
        };
        let store = self.server.inner.store.clone();
        let setup = lock(&store).watch(res, &filter, start);
        let body = match setup {
            Ok(setup) => watch::body(res, setup, filter, store, &options, shape.projector()),
            // The real apiserver answers 200 and an ERROR event; kube relists on it.
            Err(err) if err.code == 410 => watch::error_body(&err),
            Err(err) => return Err(err),
        };
        Ok((StatusCode::OK, [(CONTENT_TYPE, "application/json")], body).into_response())
    }
}

fn filter(
    query: &HashMap<String, String>,
    namespace: &str,
    name: &str,
) -> Result<Filter, ApiError> {
    let text = |key: &str| query.get(key).map(String::as_str).unwrap_or("");
    Ok(Filter {
        namespace: (!namespace.is_empty()).then(|| namespace.to_string()),
        name: (!name.is_empty()).then(|| name.to_string()),
        fields: FieldSelector::parse(text("fieldSelector")).map_err(ApiError::bad_request)?,
        labels: LabelSelector::parse(text("labelSelector")).map_err(ApiError::bad_request)?,
    })
}

async fn read_bytes(body: Body) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|e| ApiError::bad_request(format!("reading the request body: {e}")))
}

/// A JSON request body; an empty one is `{}` when `empty_ok`.
async fn read_json(content_type: &str, body: Body, empty_ok: bool) -> Result<Value, ApiError> {
    let media = content_type.split(';').next().unwrap_or("").trim();
    if !media.is_empty() && media != "application/json" && media != "*/*" {
        return Err(ApiError::unsupported_media_type(media));
    }
    let bytes = read_bytes(body).await?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return if empty_ok {
            Ok(json!({}))
        } else {
            Err(ApiError::bad_request("the request body is empty"))
        };
    }
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))
}

/// `DeleteOptions` from the body (kube sends one) or the query.
async fn delete_options(
    query: &HashMap<String, String>,
    body: Body,
) -> Result<DeleteOptions, ApiError> {
    let mut options = DeleteOptions::default();
    if let Some(grace) = query.get("gracePeriodSeconds") {
        let grace = grace.parse().map_err(|_| {
            ApiError::bad_request(format!("invalid gracePeriodSeconds \"{grace}\""))
        })?;
        options.grace_seconds = Some(grace);
    }
    let bytes = read_bytes(body).await?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(options);
    }
    let body: Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?;
    match body.get("gracePeriodSeconds") {
        None | Some(Value::Null) => {}
        Some(grace) => {
            let grace = grace
                .as_i64()
                .ok_or_else(|| ApiError::bad_request("gracePeriodSeconds must be an integer"))?;
            options.grace_seconds = Some(grace);
        }
    }
    let precondition = |key: &str| {
        body.get("preconditions")
            .and_then(|p| p.get(key))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    options.uid = precondition("uid");
    options.resource_version = precondition("resourceVersion");
    Ok(options)
}

/// The `Status` a DELETE of a non-pod answers with.
fn success_status(res: &ResourceType, obj: &Value) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {
            "name": meta_str(obj, "name"),
            "group": res.group,
            "kind": res.plural,
            "uid": meta_str(obj, "uid"),
        },
    })
}

/// `POST serviceaccounts/{name}/token`: a JWT-shaped token bound to the account.
fn token_request(
    server: &ApiServer,
    res: &'static ResourceType,
    namespace: &str,
    name: &str,
    mut request: Value,
) -> Result<Response, ApiError> {
    let mut store = lock(&server.inner.store);
    let account = store.get(res, namespace, name)?;
    if !request.is_object() {
        return Err(ApiError::bad_request(
            "a TokenRequest must be a JSON object",
        ));
    }
    let seconds = request
        .pointer("/spec/expirationSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(3600);
    if seconds < 600 {
        return Err(ApiError {
            code: 422,
            reason: "Invalid",
            message: format!(
                "TokenRequest.authentication.k8s.io \"{name}\" is invalid: spec.expirationSeconds: Invalid value: {seconds}: may not specify a duration less than 10 minutes"
            ),
            details: None,
        });
    }
    let audiences = match request.pointer("/spec/audiences") {
        Some(Value::Array(a)) if !a.is_empty() => Value::Array(a.clone()),
        _ => json!(["https://kubernetes.default.svc.cluster.local"]),
    };
    let now = Timestamp::now();
    let expires = now
        .checked_add(SignedDuration::from_secs(seconds))
        .unwrap_or(now);
    let mut bound = json!({ "namespace": namespace, "serviceaccount": { "name": name, "uid": meta_str(&account, "uid") } });
    if let Some(obj) = request
        .pointer("/spec/boundObjectRef")
        .filter(|o| o.is_object())
    {
        let key = obj
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_ascii_lowercase();
        if !key.is_empty() {
            bound[key] = json!({ "name": obj.get("name"), "uid": obj.get("uid") });
        }
    }
    let claims = json!({
        "aud": audiences,
        "exp": expires.as_second(),
        "iat": now.as_second(),
        "nbf": now.as_second(),
        "iss": auth::ISSUER,
        "jti": store.new_uid(),
        "sub": format!("system:serviceaccount:{namespace}:{name}"),
        "kubernetes.io": bound,
    });
    let token = format!(
        "{}.{}.{}",
        b64::encode_url(br#"{"alg":"RS256","kid":"wasmlet-testkit"}"#),
        b64::encode_url(claims.to_string().as_bytes()),
        b64::encode_url(auth::TOKEN_SIGNATURE),
    );
    request["kind"] = json!("TokenRequest");
    request["apiVersion"] = json!("authentication.k8s.io/v1");
    request["metadata"] =
        json!({ "name": name, "namespace": namespace, "creationTimestamp": format_time(now) });
    request["spec"]["audiences"] = audiences;
    request["spec"]["expirationSeconds"] = json!(seconds);
    request["status"] = json!({ "token": token, "expirationTimestamp": format_time(expires) });
    Ok(json_response(201, request))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(method: Method, uri: &str) -> RequestInfo {
        let uri: Uri = uri.parse().expect("valid uri");
        let query = parse_query(&uri).expect("valid query");
        RequestInfo::parse(&method, uri.path(), &query)
    }

    #[test]
    fn request_info_like_the_apiserver() {
        let i = info(Method::GET, "/api/v1/namespaces/ns/pods/p/status");
        assert_eq!(
            (
                i.verb.as_str(),
                i.namespace.as_str(),
                i.resource.as_str(),
                i.name.as_str(),
                i.subresource.as_str()
            ),
            ("get", "ns", "pods", "p", "status")
        );
        let i = info(
            Method::GET,
            "/api/v1/pods?watch=true&fieldSelector=spec.nodeName%3Dn1",
        );
        assert_eq!((i.verb.as_str(), i.namespace.as_str()), ("watch", ""));
        let i = info(Method::GET, "/api/v1/namespaces/ns");
        assert_eq!(
            (i.verb.as_str(), i.resource.as_str(), i.name.as_str()),
            ("get", "namespaces", "ns")
        );
        let i = info(Method::PUT, "/api/v1/namespaces/ns/finalize");
        assert_eq!(
            (i.resource.as_str(), i.name.as_str(), i.subresource.as_str()),
            ("namespaces", "ns", "finalize")
        );
        let i = info(
            Method::DELETE,
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
        );
        assert_eq!(
            (i.verb.as_str(), i.group.as_str()),
            ("deletecollection", "coordination.k8s.io")
        );
        let i = info(Method::GET, "/version");
        assert!(!i.resource_request);
    }
}
