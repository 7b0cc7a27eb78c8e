//! Field and label selectors, parsed from query strings and matched against JSON objects.

use std::collections::BTreeSet;

use serde_json::Value;

/// `path=value`, `path==value`, `path!=value` terms joined by commas (AND).
///
/// Paths are dotted JSON paths (`spec.nodeName`); a missing field reads as `""`,
/// booleans and numbers as their JSON text.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct FieldSelector {
    terms: Vec<FieldTerm>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct FieldTerm {
    path: String,
    equal: bool,
    value: String,
}

impl FieldSelector {
    /// Parses a `fieldSelector`; an empty string selects everything.
    pub(crate) fn parse(text: &str) -> Result<FieldSelector, String> {
        let mut terms = Vec::new();
        for raw in split_unescaped(text, ',') {
            let raw = raw.trim();
            if raw.is_empty() {
                continue;
            }
            let (path, equal, value) = if let Some((p, v)) = split_op(raw, "!=") {
                (p, false, v)
            } else if let Some((p, v)) = split_op(raw, "==") {
                (p, true, v)
            } else if let Some((p, v)) = split_op(raw, "=") {
                (p, true, v)
            } else {
                return Err(format!(
                    "invalid selector: '{raw}'; can't understand '{raw}'"
                ));
            };
            let path = path.trim();
            if path.is_empty() || path.split('.').any(str::is_empty) {
                return Err(format!("invalid field path in selector '{raw}'"));
            }
            terms.push(FieldTerm {
                path: path.to_string(),
                equal,
                value: unescape(value.trim()),
            });
        }
        Ok(FieldSelector { terms })
    }

    /// Whether `obj` satisfies every term.
    pub(crate) fn matches(&self, obj: &Value) -> bool {
        self.terms
            .iter()
            .all(|t| (field_text(obj, &t.path) == t.value) == t.equal)
    }
}

/// The text of the field at a dotted path, `""` when absent.
pub(crate) fn field_text(obj: &Value, path: &str) -> String {
    let mut cur = obj;
    for part in path.split('.') {
        match cur.get(part) {
            Some(next) => cur = next,
            None => return String::new(),
        }
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Splits `a=b` at the first unescaped `op`.
fn split_op<'a>(raw: &'a str, op: &str) -> Option<(&'a str, &'a str)> {
    let mut search = 0;
    while let Some(pos) = raw[search..].find(op) {
        let at = search + pos;
        if !is_escaped(raw, at) {
            return Some((&raw[..at], &raw[at + op.len()..]));
        }
        search = at + op.len();
    }
    None
}

fn is_escaped(s: &str, at: usize) -> bool {
    let backslashes = s[..at].bytes().rev().take_while(|b| *b == b'\\').count();
    backslashes % 2 == 1
}

fn split_unescaped(s: &str, sep: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut start = 0;
    for (i, c) in s.char_indices() {
        if c == sep && !is_escaped(s, i) {
            parts.push(&s[start..i]);
            start = i + c.len_utf8();
        }
    }
    parts.push(&s[start..]);
    parts
}

fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(next) = chars.next() {
                out.push(next);
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A label selector: `a=b`, `a==b`, `a!=b`, `a`, `!a`, `a in (x,y)`, `a notin (x)`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct LabelSelector {
    terms: Vec<LabelTerm>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum LabelTerm {
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
    Exists(String),
    NotExists(String),
}

impl LabelSelector {
    /// Parses a `labelSelector`; an empty string selects everything.
    pub(crate) fn parse(text: &str) -> Result<LabelSelector, String> {
        let mut terms = Vec::new();
        for raw in split_top_level(text)? {
            let raw = raw.trim();
            if raw.is_empty() {
                continue;
            }
            terms.push(parse_label_term(raw)?);
        }
        Ok(LabelSelector { terms })
    }

    /// Whether the object's `metadata.labels` satisfy every term.
    pub(crate) fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        let label = |key: &str| labels.and_then(|l| l.get(key)).and_then(Value::as_str);
        self.terms.iter().all(|term| match term {
            LabelTerm::In(k, values) => label(k).is_some_and(|v| values.contains(v)),
            LabelTerm::NotIn(k, values) => label(k).is_none_or(|v| !values.contains(v)),
            LabelTerm::Exists(k) => label(k).is_some(),
            LabelTerm::NotExists(k) => label(k).is_none(),
        })
    }
}

/// Splits at commas outside parentheses.
fn split_top_level(text: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth = depth
                    .checked_sub(1)
                    .ok_or_else(|| format!("unbalanced ')' in label selector '{text}'"))?;
            }
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("unbalanced '(' in label selector '{text}'"));
    }
    parts.push(&text[start..]);
    Ok(parts)
}

