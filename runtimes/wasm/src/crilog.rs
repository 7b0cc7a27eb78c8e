//! Container log files in the CRI format, the one `kubectl logs` and log shippers read.
//!
//! Each line is `<RFC3339Nano> <stdout|stderr> <F|P> <text>\n`. A line longer than
//! [`MAX_LINE`] is cut into `P` (partial) records followed by one `F` (full) record, as
//! containerd does; a final line without a newline is written as `F` when the stream
//! closes.
//!
//! [`CriLog::reopen`] is the second half of a rotation (CRI's ReopenContainerLog): the
//! node renames the file aside and asks for it; the next records go to a new file at
//! the same path. Records are written whole under one lock, so none is lost or split
//! between the two files; a line still pending goes to the new one.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use jiff::Timestamp;

/// The longest record written before a line is split, containerd's default.
pub const MAX_LINE: usize = 16 * 1024;

/// Which output stream a record came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// One container's log file, shared by its stdout and stderr writers.
#[derive(Clone)]
pub struct CriLog {
    inner: Arc<Mutex<Inner>>,
}

struct Inner {
    file: File,
    /// Raw mode: each stream's bytes go as they are to a file of its own (a containerd
    /// shim's stdio FIFOs, which containerd turns into records itself); `file` is unused.
    raw: Option<[Option<File>; 2]>,
    /// Where the file was opened; `None` for a file opened elsewhere, which cannot be
    /// reopened.
    path: Option<PathBuf>,
    pending: [Vec<u8>; 2],
}

impl CriLog {
    /// Opens (appending) or creates the log file, and its parent directory.
    pub fn create(path: &Path) -> io::Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let log = Self::from_file(open(path)?);
        log.lock().path = Some(path.to_owned());
        Ok(log)
    }

    /// Wraps an already open file.
    pub fn from_file(file: File) -> Self {
        CriLog {
            inner: Arc::new(Mutex::new(Inner {
                file,
                raw: None,
                path: None,
                pending: [Vec::new(), Vec::new()],
            })),
        }
    }

    /// Output that is passed on as it is: stdout's bytes to `stdout`, stderr's to
    /// `stderr`; a stream with no file is dropped.
    pub fn raw(stdout: Option<File>, stderr: Option<File>) -> io::Result<Self> {
        let log = Self::from_file(File::open("/dev/null")?);
        log.lock().raw = Some([stdout, stderr]);
        Ok(log)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Closes the file and opens (creating) the one now at its path, so that after the
    /// old file was renamed the next records go to a new one. Between two whole
    /// records: nothing written so far goes to the new file, nothing after to the old.
    pub fn reopen(&self) -> io::Result<()> {
        let mut inner = self.lock();
        let Some(path) = inner.path.clone() else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "this log was not opened by path",
            ));
        };
        inner.file.flush()?;
        // On failure the old file stays in use: no record is dropped.
        inner.file = open(&path)?;
        Ok(())
    }

    /// Appends output of one stream, writing a record for every complete line.
    pub fn write(&self, stream: Stream, mut bytes: &[u8]) -> io::Result<()> {
        let mut inner = self.lock();
        if let Some(raw) = inner.raw.as_mut() {
            return match raw[stream as usize].as_mut() {
                Some(file) => file.write_all(bytes),
                None => Ok(()),
            };
        }
        let Inner { file, pending, .. } = &mut *inner;
        let buf = &mut pending[stream as usize];
        let mut out = Vec::new();
        while !bytes.is_empty() {
            match bytes.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    buf.extend_from_slice(&bytes[..i]);
                    bytes = &bytes[i + 1..];
                    flush_long(stream, buf, &mut out);
                    record(stream, 'F', buf, &mut out);
                    buf.clear();
                }
                None => {
                    buf.extend_from_slice(bytes);
                    bytes = &[];
                    flush_long(stream, buf, &mut out);
                }
            }
        }
        if !out.is_empty() {
            file.write_all(&out)?;
        }
        Ok(())
    }

    /// Writes whatever is left of an unterminated last line of each stream as `F`.
    pub fn close(&self) -> io::Result<()> {
        let mut inner = self.lock();
        if inner.raw.is_some() {
            return Ok(());
        }
        let Inner { file, pending, .. } = &mut *inner;
        let mut out = Vec::new();
        for stream in [Stream::Stdout, Stream::Stderr] {
            let buf = &mut pending[stream as usize];
            if !buf.is_empty() {
                record(stream, 'F', buf, &mut out);
                buf.clear();
            }
        }
        file.write_all(&out)?;
        file.flush()
    }
}

