//! The kubelet's checkpoint checksums: fnv32a over the `go-spew` rendering
//! (`%#v`, sorted map keys, methods disabled) of the checkpoint's data. Checkpoints
//! are shared with the kubelet (a node may switch agents and keep its allocations),
//! so the rendering is reproduced for the few Go shapes checkpoints use: strings,
//! integers, slices, maps and structs, each with its Go type name.
//!
//! The rendering was checked against Go and go-spew v1.1.1 on the fixtures in
//! `node/tests/fixtures/checkpoints`.

/// A Go value as spew sees it.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// A nil slice or map.
    Nil,
    Str(String),
    Int(i64),
    List(Vec<Value>),
    /// Entries in any order; spew sorts them by key.
    Map(Vec<(Value, Value)>),
    /// Go type name, then (field, field type, value).
    Struct(&'static str, Vec<(&'static str, &'static str, Value)>),
}

/// `%#v` of `value`, whose Go type is `type_name`.
pub fn format(value: &Value, type_name: &str) -> String {
    let mut out = String::new();
    typed(&mut out, value, type_name);
    out
}

fn typed(out: &mut String, value: &Value, type_name: &str) {
    out.push('(');
    out.push_str(type_name);
    out.push(')');
    body(out, value);
}

fn body(out: &mut String, value: &Value) {
    match value {
        Value::Nil => out.push_str("<nil>"),
        Value::Str(s) => out.push_str(s),
        Value::Int(i) => out.push_str(&i.to_string()),
        Value::List(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                body(out, item);
            }
            out.push(']');
        }
        Value::Map(entries) => {
            let mut entries: Vec<&(Value, Value)> = entries.iter().collect();
            entries.sort_by(|a, b| key_order(&a.0, &b.0));
            out.push_str("map[");
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                body(out, k);
                out.push(':');
                body(out, v);
            }
            out.push(']');
        }
        Value::Struct(_, fields) => {
            out.push('{');
            for (i, (name, type_name, v)) in fields.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                out.push_str(name);
                out.push(':');
                typed(out, v, type_name);
            }
            out.push('}');
        }
    }
}

fn key_order(a: &Value, b: &Value) -> std::cmp::Ordering {
    match (a, b) {
        (Value::Int(x), Value::Int(y)) => x.cmp(y),
        (Value::Str(x), Value::Str(y)) => x.cmp(y),
        _ => std::cmp::Ordering::Equal,
    }
}

/// FNV-1a, 32 bits.
pub fn fnv32a(s: &str) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for b in s.bytes() {
        hash ^= u32::from(b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv32a_matches_the_reference_vectors() {
        assert_eq!(fnv32a(""), 0x811c_9dc5);
        assert_eq!(fnv32a("a"), 0xe40c_292c);
        assert_eq!(fnv32a("foobar"), 0xbf9c_f968);
    }
}
