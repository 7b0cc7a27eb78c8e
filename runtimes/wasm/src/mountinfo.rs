//! The mount table of the calling process's mount namespace, as the node (volumes,
//! CSI) and the containerd shim (shared root filesystems) read it.

use std::path::PathBuf;

/// Every mount point of this mount namespace (`/proc/self/mountinfo`, octal escapes
/// undone), in the table's order.
pub fn mount_points() -> std::io::Result<Vec<PathBuf>> {
    let table = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(table
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape(p)))
        .collect())
}

/// Undoes mountinfo's `\NNN` octal escapes (space, tab, newline, backslash); anything
/// else, a short or non-octal sequence included, is kept as it is.
pub fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn octal_escapes_are_undone_and_nothing_else() {
        assert_eq!(unescape(r"/run/a\040b\011c\134d"), "/run/a b\tc\\d");
        assert_eq!(unescape(r"/plain"), "/plain");
        assert_eq!(unescape(r"/short\04"), r"/short\04", "not an escape");
        assert_eq!(unescape(r"/not\089"), r"/not\089", "not octal");
        assert_eq!(unescape("/ünï\\040code"), "/ünï code");
    }

    #[test]
    fn the_root_is_a_mount_point() {
        assert!(mount_points().unwrap().contains(&PathBuf::from("/")));
    }
}