/// Opens a log file for appending, creating it.
fn open(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

/// Emits `P` records while the pending line is longer than [`MAX_LINE`].
fn flush_long(stream: Stream, buf: &mut Vec<u8>, out: &mut Vec<u8>) {
    while buf.len() > MAX_LINE {
        let rest = buf.split_off(MAX_LINE);
        record(stream, 'P', buf, out);
        *buf = rest;
    }
}

fn record(stream: Stream, tag: char, text: &[u8], out: &mut Vec<u8>) {
    let now = Timestamp::now();
    // RFC 3339 with nanoseconds, always nine digits, as Go's RFC3339Nano in UTC reads.
    let _ = write!(
        out,
        "{} {} {} ",
        now.strftime("%Y-%m-%dT%H:%M:%S.%9fZ"),
        stream.as_str(),
        tag
    );
    out.extend_from_slice(text);
    out.push(b'\n');
}

/// One parsed record of a CRI log file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub time: Timestamp,
    pub stream: Stream,
    pub partial: bool,
    pub text: String,
}

/// Parses one line of a CRI log file.
pub fn parse_line(line: &str) -> Option<Record> {
    let mut parts = line.splitn(4, ' ');
    let time = parts.next()?.parse().ok()?;
    let stream = match parts.next()? {
        "stdout" => Stream::Stdout,
        "stderr" => Stream::Stderr,
        _ => return None,
    };
    let partial = match parts.next()? {
        "F" => false,
        "P" => true,
        _ => return None,
    };
    let text = parts.next().unwrap_or("").to_owned();
    Some(Record {
        time,
        stream,
        partial,
        text,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(log: &CriLog, path: &Path) -> Vec<Record> {
        log.close().unwrap();
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| parse_line(l).unwrap_or_else(|| panic!("bad record {l:?}")))
            .collect()
    }

    #[test]
    fn lines_split_across_writes_become_one_full_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c/0.log");
        let log = CriLog::create(&path).unwrap();
        log.write(Stream::Stdout, b"hel").unwrap();
        log.write(Stream::Stderr, b"oops\n").unwrap();
        log.write(Stream::Stdout, b"lo\nworld\n").unwrap();
        let recs = records(&log, &path);
        let got: Vec<_> = recs
            .iter()
            .map(|r| (r.stream, r.partial, r.text.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (Stream::Stderr, false, "oops"),
                (Stream::Stdout, false, "hello"),
                (Stream::Stdout, false, "world"),
            ]
        );
        let line = std::fs::read_to_string(&path).unwrap();
        let ts = line.split(' ').next().unwrap();
        assert_eq!(ts.len(), "2024-01-02T03:04:05.123456789Z".len(), "{ts}");
    }

    #[test]
    fn long_lines_are_split_into_partial_records() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.log");
        let log = CriLog::create(&path).unwrap();
        let long = vec![b'x'; MAX_LINE * 2 + 10];
        log.write(Stream::Stdout, &long).unwrap();
        log.write(Stream::Stdout, b"\n").unwrap();
        let recs = records(&log, &path);
        let shape: Vec<_> = recs.iter().map(|r| (r.partial, r.text.len())).collect();
        assert_eq!(shape, [(true, MAX_LINE), (true, MAX_LINE), (false, 10)]);
    }

    #[test]
    fn a_reopen_sends_the_next_records_to_a_new_file_and_splits_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.log");
        let rotated = dir.path().join("0.log.20240102-030405");
        let log = CriLog::create(&path).unwrap();
        log.write(Stream::Stdout, b"one\ntw").unwrap();
        std::fs::rename(&path, &rotated).unwrap();
        log.write(Stream::Stdout, b"o\n").unwrap();
        log.reopen().unwrap();
        log.write(Stream::Stdout, b"thr").unwrap();
        log.write(Stream::Stdout, b"ee\n").unwrap();
        let texts = |p: &Path| -> Vec<String> {
            std::fs::read_to_string(p)
                .unwrap()
                .lines()
                .map(|l| parse_line(l).unwrap().text)
                .collect()
        };
        log.close().unwrap();
        assert_eq!(texts(&rotated), ["one", "two"]);
        assert_eq!(texts(&path), ["three"]);
        let unnamed = CriLog::from_file(tempfile::tempfile().unwrap());
        assert!(
            unnamed.reopen().is_err(),
            "a log opened elsewhere has no path"
        );
    }

    #[test]
    fn an_unterminated_last_line_is_written_full_on_close() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.log");
        let log = CriLog::create(&path).unwrap();
        log.write(Stream::Stdout, b"no newline").unwrap();
        let recs = records(&log, &path);
        assert_eq!(recs.len(), 1);
        assert!(!recs[0].partial);
        assert_eq!(recs[0].text, "no newline");
    }
}
