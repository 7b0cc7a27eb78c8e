//! Image references, normalised the way containerd and the kubelet do.
//!
//! `hello` becomes `docker.io/library/hello:latest`, `ghcr.io/a/b` becomes
//! `ghcr.io/a/b:latest`; a reference with a digest keeps it and gets no tag.

/// Normalises an image reference to its fully qualified form.
pub fn normalize(reference: &str) -> Result<String, String> {
    let reference = reference.trim();
    if reference.is_empty() {
        return Err("empty image reference".into());
    }
    if reference
        .chars()
        .any(|c| c.is_whitespace() || c.is_ascii_uppercase())
    {
        // Docker rejects upper case in repository names; tags may hold it, but a
        // reference with spaces or upper-case path parts is almost always a typo.
        let (name, _) = split_name(reference);
        if name
            .chars()
            .any(|c| c.is_whitespace() || c.is_ascii_uppercase())
        {
            return Err(format!(
                "invalid image reference {reference:?}: repository names are lower case without spaces"
            ));
        }
    }
    let (name, suffix) = split_name(reference);
    let mut parts = name.splitn(2, '/');
    let first = parts.next().unwrap_or_default();
    let rest = parts.next();
    let qualified = match rest {
        Some(rest) if first.contains('.') || first.contains(':') || first == "localhost" => {
            format!("{first}/{rest}")
        }
        Some(_) => format!("docker.io/{name}"),
        None => format!("docker.io/library/{name}"),
    };
    let suffix = if suffix.is_empty() {
        ":latest".to_owned()
    } else {
        suffix.to_owned()
    };
    Ok(format!("{qualified}{suffix}"))
}

/// Splits `name[:tag][@digest]` into the name and the rest (with its `:` or `@`).
fn split_name(reference: &str) -> (&str, &str) {
    if let Some(at) = reference.find('@') {
        return (&reference[..at], &reference[at..]);
    }
    // A tag's colon comes after the last slash; a port's colon comes before it.
    let last_slash = reference.rfind('/').map(|i| i + 1).unwrap_or(0);
    match reference[last_slash..].find(':') {
        Some(i) => reference.split_at(last_slash + i),
        None => (reference, ""),
    }
}

/// The repository part of a normalised reference (without tag or digest).
pub fn repository(normalized: &str) -> &str {
    split_name(normalized).0
}

/// Whether the reference has the `latest` tag or no tag at all, which makes the
/// default pull policy `Always`.
pub fn is_latest_or_untagged(reference: &str) -> bool {
    let (_, suffix) = split_name(reference.trim());
    suffix.is_empty() || suffix == ":latest"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_like_containerd() {
        let cases = [
            ("hello", "docker.io/library/hello:latest"),
            ("hello:v1", "docker.io/library/hello:v1"),
            ("user/app", "docker.io/user/app:latest"),
            ("ghcr.io/a/b", "ghcr.io/a/b:latest"),
            (
                "localhost/wasmlet-examples/hello:latest",
                "localhost/wasmlet-examples/hello:latest",
            ),
            ("localhost:5000/x:1", "localhost:5000/x:1"),
            ("reg:5000/x", "reg:5000/x:latest"),
            ("ghcr.io/a/b@sha256:0123", "ghcr.io/a/b@sha256:0123"),
        ];
        for (input, want) in cases {
            assert_eq!(normalize(input).unwrap(), want, "{input}");
        }
        assert!(normalize("").is_err());
        assert!(normalize("Hello/World").is_err());
    }

    #[test]
    fn latest_detection() {
        assert!(is_latest_or_untagged("a/b"));
        assert!(is_latest_or_untagged("a/b:latest"));
        assert!(!is_latest_or_untagged("a/b:v1"));
        assert!(is_latest_or_untagged("localhost:5000/b"));
        assert_eq!(repository("localhost:5000/x:1"), "localhost:5000/x");
    }
}