fn parse_label_term(raw: &str) -> Result<LabelTerm, String> {
    if let Some(key) = raw.strip_prefix('!') {
        return Ok(LabelTerm::NotExists(label_key(key.trim())?));
    }
    if let Some(open) = raw.find('(') {
        let inner = raw[open + 1..]
            .strip_suffix(')')
            .ok_or_else(|| format!("expected ')' at the end of '{raw}'"))?;
        let mut head = raw[..open].split_whitespace();
        let (Some(key), Some(op), None) = (head.next(), head.next(), head.next()) else {
            return Err(format!("invalid set requirement '{raw}'"));
        };
        let values = inner
            .split(',')
            .map(|v| label_value(v.trim()))
            .collect::<Result<BTreeSet<_>, _>>()?;
        let key = label_key(key)?;
        return match op {
            "in" => Ok(LabelTerm::In(key, values)),
            "notin" => Ok(LabelTerm::NotIn(key, values)),
            _ => Err(format!("unknown set operator '{op}' in '{raw}'")),
        };
    }
    for (op, equal) in [("!=", false), ("==", true), ("=", true)] {
        if let Some((key, value)) = raw.split_once(op) {
            let key = label_key(key.trim())?;
            let values = BTreeSet::from([label_value(value.trim())?]);
            return Ok(if equal {
                LabelTerm::In(key, values)
            } else {
                LabelTerm::NotIn(key, values)
            });
        }
    }
    Ok(LabelTerm::Exists(label_key(raw)?))
}

fn label_key(key: &str) -> Result<String, String> {
    let ok = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '/'));
    if ok {
        Ok(key.to_string())
    } else {
        Err(format!("invalid label key '{key}'"))
    }
}

fn label_value(value: &str) -> Result<String, String> {
    let ok = value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
    if ok {
        Ok(value.to_string())
    } else {
        Err(format!("invalid label value '{value}'"))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod() -> Value {
        json!({
            "metadata": { "name": "p", "namespace": "ns", "labels": { "app": "web", "tier": "front" } },
            "spec": { "nodeName": "n1", "hostNetwork": true },
            "status": { "phase": "Running" },
        })
    }

    #[test]
    fn field_selectors() {
        let cases = [
            ("", true),
            ("spec.nodeName=n1", true),
            ("spec.nodeName==n1", true),
            ("spec.nodeName=n2", false),
            ("spec.nodeName!=n2", true),
            ("spec.nodeName=n1,metadata.namespace=ns", true),
            ("spec.nodeName=n1,metadata.namespace=other", false),
            ("status.phase!=Succeeded,status.phase!=Failed", true),
            ("spec.schedulerName=", true),
            ("spec.hostNetwork=true", true),
            ("metadata.name=p", true),
        ];
        for (text, want) in cases {
            let sel = FieldSelector::parse(text).expect(text);
            assert_eq!(sel.matches(&pod()), want, "{text}");
        }
        assert!(FieldSelector::parse("spec.nodeName").is_err());
        assert!(FieldSelector::parse("=x").is_err());
    }

    #[test]
    fn label_selectors() {
        let cases = [
            ("", true),
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("app!=db", true),
            ("missing!=x", true),
            ("app", true),
            ("!app", false),
            ("!missing", true),
            ("app in (web, db)", true),
            ("app in (db)", false),
            ("app notin (db)", true),
            ("missing notin (db)", true),
            ("missing in (db)", false),
            ("app=web,tier in (front,back)", true),
            ("app=web,tier=back", false),
        ];
        for (text, want) in cases {
            let sel = LabelSelector::parse(text).expect(text);
            assert_eq!(sel.matches(&pod()), want, "{text}");
        }
        for bad in ["app in (web", "a b c", "app=we b", "app ni (x)"] {
            assert!(LabelSelector::parse(bad).is_err(), "{bad}");
        }
    }
}
