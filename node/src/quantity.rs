//! Kubernetes resource quantities (`64Mi`, `500m`, `1.5G`, `1e3`).

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// The value of a quantity as a float (`500m` is 0.5, `1Ki` is 1024).
pub fn parse(q: &Quantity) -> Result<f64, String> {
    let s = q.0.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let value: f64 = num.parse().map_err(|_| format!("invalid quantity {s:?}"))?;
    let factor = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        e if e.starts_with(['e', 'E']) => {
            let exp: i32 = e[1..]
                .parse()
                .map_err(|_| format!("invalid exponent in quantity {s:?}"))?;
            10f64.powi(exp)
        }
        _ => return Err(format!("invalid suffix in quantity {s:?}")),
    };
    Ok(value * factor)
}

/// A byte quantity rounded up to a whole number of bytes.
pub fn bytes(q: &Quantity) -> Result<u64, String> {
    let v = parse(q)?;
    if v < 0.0 {
        return Err(format!("negative quantity {:?}", q.0));
    }
    Ok(v.ceil() as u64)
}

/// Bytes in Kubernetes' binary canonical form (`24683656Ki`, `2Gi`, `1000`), as
/// `resource.NewQuantity(n, BinarySI)` prints them.
pub fn binary_si(bytes: u64) -> Quantity {
    const SUFFIXES: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if bytes == 0 {
        return Quantity("0".into());
    }
    let mut value = bytes;
    let mut suffix = "";
    for s in SUFFIXES {
        if !value.is_multiple_of(1024) {
            break;
        }
        value /= 1024;
        suffix = s;
    }
    Quantity(format!("{value}{suffix}"))
}

/// Millicores in Kubernetes' decimal canonical form (`2`, `1500m`).
pub fn milli_cpu(milli: u64) -> Quantity {
    if milli.is_multiple_of(1000) {
        Quantity(format!("{}", milli / 1000))
    } else {
        Quantity(format!("{milli}m"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kubernetes_quantities() {
        let cases = [
            ("64Mi", 64.0 * 1024.0 * 1024.0),
            ("1Gi", 1024f64.powi(3)),
            ("500m", 0.5),
            ("2", 2.0),
            ("1.5k", 1500.0),
            ("1e3", 1000.0),
            ("128974848", 128974848.0),
            ("129M", 129e6),
        ];
        for (s, want) in cases {
            assert_eq!(parse(&Quantity(s.into())).unwrap(), want, "{s}");
        }
        assert!(parse(&Quantity("lots".into())).is_err());
        assert!(parse(&Quantity("1Qi".into())).is_err());
        assert_eq!(bytes(&Quantity("0.5Ki".into())).unwrap(), 512);
    }

    #[test]
    fn canonical_forms() {
        assert_eq!(binary_si(24683656 * 1024).0, "24683656Ki");
        assert_eq!(binary_si(2 << 30).0, "2Gi");
        assert_eq!(binary_si(1000).0, "1000");
        assert_eq!(binary_si(0).0, "0");
        assert_eq!(milli_cpu(2000).0, "2");
        assert_eq!(milli_cpu(1500).0, "1500m");
    }
}
