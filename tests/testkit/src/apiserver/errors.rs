//! Failures as the apiserver reports them: a `Status` object with a code and reason.

use serde_json::{Value, json};

use super::resources::ResourceType;

/// A failed request; rendered as a `meta.k8s.io/v1` `Status` body.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, res: &ResourceType, name: &str) -> ApiError {
        self.details = Some(json!({ "name": name, "group": res.group, "kind": res.plural }));
        self
    }

    /// 404 `pods "x" not found`.
    pub(crate) fn not_found(res: &ResourceType, name: &str) -> ApiError {
        let message = format!("{} \"{name}\" not found", res.qualified());
        ApiError::new(404, "NotFound", message).with_details(res, name)
    }

    /// 404 for a path no resource is served at.
    pub(crate) fn no_such_resource() -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    /// 409 `pods "x" already exists`.
    pub(crate) fn already_exists(res: &ResourceType, name: &str) -> ApiError {
        let message = format!("{} \"{name}\" already exists", res.qualified());
        ApiError::new(409, "AlreadyExists", message).with_details(res, name)
    }

    /// 409 Conflict: a stale resourceVersion or a failed precondition.
    pub(crate) fn conflict(res: &ResourceType, name: &str, why: &str) -> ApiError {
        let message = format!(
            "Operation cannot be fulfilled on {} \"{name}\": {why}",
            res.qualified()
        );
        ApiError::new(409, "Conflict", message).with_details(res, name)
    }

    /// 409 Conflict for a PUT/PATCH carrying an outdated resourceVersion.
    pub(crate) fn stale(res: &ResourceType, name: &str) -> ApiError {
        ApiError::conflict(
            res,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 Invalid with one field cause.
    pub(crate) fn invalid(res: &ResourceType, name: &str, field: &str, message: &str) -> ApiError {
        let full = format!("{} \"{name}\" is invalid: {field}: {message}", res.kind);
        let mut err = ApiError::new(422, "Invalid", full);
        err.details = Some(json!({
            "name": name,
            "group": res.group,
            "kind": res.kind,
            "causes": [{ "reason": "FieldValueInvalid", "message": message, "field": field }],
        }));
        err
    }

    /// 400 BadRequest.
    pub(crate) fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", message)
    }

    /// 405 for a verb the resource does not support.
    pub(crate) fn method_not_allowed(message: impl Into<String>) -> ApiError {
        ApiError::new(405, "MethodNotAllowed", message)
    }

    /// 415 for a body format the server does not decode (YAML, apply patches).
    pub(crate) fn unsupported_media_type(content_type: &str) -> ApiError {
        ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format ({content_type}) - accepted media types include: application/json, application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json"
            ),
        )
    }

    /// 410 Expired: a watch from a resourceVersion older than the kept history.
    pub(crate) fn expired(requested: u64, oldest: u64) -> ApiError {
        ApiError::new(
            410,
            "Expired",
            format!("too old resource version: {requested} ({oldest})"),
        )
    }

    /// 503, answered while the server is marked down.
    pub(crate) fn unavailable() -> ApiError {
        ApiError::new(
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
        )
    }

    /// An injected failure with the conventional reason for `code`.
    pub(crate) fn injected(code: u16) -> ApiError {
        let reason = match code {
            400 => "BadRequest",
            401 => "Unauthorized",
            403 => "Forbidden",
            404 => "NotFound",
            405 => "MethodNotAllowed",
            409 => "Conflict",
            410 => "Expired",
            415 => "UnsupportedMediaType",
            422 => "Invalid",
            429 => "TooManyRequests",
            500 => "InternalError",
            503 => "ServiceUnavailable",
            504 => "Timeout",
            _ => "",
        };
        ApiError::new(code, reason, format!("injected failure ({code})"))
    }

    /// The `Status` body.
    pub(crate) fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}
