//! `http-json-probe`: a readiness/liveness check that looks inside the answer.
//!
//! It sends `GET http://<pod-ip>:<port><path>` and passes when the status is 2xx
//! or 3xx and, if `field` is set, the JSON body's `field` equals `expect`.
//!
//! Settings (the pod's `settings` first, then the node's `host::settings()`):
//!
//! | key | default | meaning |
//! | --- | --- | --- |
//! | `port` | `80` | the container port |
//! | `path` | `/` | the request path |
//! | `field` | unset | a JSON pointer (`/status/phase`) or a dotted path (`status.phase`, `items.0.name`) |
//! | `expect` | `ok` | the value `field` must have; a string compares as is, anything else as its JSON text (`true`, `3`) |

use serde_json::Value;
use wasmlet_plugin_sdk::host::{SettingError, Settings};
use wasmlet_plugin_sdk::pod_network;
use wasmlet_plugin_sdk::probe::{Probe, ProbeRequest, ProbeResult};

/// What to ask and what to expect, read from the settings.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Check {
    port: u16,
    path: String,
    field: Option<String>,
    expect: String,
}

impl Check {
    fn from_settings(settings: &Settings) -> Result<Self, SettingError> {
        let path = settings.get_or("path", "/");
        Ok(Check {
            port: settings.parse_or("port", 80)?,
            path: if path.starts_with('/') {
                path.to_string()
            } else {
                format!("/{path}")
            },
            field: settings.get("field").map(str::to_string),
            expect: settings.get_or("expect", "ok").to_string(),
        })
    }

    /// The verdict on a response, `Err` with the reason it failed.
    fn judge(&self, status: u16, body: &[u8]) -> Result<(), String> {
        if !(200..400).contains(&status) {
            return Err(format!("HTTP status {status}"));
        }
        let Some(field) = &self.field else {
            return Ok(());
        };
        let json: Value =
            serde_json::from_slice(body).map_err(|e| format!("the body is not JSON: {e}"))?;
        let value = find(&json, field).ok_or_else(|| format!("field `{field}` is missing"))?;
        let actual = match value {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        if actual == self.expect {
            Ok(())
        } else {
            Err(format!(
                "field `{field}` is {actual:?}, expected {:?}",
                self.expect
            ))
        }
    }
}

/// `field` as a JSON pointer when it starts with `/`, else as a dotted path.
fn find<'a>(json: &'a Value, field: &str) -> Option<&'a Value> {
    if field.starts_with('/') {
        return json.pointer(field);
    }
    field.split('.').try_fold(json, |value, key| match value {
        Value::Object(map) => map.get(key),
        Value::Array(items) => items.get(key.parse::<usize>().ok()?),
        _ => None,
    })
}

struct HttpJsonProbe;

impl Probe for HttpJsonProbe {
    fn check(request: ProbeRequest) -> ProbeResult {
        let check = match Check::from_settings(&request.settings()) {
            Ok(check) => check,
            Err(e) => return ProbeResult::failure(e),
        };
        let Some(ip) = request.pod_ips.first() else {
            return ProbeResult::failure("the pod has no IP address yet");
        };
        let url = format!("http://{ip}:{}{}", check.port, check.path);
        let headers = [("Accept", "application/json")];
        let response = match pod_network::http_get(ip, check.port, &check.path, &headers) {
            Ok(response) => response,
            Err(e) => return ProbeResult::failure(format!("GET {url}: {e}")),
        };
        match check.judge(response.status, &response.body) {
            Ok(()) => ProbeResult::Success,
            Err(why) => ProbeResult::failure(format!("GET {url}: {why}")),
        }
    }
}

wasmlet_plugin_sdk::export_probe!(HttpJsonProbe);

#[cfg(test)]
mod tests {
    use super::*;

    fn check(field: Option<&str>, expect: &str) -> Check {
        Check {
            port: 8080,
            path: "/status".into(),
            field: field.map(str::to_string),
            expect: expect.into(),
        }
    }

    #[test]
    fn settings_have_defaults_and_a_leading_slash() {
        let c = Check::from_settings(&Settings::from_iter([("path", "healthz")])).unwrap();
        assert_eq!(c.port, 80);
        assert_eq!(c.path, "/healthz");
        assert_eq!(c.expect, "ok");
        assert!(Check::from_settings(&Settings::from_iter([("port", "x")])).is_err());
    }

    #[test]
    fn verdicts() {
        let body = br#"{"status":{"phase":"ready","ok":true},"items":[{"n":3}]}"#;
        let cases = [
            (check(None, ""), 200, &b"not json"[..], Ok(())),
            (check(None, ""), 302, &b""[..], Ok(())),
            (check(None, ""), 503, &b""[..], Err("HTTP status 503")),
            (check(Some("status.phase"), "ready"), 200, body, Ok(())),
            (check(Some("/status/phase"), "ready"), 200, body, Ok(())),
            (check(Some("status.ok"), "true"), 200, body, Ok(())),
            (check(Some("items.0.n"), "3"), 200, body, Ok(())),
            (
                check(Some("status.phase"), "done"),
                200,
                body,
                Err("field `status.phase` is \"ready\", expected \"done\""),
            ),
            (
                check(Some("status.gone"), "x"),
                200,
                body,
                Err("field `status.gone` is missing"),
            ),
        ];
        for (check, status, body, want) in cases {
            assert_eq!(
                check.judge(status, body),
                want.map_err(str::to_string),
                "{check:?}"
            );
        }
        assert!(
            check(Some("a"), "b")
                .judge(200, b"<html>")
                .unwrap_err()
                .starts_with("the body is not JSON")
        );
    }
}
