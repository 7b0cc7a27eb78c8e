//! Failures as the apiserver reports them: a `Status` object with a code and reason.

use serde_json::{Value, json};

use super::resources::ResourceType;

/// One field error of a validation, as `field.Error` renders it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct FieldError {
    pub field: String,
    /// The cause type: `FieldValueRequired`, `FieldValueInvalid`, ...
    pub reason: &'static str,
    /// `Required value`, `Invalid value: 5: must be ...`, ...
    pub detail: String,
}

impl FieldError {
    pub(crate) fn required(field: impl Into<String>) -> FieldError {
        FieldError {
            field: field.into(),
            reason: "FieldValueRequired",
            detail: "Required value".into(),
        }
    }

    /// `value` is already rendered as Go prints it (`"text"`, `5`, `[]byte{...}`).
    pub(crate) fn invalid(field: impl Into<String>, value: &str, why: &str) -> FieldError {
        FieldError {
            field: field.into(),
            reason: "FieldValueInvalid",
            detail: format!("Invalid value: {value}: {why}"),
        }
    }

    pub(crate) fn not_supported(
        field: impl Into<String>,
        value: &str,
        supported: &[&str],
    ) -> FieldError {
        let list: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
        FieldError {
            field: field.into(),
            reason: "FieldValueNotSupported",
            detail: format!(
                "Unsupported value: {value:?}: supported values: {}",
                list.join(", ")
            ),
        }
    }

    pub(crate) fn duplicate(field: impl Into<String>, value: &str) -> FieldError {
        FieldError {
            field: field.into(),
            reason: "FieldValueDuplicate",
            detail: format!("Duplicate value: {value:?}"),
        }
    }

    pub(crate) fn forbidden(field: impl Into<String>, why: &str) -> FieldError {
        FieldError {
            field: field.into(),
            reason: "FieldValueForbidden",
            detail: format!("Forbidden: {why}"),
        }
    }
}

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

    /// 401: the request's credentials did not authenticate.
    pub(crate) fn unauthorized() -> ApiError {
        ApiError::new(401, "Unauthorized", "Unauthorized")
    }

    /// 503 ServiceUnavailable with a message (`error trying to reach service: ...`).
    pub(crate) fn service_unavailable(message: impl Into<String>) -> ApiError {
        ApiError::new(503, "ServiceUnavailable", message)
    }

    /// 500 InternalError (`Internal error occurred: ...`), as `NewInternalError`.
    pub(crate) fn internal(message: &str) -> ApiError {
        let mut err = ApiError::new(
            500,
            "InternalError",
            format!("Internal error occurred: {message}"),
        );
        err.details = Some(json!({ "causes": [{ "message": message }] }));
        err
    }

    /// 500 with no reason: an error that was not an API status (a failed dial).
    pub(crate) fn unknown(message: impl Into<String>) -> ApiError {
        ApiError::new(500, "", message)
    }

    /// A backend's failure as `NewGenericServerResponse` reports it for `resource`
    /// (e.g. `pods/log`) named `name`, with the backend's body as `server_message`.
    pub(crate) fn generic_server_response(
        code: u16,
        resource: &str,
        name: &str,
        server_message: &str,
    ) -> ApiError {
        let (reason, message) = match code {
            409 => ("Conflict", "the server reported a conflict".to_string()),
            404 => (
                "NotFound",
                "the server could not find the requested resource".to_string(),
            ),
            400 => (
                "BadRequest",
                "the server rejected our request for an unknown reason".to_string(),
            ),
            401 => (
                "Unauthorized",
                "the server has asked for the client to provide credentials".to_string(),
            ),
            403 => ("Forbidden", server_message.to_string()),
            406 => ("NotAcceptable", server_message.to_string()),
            415 => ("UnsupportedMediaType", server_message.to_string()),
            405 => (
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource".to_string(),
            ),
            422 => (
                "Invalid",
                "the server rejected our request due to an error in our request".to_string(),
            ),
            503 => (
                "ServiceUnavailable",
                "the server is currently unable to handle the request".to_string(),
            ),
            504 => (
                "Timeout",
                "the server was unable to return a response in the time allotted, but may still be processing the request".to_string(),
            ),
            429 => (
                "TooManyRequests",
                "the server has received too many requests and has asked us to try again later".to_string(),
            ),
            code if code >= 500 => (
                "InternalError",
                format!(
                    "an error on the server ({server_message:?}) has prevented the request from succeeding"
                ),
            ),
            code => (
                "",
                format!(
                    "the server responded with the status code {code} but did not return more information"
                ),
            ),
        };
        let mut err = ApiError::new(code, reason, format!("{message} ( {resource} {name})"));
        err.details = Some(json!({ "name": name, "kind": resource }));
        err
    }

    /// 422 Invalid with several field errors, as `NewInvalid` renders them:
    /// `<Kind.group> "<name>" is invalid: [<field>: <detail>, ...]`.
    pub(crate) fn invalid_fields(
        group: &str,
        kind: &str,
        name: &str,
        errors: &[FieldError],
    ) -> ApiError {
        let qualified = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let texts: Vec<String> = errors
            .iter()
            .map(|e| format!("{}: {}", e.field, e.detail))
            .collect();
        let joined = match texts.as_slice() {
            [one] => one.clone(),
            many => format!("[{}]", many.join(", ")),
        };
        let causes: Vec<Value> = errors
            .iter()
            .map(|e| json!({ "reason": e.reason, "message": e.detail, "field": e.field }))
            .collect();
        let mut err = ApiError::new(
            422,
            "Invalid",
            format!("{qualified} {name:?} is invalid: {joined}"),
        );
        err.details = Some(json!({
            "name": name,
            "group": group,
            "kind": kind,
            "causes": causes,
        }));
        err
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

    /// The `Status` body (`reason` is left out when unknown, as `omitempty` does).
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
        if self.reason.is_empty()
            && let Value::Object(map) = &mut status
        {
            map.remove("reason");
        }
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}
