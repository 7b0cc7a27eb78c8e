//! Base64 as Kubernetes uses it: standard padded for `[]byte` fields (Secret data,
//! CSR requests and certificates, kubeconfig data), unpadded URL-safe for JWTs.

const STANDARD: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const URL_SAFE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

fn encode_with(data: &[u8], alphabet: &[u8; 64], pad: bool) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(alphabet[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
        if pad {
            for _ in chunk.len()..3 {
                out.push('=');
            }
        }
    }
    out
}

/// Standard padded base64.
pub(crate) fn encode(data: &[u8]) -> String {
    encode_with(data, STANDARD, true)
}

/// Unpadded base64url.
pub(crate) fn encode_url(data: &[u8]) -> String {
    encode_with(data, URL_SAFE, false)
}

/// Decodes standard or URL-safe base64, padded or not; `None` when malformed.
pub(crate) fn decode(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let mut acc: u32 = 0;
    let mut bits = 0;
    let compact: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    let end = compact
        .iter()
        .rposition(|b| *b != b'=')
        .map_or(0, |i| i + 1);
    for &c in &compact[..end] {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    // Leftover bits must be padding zeros, and a lone sextet is not a byte.
    if bits >= 6 || acc != 0 {
        return None;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        for (data, std, url) in [
            (&b""[..], "", ""),
            (b"f", "Zg==", "Zg"),
            (b"fo", "Zm8=", "Zm8"),
            (b"foo", "Zm9v", "Zm9v"),
            (&[0xfb, 0xff], "+/8=", "-_8"),
        ] {
            assert_eq!(encode(data), std);
            assert_eq!(encode_url(data), url);
            assert_eq!(decode(std).as_deref(), Some(data));
            assert_eq!(decode(url).as_deref(), Some(data));
        }
        assert_eq!(decode("Zg=\n").as_deref(), Some(&b"f"[..]));
        assert!(decode("Z").is_none());
        assert!(decode("Zh==").is_none(), "non-zero padding bits");
        assert!(decode("a*b=").is_none());
    }
}
