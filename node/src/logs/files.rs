//! The file steps of a rotation, all blocking: listing a log's rotated files, removing
//! the leftovers of an interrupted rotation and the excess, compressing, naming.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use flate2::Compression;
use flate2::write::GzEncoder;
use jiff::Timestamp;

use super::{Error, Result};

/// The timestamp suffix of a rotated log, Go's `20060102-150405`, in UTC.
pub const TIMESTAMP_FORMAT: &str = "%Y%m%d-%H%M%S";
/// The suffix of a compressed rotated log.
pub const COMPRESS_SUFFIX: &str = ".gz";
/// The suffix of a compression in progress.
pub const TMP_SUFFIX: &str = ".tmp";

/// The name `log` is rotated to at `now`: `N.log.<YYYYMMDD-HHMMSS>`.
pub fn rotated_name(log: &Path, now: Timestamp) -> PathBuf {
    let mut name = log.as_os_str().to_owned();
    name.push(".");
    name.push(now.strftime(TIMESTAMP_FORMAT).to_string());
    PathBuf::from(name)
}

/// Every file named `<log>.*` beside `log`, sorted by name (oldest first: the
/// timestamps sort as they read).
pub fn rotated_files(log: &Path) -> Result<Vec<PathBuf>> {
    let dir = log.parent().unwrap_or(Path::new("."));
    let Some(name) = log.file_name().and_then(|n| n.to_str()) else {
        return Ok(Vec::new());
    };
    let prefix = format!("{name}.");
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io("listing", dir, e))?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io("listing", dir, e))?;
        if entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(&prefix))
        {
            files.push(entry.path());
        }
    }
    files.sort();
    Ok(files)
}

/// Whether a rotated file still counts: a temporary file does not, nor an
/// uncompressed one whose compressed copy exists (a compression was interrupted after
/// its rename).
fn in_use(file: &Path, all: &[PathBuf]) -> bool {
    let name = file.as_os_str().to_string_lossy();
    if name.ends_with(TMP_SUFFIX) {
        return false;
    }
    if name.ends_with(COMPRESS_SUFFIX) {
        return true;
    }
    let compressed = format!("{name}{COMPRESS_SUFFIX}");
    !all.iter()
        .any(|f| f.as_os_str().to_string_lossy() == compressed)
}

/// Readies `log`'s rotated files for one more: removes the unused ones, then the
/// oldest until `keep` remain, then compresses every one still uncompressed. Returns
/// what remains, oldest first.
pub fn prepare(log: &Path, keep: usize) -> Result<Vec<PathBuf>> {
    let all = rotated_files(log)?;
    let (mut files, unused): (Vec<_>, Vec<_>) = all.iter().cloned().partition(|f| in_use(f, &all));
    for f in unused {
        remove(&f)?;
    }
    // Oldest first, so that a reader following the newest ones is not cut short.
    let excess = files.len().saturating_sub(keep);
    for f in files.drain(..excess) {
        remove(&f)?;
    }
    for f in &mut files {
        if !f.as_os_str().to_string_lossy().ends_with(COMPRESS_SUFFIX) {
            *f = compress(f)?;
        }
    }
    Ok(files)
}

fn remove(file: &Path) -> Result<()> {
    match std::fs::remove_file(file) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(Error::io("removing", file, e)),
        _ => Ok(()),
    }
}

/// Compresses `file` to `<file>.gz` (through `<file>.gz.tmp`, renamed when complete)
/// and removes it. Returns the compressed file's path.
pub fn compress(file: &Path) -> Result<PathBuf> {
    let mut gz = file.as_os_str().to_owned();
    gz.push(COMPRESS_SUFFIX);
    let gz = PathBuf::from(gz);
    let mut tmp = gz.as_os_str().to_owned();
    tmp.push(TMP_SUFFIX);
    let tmp = PathBuf::from(tmp);
    let written = (|| -> io::Result<()> {
        let mut src = File::open(file)?;
        let mode = src.metadata()?.permissions();
        let out = File::create(&tmp)?;
        out.set_permissions(mode)?;
        let mut encoder = GzEncoder::new(out, Compression::default());
        io::copy(&mut src, &mut encoder)?;
        encoder.finish()?.sync_all()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::io("compressing", file, e));
    }
    std::fs::rename(&tmp, &gz).map_err(|e| Error::io("renaming", &tmp, e))?;
    remove(file)?;
    Ok(gz)
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    fn write(path: &Path, text: &str) {
        std::fs::write(path, text).unwrap();
    }

    fn names(files: &[PathBuf]) -> Vec<String> {
        files
            .iter()
            .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn rotated_names_carry_a_utc_timestamp_in_gos_format() {
        let at: Timestamp = "2024-01-02T03:04:05.987654321Z".parse().unwrap();
        assert_eq!(
            rotated_name(Path::new("/logs/ns_pod_uid/app/0.log"), at),
            PathBuf::from("/logs/ns_pod_uid/app/0.log.20240102-030405")
        );
        let offset: Timestamp = "2024-12-31T23:59:59-05:00".parse().unwrap();
        assert_eq!(
            rotated_name(Path::new("0.log"), offset),
            PathBuf::from("0.log.20250101-045959"),
            "in UTC whatever the zone it was read in"
        );
    }

    #[test]
    fn only_a_logs_own_rotated_files_are_listed_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        for name in [
            "0.log",
            "0.log.20240102-030406",
            "0.log.20240102-030405.gz",
            "1.log.20240102-030405",
            "10.log.20240102-030405",
        ] {
            write(&dir.path().join(name), "x");
        }
        assert_eq!(
            names(&rotated_files(&log).unwrap()),
            ["0.log.20240102-030405.gz", "0.log.20240102-030406"]
        );
    }

    #[test]
    fn leftovers_of_an_interrupted_rotation_go_first_and_the_oldest_next() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        for name in [
            "0.log.20240102-030401.gz",
            "0.log.20240102-030402.gz",
            // Compressed, but not yet removed.
            "0.log.20240102-030403",
            "0.log.20240102-030403.gz",
            // A compression that did not finish.
            "0.log.20240102-030404.gz.tmp",
            "0.log.20240102-030404",
        ] {
            write(&dir.path().join(name), name);
        }
        let kept = prepare(&log, 2).unwrap();
        assert_eq!(
            names(&kept),
            ["0.log.20240102-030403.gz", "0.log.20240102-030404.gz"]
        );
        assert_eq!(names(&rotated_files(&log).unwrap()), names(&kept));
        assert!(prepare(&log, 0).unwrap().is_empty());
        assert!(rotated_files(&log).unwrap().is_empty());
    }

    #[test]
    fn a_compressed_log_decompresses_to_the_original_and_replaces_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("0.log.20240102-030405");
        let text: String = (0..1000)
            .map(|i| format!("2024-01-02T03:04:05.000000000Z stdout F tick {i}\n"))
            .collect();
        write(&file, &text);
        let gz = compress(&file).unwrap();
        assert_eq!(gz, dir.path().join("0.log.20240102-030405.gz"));
        assert!(!file.exists(), "the uncompressed file is removed");
        let mut back = String::new();
        flate2::read::GzDecoder::new(File::open(&gz).unwrap())
            .read_to_string(&mut back)
            .unwrap();
        assert_eq!(back, text);
        assert!(std::fs::metadata(&gz).unwrap().len() < text.len() as u64 / 4);
    }
}
