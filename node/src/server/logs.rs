//! Reading container logs for `/containerLogs/{ns}/{pod}/{container}`: the kubelet's
//! `ReadLogs` (`pkg/kubelet/kuberuntime/logs`). Start at [`LogOptions::from_query`]
//! (the request's query, validated as the API server and the kubelet do) and [`open`]
//! (the log file as a stream of the bytes `kubectl logs` prints).
//!
//! **Input.** The CRI log format, one record a line:
//! `<RFC 3339 time> <stdout|stderr> <tag> <content>\n`, where a tag of `P` (partial)
//! says the content continues in the next record of the stream, so its newline is not
//! part of the content. Lines in the older Docker JSON format
//! (`{"log":…,"stream":…,"time":…}`) are read too. A line that is neither is skipped
//! and logged at debug, without its content.
//!
//! **Output**, as the kubelet writes it: each record's content in file order, stdout
//! and stderr interleaved (or one of them with `stream=Stdout|Stderr`). A partial
//! record is written as soon as it is read, so the pieces of a long line join in the
//! output; with `timestamps=true` each record, a piece too, is preceded by its time in
//! the kubelet's fixed-width layout `2006-01-02T15:04:05.000000000Z07:00` (nine
//! fractional digits, the offset the runtime wrote, `Z` for UTC) and a space.
//! `tailLines=N` starts at the N-th last complete line of the file, found by reading
//! blocks back from its end; `sinceTime`/`sinceSeconds` skips records older than the
//! time; `limitBytes` stops after that many bytes, cutting the last line.
//!
//! **Rotation.** The container log manager renames `<dir>/<N>.log` to
//! `<N>.log.<YYYYMMDD-HHMMSS>` and the runtime creates a new `<N>.log`. As upstream, a
//! read that does not follow reads the current file only: `tailLines` never reaches
//! into a rotated file (so no `.gz` reader is needed). A follow continues across
//! rotations, which upstream does only loosely: when the file at the path is a new one
//! (another inode), the old file is read to its end once more (the runtime may still
//! have written to it after our last read) and then the new one from its start; when
//! the file was truncated in place (copytruncate), it is read again from its start.
//!
//! **Follow.** At the end of the file the reader waits for an inotify event on the
//! file's directory that names the file, with a check every second in case an event is
//! lost or inotify is unavailable; nothing else wakes it. It ends when the stream is
//! dropped (the client went away), or when the `ended` future given to [`open`]
//! resolves (the container stopped): it then reads what is left, across a rotation
//! too, and ends.
//!
//! **Where this differs from upstream**, on purpose: the format is chosen per line
//! rather than once from the first line (a bad first line does not fail the request);
//! a Docker JSON line with an unknown stream is skipped rather than failing the
//! request; a record longer than [`MAX_RECORD`] bytes is skipped (upstream buffers it
//! whole); a last line without a newline is written when a follow ends, as when a read
//! that does not follow reaches it.

use std::borrow::Cow;
use std::collections::HashMap;
use std::future::Future;
use std::io::{self, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use bytes::{Bytes, BytesMut};
use futures::{Stream, TryStreamExt};
use jiff::tz::Offset;
use jiff::{SignedDuration, Timestamp};
use notify::{RecursiveMode, Watcher};
use tokio::fs::File;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::sync::mpsc;

/// How far back `tailLines` reads at a time.
const TAIL_BLOCK: usize = 4096;
/// How much is read from the file at a time.
const READ_CHUNK: usize = 64 * 1024;
/// About how much output one item of the stream carries at most.
const OUT_CHUNK: usize = 64 * 1024;
/// The longest record kept in memory; a longer one is skipped. Runtimes split lines
/// into partial records long before this (containerd at 16 KiB by default).
pub const MAX_RECORD: usize = 1024 * 1024;
/// How often a follow looks at the file when no event came.
const POLL: Duration = Duration::from_secs(1);

/// Which of the container's streams to return (`PodLogOptions.stream`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum StreamFilter {
    #[default]
    All,
    Stdout,
    Stderr,
}

/// The options of a log request: `v1.PodLogOptions` as the kubelet uses them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogOptions {
    pub follow: bool,
    /// Start at the N-th last line of the file; `None` (or negative) for all.
    pub tail_lines: Option<i64>,
    /// Skip records older than this: from `sinceSeconds` or `sinceTime`.
    pub since_time: Option<Timestamp>,
    pub timestamps: bool,
    /// Stop after this many bytes of output; `None` for no limit (0 or less: none at all).
    pub limit_bytes: Option<i64>,
    /// The caller reads the previous instance's log file.
    pub previous: bool,
    pub stream: StreamFilter,
}

/// A log request's query that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionsError {
    /// A value is not of its parameter's type (the kubelet answers 400).
    #[error("unable to decode query: {}", .0.join("; "))]
    Decode(Vec<String>),
    /// The values do not go together or are out of range, as the API server's
    /// `ValidatePodLogOptions` words it (the kubelet answers 422).
    #[error("invalid request: {}", list(.0))]
    Invalid(Vec<String>),
}

impl OptionsError {
    /// The status the kubelet answers with.
    pub fn status(&self) -> StatusCode {
        match self {
            OptionsError::Decode(_) => StatusCode::BAD_REQUEST,
            OptionsError::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
        }
    }
}

/// An error list as `field.ErrorList.ToAggregate()` prints it.
fn list(errors: &[String]) -> String {
    match errors {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    }
}

impl LogOptions {
    /// Options from a raw query string (`tailLines=10&follow=true`), decoded as Go's
    /// `URL.Query()` does (a pair with a bad escape or a `;` is dropped).
    pub fn from_query(query: &str, now: Timestamp) -> Result<LogOptions, OptionsError> {
        LogOptions::from_pairs(query_pairs(query), now)
    }

    /// Options from decoded query pairs (axum's `Query<Vec<(String, String)>>`); the
    /// first value of a repeated parameter counts. `now` anchors `sinceSeconds`.
    ///
    /// As the kubelet's query decoding: a boolean is false only when absent, `false` or
    /// `0` (any case), and true for any other value, the empty one too; the legacy
    /// `tail` parameter stands for `tailLines`, `tail=all` for no limit; `sinceTime` is
    /// RFC 3339, and empty or `null` means none.
    pub fn from_pairs<K, V>(
        pairs: impl IntoIterator<Item = (K, V)>,
        now: Timestamp,
    ) -> Result<LogOptions, OptionsError>
    where
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut query: HashMap<String, String> = HashMap::new();
        for (key, value) in pairs {
            query
                .entry(key.as_ref().to_owned())
                .or_insert_with(|| value.as_ref().to_owned());
        }
        if let Some(tail) = query.get("tail").filter(|t| !t.is_empty()).cloned() {
            if tail == "all" {
                query.remove("tailLines");
            } else {
                query.insert("tailLines".into(), tail);
            }
        }

        let flag = |key: &str| {
            query
                .get(key)
                .is_some_and(|v| !v.eq_ignore_ascii_case("false") && v != "0")
        };
        let mut decode = Vec::new();
        let mut int = |key: &str| match query.get(key) {
            None => None,
            Some(v) => match v.parse::<i64>() {
                Ok(n) => Some(n),
                Err(_) => {
                    decode.push(format!("{key}: invalid value {v:?}: not an integer"));
                    None
                }
            },
        };
        let tail_lines = int("tailLines");
        let limit_bytes = int("limitBytes");
        let since_seconds = int("sinceSeconds");
        // `Some(None)`: given, but empty or `null` (Go's zero time).
        let since_time = match query.get("sinceTime").map(String::as_str) {
            None => None,
            Some("" | "null") => Some(None),
            Some(v) => match parse_time(v.as_bytes()) {
                Some((t, _)) => Some(Some(t)),
                None => {
                    decode.push(format!(
                        "sinceTime: invalid value {v:?}: not an RFC 3339 time"
                    ));
                    None
                }
            },
        };
        if !decode.is_empty() {
            return Err(OptionsError::Decode(decode));
        }

        let mut invalid = Vec::new();
        if let Some(n) = tail_lines.filter(|n| *n < 0) {
            invalid.push(format!(
                "tailLines: Invalid value: {n}: must be greater than or equal to 0"
            ));
        }
        if let Some(n) = limit_bytes.filter(|n| *n < 1) {
            invalid.push(format!(
                "limitBytes: Invalid value: {n}: must be greater than 0"
            ));
        }
        match (since_seconds, since_time) {
            (Some(_), Some(_)) => invalid.push(
                "Forbidden: at most one of `sinceTime` or `sinceSeconds` may be specified".into(),
            ),
            (Some(n), None) if n < 1 => {
                invalid.push(format!(
                    "sinceSeconds: Invalid value: {n}: must be greater than 0"
                ));
            }
            _ => {}
        }
        let stream = match query.get("stream").map(String::as_str) {
            None | Some("All") => StreamFilter::All,
            Some("Stdout") => StreamFilter::Stdout,
            Some("Stderr") => StreamFilter::Stderr,
            Some(other) => {
                invalid.push(format!(
                    "stream: Unsupported value: {other:?}: supported values: \"All\", \"Stderr\", \"Stdout\""
                ));
                StreamFilter::All
            }
        };
        if stream != StreamFilter::All && tail_lines.is_some() {
            invalid.push(
                "Forbidden: `tailLines` and specific `stream` are mutually exclusive for now"
                    .into(),
            );
        }
        if !invalid.is_empty() {
            return Err(OptionsError::Invalid(invalid));
        }

        // As the kubelet's NewLogOptions: the later of the two.
        let mut since = since_seconds.map(|s| {
            now.checked_sub(SignedDuration::from_secs(s))
                .unwrap_or(Timestamp::MIN)
        });
        if let Some(Some(t)) = since_time
            && since.is_none_or(|s| t > s)
        {
            since = Some(t);
        }
        Ok(LogOptions {
            follow: flag("follow"),
            tail_lines,
            since_time: since,
            timestamps: flag("timestamps"),
            limit_bytes,
            previous: flag("previous"),
            stream,
        })
    }
}

/// Go's `QueryUnescape`: `+` is a space, `%XX` a byte; `None` for a bad escape.
/// A raw query's pairs, decoded as Go's `URL.Query()` does: `+` is a space, `%XX` a
/// byte, and a pair with a bad escape or a `;` is dropped.
pub(crate) fn query_pairs(query: &str) -> impl Iterator<Item = (String, String)> + '_ {
    query
        .split('&')
        .filter(|pair| !pair.is_empty() && !pair.contains(';'))
        .filter_map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            Some((unescape(key)?, unescape(value)?))
        })
}

fn unescape(s: &str) -> Option<String> {
    fn hex(b: u8) -> Option<u8> {
        (b as char).to_digit(16).map(|d| d as u8)
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b'%' => {
                let h = bytes.get(i + 1..i + 3)?;
                out.push((hex(h[0])? << 4) | hex(h[1])?);
                i += 3;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    Some(String::from_utf8_lossy(&out).into_owned())
}

/// The stream a record was written to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Stdout,
    Stderr,
}

/// One parsed line of a log file.
#[derive(Debug, PartialEq, Eq)]
struct Record<'a> {
    time: Timestamp,
    /// The offset the time was written with, kept for the output.
    offset: Offset,
    source: Source,
    /// What the container wrote, with its newline unless the record is partial.
    content: Cow<'a, [u8]>,
}

/// A line of either format (with or without its newline).
fn parse_record(line: &[u8]) -> Result<Record<'_>, &'static str> {
    if line.first() == Some(&b'{') {
        parse_docker_json(line)
    } else {
        parse_cri(line)
    }
}

/// `2016-10-06T00:17:09.669794202Z stdout P content`.
fn parse_cri(line: &[u8]) -> Result<Record<'_>, &'static str> {
    fn space(b: &[u8]) -> Option<usize> {
        b.iter().position(|&c| c == b' ')
    }
    let i = space(line).ok_or("timestamp is not found")?;
    let (time, offset) = parse_time(&line[..i]).ok_or("unexpected timestamp format")?;
    let rest = &line[i + 1..];
    let i = space(rest).ok_or("stream type is not found")?;
    let source = match &rest[..i] {
        b"stdout" => Source::Stdout,
        b"stderr" => Source::Stderr,
        _ => return Err("unexpected stream type"),
    };
    let mut rest = &rest[i + 1..];
    let i = space(rest).ok_or("log tag is not found")?;
    // Tags are `:`-separated, the first one says partial or full.
    let partial = rest[..i].split(|&c| c == b':').next() == Some(b"P");
    if partial && rest.last() == Some(&b'\n') {
        rest = &rest[..rest.len() - 1];
    }
    Ok(Record {
        time,
        offset,
        source,
        content: Cow::Borrowed(&rest[i + 1..]),
    })
}

/// `{"log":"content\n","stream":"stdout","time":"2016-10-20T18:39:20.57606443Z"}`.
fn parse_docker_json(line: &[u8]) -> Result<Record<'static>, &'static str> {
    #[derive(serde::Deserialize)]
    struct Line {
        #[serde(default)]
        log: String,
        stream: String,
        time: String,
    }
    let l: Line = serde_json::from_slice(line).map_err(|_| "not a Docker JSON log line")?;
    let (time, offset) = parse_time(l.time.as_bytes()).ok_or("unexpected timestamp format")?;
    let source = match l.stream.as_str() {
        "stdout" => Source::Stdout,
        "stderr" => Source::Stderr,
        _ => return Err("unexpected stream type"),
    };
    Ok(Record {
        time,
        offset,
        source,
        content: Cow::Owned(l.log.into_bytes()),
    })
}

/// A time in Go's `2006-01-02T15:04:05.999999999Z07:00` (what the kubelet parses log
/// times and `sinceTime` with): fractional seconds optional, of any length (digits past
/// the ninth are dropped), `.` or `,` before them; `Z` or `±hh:mm`.
fn parse_time(s: &[u8]) -> Option<(Timestamp, Offset)> {
    fn num(b: &[u8]) -> Option<i32> {
        b.iter().try_fold(0i32, |n, &c| {
            c.is_ascii_digit().then(|| n * 10 + i32::from(c - b'0'))
        })
    }
    fn lit(s: &[u8], i: usize, c: u8) -> Option<()> {
        (s.get(i) == Some(&c)).then_some(())
    }
    let head = s.get(..19)?;
    lit(head, 4, b'-')?;
    lit(head, 7, b'-')?;
    lit(head, 10, b'T')?;
    lit(head, 13, b':')?;
    lit(head, 16, b':')?;
    let year = num(&head[0..4])?;
    let [month, day, hour, minute, second] =
        [5, 8, 11, 14, 17].map(|i| num(&head[i..i + 2]).unwrap_or(-1));
    let mut rest = &s[19..];
    let mut nanos = 0;
    if matches!(rest.first(), Some(b'.' | b',')) {
        let digits = rest[1..].iter().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 {
            return None;
        }
        let kept = &rest[1..1 + digits.min(9)];
        nanos = num(kept)? * 10i32.pow(9 - kept.len() as u32);
        rest = &rest[1 + digits..];
    }
    let offset = match rest {
        b"Z" => Offset::UTC,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let (h, m) = (num(&[*h1, *h2])?, num(&[*m1, *m2])?);
            if h >= 24 || m >= 60 {
                return None;
            }
            let secs = h * 3600 + m * 60;
            Offset::from_seconds(if *sign == b'-' { -secs } else { secs }).ok()?
        }
        _ => return None,
    };
    let narrow = |n: i32| i8::try_from(n).ok();
    let datetime = jiff::civil::DateTime::new(
        i16::try_from(year).ok()?,
        narrow(month)?,
        narrow(day)?,
        narrow(hour)?,
        narrow(minute)?,
        narrow(second)?,
        nanos,
    )
    .ok()?;
    Some((offset.to_timestamp(datetime).ok()?, offset))
}

/// Go's `Format("2006-01-02T15:04:05.000000000Z07:00")` of a time in `offset`.
fn format_time(time: Timestamp, offset: Offset) -> String {
    let dt = offset.to_datetime(time);
    let mut s = format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:09}",
        dt.year(),
        dt.month(),
        dt.day(),
        dt.hour(),
        dt.minute(),
        dt.second(),
        dt.subsec_nanosecond()
    );
    let secs = offset.seconds();
    if secs == 0 {
        s.push('Z');
    } else {
        let sign = if secs < 0 { '-' } else { '+' };
        let abs = secs.unsigned_abs();
        s.push_str(&format!("{sign}{:02}:{:02}", abs / 3600, abs / 60 % 60));
    }
    s
}

/// The offset of the N-th last complete line, reading back from the end in blocks: the
/// kubelet's `tail.FindTailLineStartIndex`. A last line without a newline does not count.
async fn tail_start(file: &mut File, n: u64) -> io::Result<u64> {
    let size = file.seek(SeekFrom::End(0)).await?;
    let mut block = vec![0; TAIL_BLOCK];
    let (mut left, mut right, mut len, mut count) = (size, size, 0, 0u64);
    while right > 0 && count <= n {
        left = right.saturating_sub(TAIL_BLOCK as u64);
        len = (right - left) as usize;
        file.seek(SeekFrom::Start(left)).await?;
        file.read_exact(&mut block[..len]).await?;
        count += block[..len].iter().filter(|&&b| b == b'\n').count() as u64;
        right = left;
    }
    // Skip the lines before the N-th last: all of them are in the leftmost block read.
    let mut rest = &block[..len];
    while count > n {
        let i = rest
            .iter()
            .position(|&b| b == b'\n')
            .map_or(rest.len(), |i| i + 1);
        rest = &rest[i..];
        left += i as u64;
        count -= 1;
    }
    Ok(left)
}

/// Opens the log file at `path` (symlinks resolved, as upstream) and positions it for
/// `opts.tail_lines`; the stream then yields the output `kubectl logs` prints. Errors
/// opening the file come here (`NotFound` for a missing file), errors reading it later
/// as the stream's last item. When `opts.follow` is set, the stream ends once `ended`
/// resolved and what was written before is read; without it, `ended` is not used.
pub async fn open(
    path: impl AsRef<Path>,
    opts: &LogOptions,
    ended: impl Future<Output = ()> + Send + 'static,
) -> io::Result<LogStream> {
    let tuning = Tuning {
        poll: POLL,
        probe: None,
        parked: None,
    };
    open_tuned(path.as_ref(), opts, Box::pin(ended), tuning).await
}

/// [`open`], deferred: an error opening the file is the stream's only item.
pub fn stream(
    path: PathBuf,
    opts: LogOptions,
    ended: impl Future<Output = ()> + Send + 'static,
) -> LogStream {
    Box::pin(futures::stream::once(async move { open(&path, &opts, ended).await }).try_flatten())
}

/// The output of a log file, in pieces of up to about 64 KiB. A follow yields what it
/// read whenever it reaches the end of the file.
pub type LogStream = Pin<Box<dyn Stream<Item = io::Result<Bytes>> + Send + 'static>>;

/// What tests change.
struct Tuning {
    poll: Duration,
    /// Held by the inotify handler while it lives.
    probe: Option<Arc<()>>,
    /// Notified whenever the follow waits for the file.
    parked: Option<Arc<tokio::sync::Notify>>,
}

type Ended = Pin<Box<dyn Future<Output = ()> + Send>>;

async fn open_tuned(
    path: &Path,
    opts: &LogOptions,
    ended: Ended,
    tuning: Tuning,
) -> io::Result<LogStream> {
    Ok(Reader::open(path, opts, ended, tuning).await?.into_stream())
}

impl Reader {
    /// Opens the file at `path`, positioned for the tail.
    async fn open(
        path: &Path,
        opts: &LogOptions,
        ended: Ended,
        tuning: Tuning,
    ) -> io::Result<Reader> {
        let context = |what: &str, e: io::Error| {
            io::Error::new(e.kind(), format!("{what} log file {}: {e}", path.display()))
        };
        let path = tokio::fs::canonicalize(path)
            .await
            .map_err(|e| context("cannot resolve", e))?;
        let mut file = File::open(&path)
            .await
            .map_err(|e| context("cannot open", e))?;
        let meta = file
            .metadata()
            .await
            .map_err(|e| context("cannot stat", e))?;
        let start = match opts.tail_lines.filter(|n| *n >= 0) {
            Some(n) => tail_start(&mut file, n as u64)
                .await
                .map_err(|e| context("cannot tail", e))?,
            None => 0,
        };
        file.seek(SeekFrom::Start(start))
            .await
            .map_err(|e| context("cannot seek in", e))?;
        // Upstream stops after N lines only when not following.
        let remain_lines = (!opts.follow)
            .then_some(opts.tail_lines)
            .flatten()
            .filter(|n| *n >= 0)
            .map(|n| n as u64);
        let remain_bytes = opts.limit_bytes.map(|n| n.max(0) as u64);
        Ok(Reader {
            done: remain_lines == Some(0) || remain_bytes == Some(0),
            path,
            file,
            id: (meta.dev(), meta.ino()),
            read_pos: start,
            buf: BytesMut::new(),
            skipping: false,
            since: opts.since_time,
            timestamps: opts.timestamps,
            wanted: opts.stream,
            remain_lines,
            remain_bytes,
            follow: opts.follow.then(|| Follow {
                ended_future: ended,
                ended: false,
                watch: None,
                watch_tried: false,
                poll: tuning.poll,
                probe: tuning.probe,
                parked: tuning.parked,
            }),
        })
    }

    /// The output, item by item; a read error is the last item.
    fn into_stream(self) -> LogStream {
        Box::pin(futures::stream::unfold(self, |mut reader| async move {
            match reader.next_chunk().await {
                Ok(Some(chunk)) => Some((Ok(chunk), reader)),
                Ok(None) => None,
                Err(e) => {
                    reader.done = true;
                    let e = io::Error::new(
                        e.kind(),
                        format!("cannot read log file {}: {e}", reader.path.display()),
                    );
                    Some((Err(e), reader))
                }
            }
        }))
    }
}

/// The state of one log stream.
struct Reader {
    /// The log file's path, symlinks resolved.
    path: PathBuf,
    file: File,
    /// Device and inode of `file`, to tell a rotation.
    id: (u64, u64),
    /// The offset in `file` up to which it was read into `buf`.
    read_pos: u64,
    /// Read and not yet taken as lines: at most a chunk and a record.
    buf: BytesMut,
    /// Discarding a record longer than [`MAX_RECORD`] up to its newline.
    skipping: bool,
    since: Option<Timestamp>,
    timestamps: bool,
    wanted: StreamFilter,
    remain_lines: Option<u64>,
    remain_bytes: Option<u64>,
    follow: Option<Follow>,
    done: bool,
}

/// The state of a follow.
struct Follow {
    ended_future: Ended,
    /// `ended_future` resolved: read to the end, then stop.
    ended: bool,
    watch: Option<Watch>,
    watch_tried: bool,
    poll: Duration,
    probe: Option<Arc<()>>,
    parked: Option<Arc<tokio::sync::Notify>>,
}

/// An inotify watch on the log file's directory, waking on events naming the file.
struct Watch {
    _watcher: notify::RecommendedWatcher,
    wake: mpsc::Receiver<()>,
}

impl Reader {
    /// The next piece of output, `None` at the end.
    async fn next_chunk(&mut self) -> io::Result<Option<Bytes>> {
        let mut out = BytesMut::new();
        while !self.done {
            self.take_lines(&mut out);
            if self.done || out.len() >= OUT_CHUNK {
                break;
            }
            if self.fill().await? > 0 {
                continue;
            }
            // At the end of what was written so far: hand over what is read first.
            if !out.is_empty() {
                break;
            }
            if self.follow.is_none() {
                self.finish(&mut out);
                break;
            }
            if self.reopen_if_rotated().await? {
                continue;
            }
            let follow = self.follow.as_mut().expect("following");
            if follow.ended {
                self.finish(&mut out);
                break;
            }
            if !follow.watch_tried {
                follow.watch_tried = true;
                follow.watch = Watch::start(&self.path, follow.probe.take());
                // Read again: a write before the watch began made no event.
                continue;
            }
            follow.wait().await;
        }
        Ok((!out.is_empty()).then(|| out.freeze()))
    }

    /// Reads the next chunk of the file into `buf`; 0 at its end.
    async fn fill(&mut self) -> io::Result<usize> {
        self.buf.reserve(READ_CHUNK);
        let n = (&mut self.file)
            .take(READ_CHUNK as u64)
            .read_buf(&mut self.buf)
            .await?;
        self.read_pos += n as u64;
        Ok(n)
    }

    /// Writes the complete lines in `buf` to `out`, up to about [`OUT_CHUNK`].
    fn take_lines(&mut self, out: &mut BytesMut) {
        while let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
            let line = self.buf.split_to(i + 1);
            if self.skipping {
                self.skipping = false;
                continue;
            }
            self.write(&line, out);
            if self.done || out.len() >= OUT_CHUNK {
                return;
            }
        }
        if self.buf.len() > MAX_RECORD {
            tracing::warn!(path = %self.path.display(), "skipping a log record longer than {MAX_RECORD} bytes");
            self.buf.clear();
            self.skipping = true;
        }
    }

    /// The end: what is left in `buf` is a last line without its newline.
    fn finish(&mut self, out: &mut BytesMut) {
        if !self.skipping && !self.buf.is_empty() && !self.done {
            let line = self.buf.split();
            self.write(&line, out);
        }
        self.done = true;
    }

    /// Writes one line's record to `out` as the options say.
    fn write(&mut self, line: &[u8], out: &mut BytesMut) {
        let record = match parse_record(line) {
            Ok(record) => record,
            Err(why) => {
                tracing::debug!(path = %self.path.display(), "skipping a malformed log line: {why}");
                return;
            }
        };
        let wanted = match self.wanted {
            StreamFilter::All => true,
            StreamFilter::Stdout => record.source == Source::Stdout,
            StreamFilter::Stderr => record.source == Source::Stderr,
        };
        if wanted && self.since.is_none_or(|since| record.time >= since) {
            let prefix = if self.timestamps {
                format_time(record.time, record.offset) + " "
            } else {
                String::new()
            };
            let total = prefix.len() + record.content.len();
            let allowed = self.remain_bytes.map_or(total, |r| {
                total.min(usize::try_from(r).unwrap_or(usize::MAX))
            });
            let from_prefix = prefix.len().min(allowed);
            out.extend_from_slice(&prefix.as_bytes()[..from_prefix]);
            out.extend_from_slice(&record.content[..allowed - from_prefix]);
            if let Some(remain) = &mut self.remain_bytes {
                *remain -= allowed as u64;
                if *remain == 0 {
                    self.done = true;
                }
            }
        }
        // A record skipped for its time still counts as one of the tail's lines.
        if let Some(remain) = &mut self.remain_lines {
            *remain -= 1;
            if *remain == 0 {
                self.done = true;
            }
        }
    }

    /// At the end of the file while following: whether it was rotated or truncated
    /// and the reader moved, so that reading goes on.
    async fn reopen_if_rotated(&mut self) -> io::Result<bool> {
        let meta = match tokio::fs::metadata(&self.path).await {
            Ok(meta) => meta,
            // Renamed, and the new file is not there yet.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        };
        if (meta.dev(), meta.ino()) == self.id {
            if meta.len() < self.read_pos {
                tracing::debug!(path = %self.path.display(), "log file truncated, reading it from its start");
                self.file.seek(SeekFrom::Start(0)).await?;
                self.read_pos = 0;
                self.buf.clear();
                self.skipping = false;
                return Ok(true);
            }
            return Ok(false);
        }
        // A new file is at the path. The runtime may have written to the old one after
        // our last read and before it reopened: read that first.
        if self.fill().await? > 0 {
            return Ok(true);
        }
        let file = match File::open(&self.path).await {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        };
        let meta = file.metadata().await?;
        tracing::debug!(path = %self.path.display(), "log file rotated, following the new one");
        if !self.buf.is_empty() && !self.skipping {
            tracing::debug!(path = %self.path.display(), "dropping an unfinished last line of the rotated log file");
        }
        self.file = file;
        self.id = (meta.dev(), meta.ino());
        self.read_pos = 0;
        self.buf.clear();
        self.skipping = false;
        Ok(true)
    }
}

impl Follow {
    /// Waits for an event on the file, the poll period, or the end of the container.
    async fn wait(&mut self) {
        enum Woke {
            Ended,
            Event,
            WatchGone,
            Poll,
        }
        if let Some(parked) = &self.parked {
            parked.notify_one();
        }
        let watch = &mut self.watch;
        let event = async {
            match watch {
                Some(w) => w.wake.recv().await.is_some(),
                None => std::future::pending().await,
            }
        };
        let woke = tokio::select! {
            () = self.ended_future.as_mut() => Woke::Ended,
            alive = event => if alive { Woke::Event } else { Woke::WatchGone },
            () = tokio::time::sleep(self.poll) => Woke::Poll,
        };
        match woke {
            Woke::Ended => self.ended = true,
            // The watcher's thread ended: poll from now on rather than spin.
            Woke::WatchGone => self.watch = None,
            Woke::Event | Woke::Poll => {}
        }
    }
}

impl Watch {
    /// Watches the directory of `path`; `None` (polling only) when inotify cannot.
    fn start(path: &Path, probe: Option<Arc<()>>) -> Option<Watch> {
        let (dir, name) = (path.parent()?, path.file_name()?.to_owned());
        let (tx, rx) = mpsc::channel(1);
        let handler = move |res: notify::Result<notify::Event>| {
            let _alive = &probe;
            let wake = match res {
                Ok(event) => {
                    event.need_rescan()
                        || (is_change(&event.kind)
                            && event.paths.iter().any(|p| p.file_name() == Some(&name)))
                }
                Err(_) => true,
            };
            if wake {
                // Full means a wake-up is already pending.
                let _ = tx.try_send(());
            }
        };
        let mut watcher = match notify::recommended_watcher(handler) {
            Ok(watcher) => watcher,
            Err(e) => {
                tracing::warn!(path = %path.display(), "inotify unavailable, following the log by polling: {e}");
                return None;
            }
        };
        if let Err(e) = watcher.watch(dir, RecursiveMode::NonRecursive) {
            tracing::warn!(path = %path.display(), "cannot watch the log directory, following the log by polling: {e}");
            return None;
        }
        Some(Watch {
            _watcher: watcher,
            wake: rx,
        })
    }
}

/// Whether an event can mean the file grew or was replaced: opening and reading it
/// (our own reads) cannot.
fn is_change(kind: &notify::EventKind) -> bool {
    use notify::EventKind;
    use notify::event::{AccessKind, AccessMode};
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use std::future::pending;
    use std::io::Write as _;

    use futures::StreamExt;
    use tokio_util::sync::CancellationToken;

    use super::*;

    const DEADLINE: Duration = Duration::from_secs(10);

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn now() -> Timestamp {
        ts("2024-01-02T03:04:05Z")
    }

    fn record(time: &str, stream: &str, tag: &str, content: &str) -> String {
        format!("{time} {stream} {tag} {content}\n")
    }

    fn append(path: &Path, text: &str) {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        f.write_all(text.as_bytes()).unwrap();
    }

    fn log_file(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.log");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    async fn read_all(path: &Path, opts: LogOptions) -> String {
        let stream = open(path, &opts, pending()).await.unwrap();
        let chunks: Vec<Bytes> = stream.try_collect().await.unwrap();
        String::from_utf8(chunks.concat()).unwrap()
    }

    /// The next item of a follow, within the deadline.
    async fn next_text<S>(stream: &mut S) -> Option<String>
    where
        S: Stream<Item = io::Result<Bytes>> + Unpin,
    {
        let item = tokio::time::timeout(DEADLINE, stream.next())
            .await
            .expect("no output before the deadline");
        item.map(|chunk| String::from_utf8(chunk.unwrap().to_vec()).unwrap())
    }

    /// A follow driven by a test, which can tell when the reader waits for the file.
    struct Follower {
        stream: LogStream,
        parked: Arc<tokio::sync::Notify>,
        probe: Arc<()>,
        got: String,
    }

    impl Follower {
        async fn start(
            path: &Path,
            opts: LogOptions,
            ended: impl Future<Output = ()> + Send + 'static,
            poll: Duration,
        ) -> Follower {
            let parked = Arc::new(tokio::sync::Notify::new());
            let probe = Arc::new(());
            let tuning = Tuning {
                poll,
                probe: Some(probe.clone()),
                parked: Some(parked.clone()),
            };
            let opts = LogOptions {
                follow: true,
                ..opts
            };
            let stream = open_tuned(path, &opts, Box::pin(ended), tuning)
                .await
                .unwrap();
            Follower {
                stream,
                parked,
                probe,
                got: String::new(),
            }
        }

        /// Drives the stream until the reader waits for the file (or has waited since
        /// the last call), keeping what it writes meanwhile.
        async fn until_parked(&mut self) {
            tokio::time::timeout(DEADLINE, async {
                loop {
                    tokio::select! {
                        biased;
                        () = self.parked.notified() => return,
                        item = self.stream.next() => {
                            let chunk = item.expect("the stream ended").unwrap();
                            self.got.push_str(std::str::from_utf8(&chunk).unwrap());
                        }
                    }
                }
            })
            .await
            .expect("the reader did not wait for the file before the deadline");
        }

        /// Reads until the output ends with `want`.
        async fn until(&mut self, want: &str) {
            while !self.got.ends_with(want) {
                let chunk = next_text(&mut self.stream)
                    .await
                    .expect("the stream ended early");
                self.got.push_str(&chunk);
            }
        }

        /// Reads to the end of the stream.
        async fn read_to_end(&mut self) {
            while let Some(chunk) = next_text(&mut self.stream).await {
                self.got.push_str(&chunk);
            }
        }
    }

    /// Longer than any test: only an inotify event can wake the reader.
    const NO_POLL: Duration = Duration::from_secs(3600);

    #[test]
    fn cri_records_parse() {
        let r = parse_record(b"2016-10-06T00:17:09.669794202Z stdout F log content 1\n").unwrap();
        assert_eq!(r.source, Source::Stdout);
        assert_eq!(r.time, ts("2016-10-06T00:17:09.669794202Z"));
        assert_eq!(&*r.content, b"log content 1\n");
        // A partial record's newline is not content; further tags are ignored.
        let r = parse_record(b"2016-10-06T00:17:09.669794203Z stderr P:x part\n").unwrap();
        assert_eq!(r.source, Source::Stderr);
        assert_eq!(&*r.content, b"part");
        // Empty content, and content with spaces kept as is.
        assert_eq!(
            &*parse_record(b"2016-10-06T00:17:09Z stdout F \n")
                .unwrap()
                .content,
            b"\n"
        );
        assert_eq!(
            &*parse_record(b"2016-10-06T00:17:09Z stdout F  a  b\n")
                .unwrap()
                .content,
            b" a  b\n"
        );
        for bad in [
            &b"garbage\n"[..],
            b"2016-10-06T00:17:09Z\n",
            b"2016-10-06T00:17:09Z stdin F x\n",
            b"2016-10-06T00:17:09Z stdout F\n",
            b"not-a-time stdout F x\n",
            b"{\"log\":\"x\"}\n",
            b"{broken\n",
        ] {
            assert!(
                parse_record(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn docker_json_records_parse() {
        let r = parse_record(
            br#"{"log":"content \"1\"\n","stream":"stderr","time":"2016-10-20T18:39:20.57606443Z"}
"#,
        )
        .unwrap();
        assert_eq!(r.source, Source::Stderr);
        assert_eq!(r.time, ts("2016-10-20T18:39:20.57606443Z"));
        assert_eq!(&*r.content, b"content \"1\"\n");
    }

    #[test]
    fn times_parse_as_go_lenient_rfc3339() {
        let cases = [
            ("2024-01-02T03:04:05Z", Some(("2024-01-02T03:04:05Z", 0))),
            (
                "2024-01-02T03:04:05.1Z",
                Some(("2024-01-02T03:04:05.1Z", 0)),
            ),
            (
                "2024-01-02T03:04:05,25Z",
                Some(("2024-01-02T03:04:05.25Z", 0)),
            ),
            (
                "2024-01-02T03:04:05.1234567899Z",
                Some(("2024-01-02T03:04:05.123456789Z", 0)),
            ),
            (
                "2024-01-02T05:04:05.5+02:00",
                Some(("2024-01-02T03:04:05.5Z", 7200)),
            ),
            (
                "2024-01-01T22:34:05-04:30",
                Some(("2024-01-02T03:04:05Z", -16200)),
            ),
            ("2024-01-02t03:04:05Z", None),
            ("2024-01-02T03:04:05z", None),
            ("2024-01-02T03:04:05", None),
            ("2024-01-02T03:04:05.Z", None),
            ("2024-02-30T03:04:05Z", None),
            ("2024-01-02T24:04:05Z", None),
            ("2024-01-02T03:04:60Z", None),
            ("2024-01-02T03:04:05+0200", None),
            ("2024-1-02T03:04:05Z", None),
        ];
        for (input, want) in cases {
            let got = parse_time(input.as_bytes()).map(|(t, o)| (t, o.seconds()));
            assert_eq!(got, want.map(|(t, o)| (ts(t), o)), "{input}");
        }
    }

    #[test]
    fn timestamps_format_fixed_width_as_upstream() {
        // types.RFC3339NanoFixed: nine digits always, the written offset, Z for UTC.
        let cases = [
            (
                "2024-01-02T03:04:05.100000000Z",
                "2024-01-02T03:04:05.100000000Z",
            ),
            ("2024-01-02T03:04:05.1Z", "2024-01-02T03:04:05.100000000Z"),
            ("2024-01-02T03:04:05Z", "2024-01-02T03:04:05.000000000Z"),
            (
                "2024-01-02T03:04:05.000000001+00:00",
                "2024-01-02T03:04:05.000000001Z",
            ),
            (
                "2024-01-02T05:04:05.5+02:00",
                "2024-01-02T05:04:05.500000000+02:00",
            ),
            (
                "2024-01-01T22:34:05-04:30",
                "2024-01-01T22:34:05.000000000-04:30",
            ),
        ];
        for (input, want) in cases {
            let (t, o) = parse_time(input.as_bytes()).unwrap();
            assert_eq!(format_time(t, o), want, "{input}");
        }
    }

    #[tokio::test]
    async fn partial_records_join_and_streams_interleave_in_file_order() {
        let text = [
            record("2024-01-02T03:04:01Z", "stdout", "P", "hel"),
            record("2024-01-02T03:04:02Z", "stdout", "P", "lo "),
            record("2024-01-02T03:04:03Z", "stdout", "F", "world"),
            record("2024-01-02T03:04:04Z", "stderr", "F", "oops"),
            "malformed line\n".into(),
            record("2024-01-02T03:04:05Z", "stdout", "F", "again"),
            r#"{"log":"json\n","stream":"stderr","time":"2024-01-02T03:04:06Z"}"#.to_owned() + "\n",
        ]
        .concat();
        let (_dir, path) = log_file(&text);
        assert_eq!(
            read_all(&path, LogOptions::default()).await,
            "hello world\noops\nagain\njson\n"
        );
        let stderr = LogOptions {
            stream: StreamFilter::Stderr,
            ..Default::default()
        };
        assert_eq!(read_all(&path, stderr).await, "oops\njson\n");
        let stdout = LogOptions {
            stream: StreamFilter::Stdout,
            ..Default::default()
        };
        assert_eq!(read_all(&path, stdout).await, "hello world\nagain\n");
    }

    #[tokio::test]
    async fn timestamps_prefix_every_record() {
        let text = [
            record("2024-01-02T03:04:05.100000000Z", "stdout", "P", "a"),
            record("2024-01-02T03:04:06.1+01:00", "stderr", "F", "b"),
        ]
        .concat();
        let (_dir, path) = log_file(&text);
        let opts = LogOptions {
            timestamps: true,
            ..Default::default()
        };
        assert_eq!(
            read_all(&path, opts).await,
            "2024-01-02T03:04:05.100000000Z a2024-01-02T03:04:06.100000000+01:00 b\n"
        );
    }

    #[tokio::test]
    async fn last_line_without_newline_is_written() {
        let text = record("2024-01-02T03:04:01Z", "stdout", "F", "one")
            + "2024-01-02T03:04:02Z stdout F two";
        let (_dir, path) = log_file(&text);
        assert_eq!(read_all(&path, LogOptions::default()).await, "one\ntwo");
    }

    /// Lines of varied length, so that they straddle the tail's blocks and the reads.
    fn many_lines(count: usize) -> (Vec<String>, String) {
        let contents: Vec<String> = (0..count)
            .map(|i| format!("line {i} {}", "x".repeat(i * 37 % 211)))
            .collect();
        let text = contents
            .iter()
            .map(|c| record("2024-01-02T03:04:05.123Z", "stdout", "F", c))
            .collect();
        (contents, text)
    }

    #[tokio::test]
    async fn tail_counts_lines_from_the_end_across_blocks() {
        let (contents, text) = many_lines(3000);
        assert!(text.len() > 20 * TAIL_BLOCK && text.len() > 2 * READ_CHUNK);
        let (_dir, path) = log_file(&text);
        for n in [0usize, 1, 2, 7, 100, 2999, 3000, 3001, 100_000] {
            let opts = LogOptions {
                tail_lines: Some(n as i64),
                ..Default::default()
            };
            let want: String = contents[contents.len().saturating_sub(n)..]
                .iter()
                .map(|c| format!("{c}\n"))
                .collect();
            assert_eq!(read_all(&path, opts).await, want, "tailLines={n}");
        }
        // The whole file, through many reads.
        let all: String = contents.iter().map(|c| format!("{c}\n")).collect();
        assert_eq!(read_all(&path, LogOptions::default()).await, all);
    }

    #[tokio::test]
    async fn tail_does_not_count_an_unfinished_last_line() {
        let text = [
            record("2024-01-02T03:04:01Z", "stdout", "F", "a"),
            record("2024-01-02T03:04:02Z", "stdout", "F", "b"),
            "2024-01-02T03:04:03Z stdout F c".into(),
        ]
        .concat();
        let (_dir, path) = log_file(&text);
        let tail = |n| LogOptions {
            tail_lines: Some(n),
            ..Default::default()
        };
        assert_eq!(read_all(&path, tail(0)).await, "");
        assert_eq!(read_all(&path, tail(1)).await, "b\n");
        assert_eq!(read_all(&path, tail(5)).await, "a\nb\nc");
        let (_empty_dir, empty) = log_file("");
        assert_eq!(read_all(&empty, tail(3)).await, "");
    }

    #[tokio::test]
    async fn since_keeps_records_at_or_after_it() {
        let text = [
            record("2024-01-02T03:04:04.999999999Z", "stdout", "F", "before"),
            record("2024-01-02T03:04:05Z", "stdout", "F", "at"),
            record("2024-01-02T05:04:06+02:00", "stderr", "F", "after"),
        ]
        .concat();
        let (_dir, path) = log_file(&text);
        let opts = LogOptions {
            since_time: Some(ts("2024-01-02T03:04:05Z")),
            ..Default::default()
        };
        assert_eq!(read_all(&path, opts).await, "at\nafter\n");
        // The tail picks the lines first; since filters them.
        let opts = LogOptions {
            since_time: Some(ts("2024-01-02T03:04:05Z")),
            tail_lines: Some(2),
            ..Default::default()
        };
        assert_eq!(read_all(&path, opts).await, "at\nafter\n");
        let opts = LogOptions {
            since_time: Some(ts("2024-01-02T03:04:06Z")),
            tail_lines: Some(2),
            ..Default::default()
        };
        assert_eq!(read_all(&path, opts).await, "after\n");
    }

    #[tokio::test]
    async fn limit_bytes_cuts_mid_line() {
        let text = [
            record("2024-01-02T03:04:05Z", "stdout", "F", "hello"),
            record("2024-01-02T03:04:06Z", "stdout", "F", "world"),
        ]
        .concat();
        let (_dir, path) = log_file(&text);
        let limit = |n, timestamps| LogOptions {
            limit_bytes: Some(n),
            timestamps,
            ..Default::default()
        };
        assert_eq!(read_all(&path, limit(8, false)).await, "hello\nwo");
        assert_eq!(read_all(&path, limit(6, false)).await, "hello\n");
        assert_eq!(read_all(&path, limit(1000, false)).await, "hello\nworld\n");
        // The prefix counts and can be cut too.
        assert_eq!(read_all(&path, limit(10, true)).await, "2024-01-02");
        assert_eq!(
            read_all(&path, limit(33, true)).await,
            "2024-01-02T03:04:05.000000000Z he"
        );
    }

    #[tokio::test]
    async fn oversized_records_are_skipped() {
        let text = [
            record("2024-01-02T03:04:05Z", "stdout", "F", "small"),
            record(
                "2024-01-02T03:04:06Z",
                "stdout",
                "F",
                &"y".repeat(MAX_RECORD + READ_CHUNK),
            ),
            record("2024-01-02T03:04:07Z", "stdout", "F", "after"),
        ]
        .concat();
        let (_dir, path) = log_file(&text);
        assert_eq!(
            read_all(&path, LogOptions::default()).await,
            "small\nafter\n"
        );
    }

    #[tokio::test]
    async fn missing_file_fails_to_open() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("0.log");
        let err = open(&missing, &LogOptions::default(), pending())
            .await
            .err()
            .unwrap();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(err.to_string().contains("0.log"), "{err}");
        // The deferred form says so as its one item.
        let items: Vec<_> = stream(missing, LogOptions::default(), pending())
            .collect()
            .await;
        assert!(matches!(&items[..], [Err(e)] if e.kind() == io::ErrorKind::NotFound));
    }

    #[tokio::test]
    async fn follow_streams_appended_lines() {
        let (_dir, path) = log_file(&record("2024-01-02T03:04:05Z", "stdout", "F", "first"));
        let mut f = Follower::start(&path, LogOptions::default(), pending(), POLL).await;
        f.until("first\n").await;
        append(
            &path,
            &record("2024-01-02T03:04:06Z", "stdout", "F", "second"),
        );
        f.until("second\n").await;
        // A record written in two pieces comes out once complete.
        f.until_parked().await;
        append(&path, "2024-01-02T03:04:07Z stderr F thi");
        f.until_parked().await;
        append(&path, "rd\n");
        f.until("third\n").await;
        assert_eq!(f.got, "first\nsecond\nthird\n");
    }

    #[tokio::test]
    async fn follow_wakes_on_inotify_without_polling() {
        let (_dir, path) = log_file("");
        let mut f = Follower::start(&path, LogOptions::default(), pending(), NO_POLL).await;
        for i in 0..3 {
            f.until_parked().await;
            append(
                &path,
                &record("2024-01-02T03:04:05Z", "stdout", "F", &format!("n{i}")),
            );
            f.until(&format!("n{i}\n")).await;
        }
        assert_eq!(f.got, "n0\nn1\nn2\n");
    }

    #[tokio::test]
    async fn follow_continues_across_rotation_without_loss_or_duplicates() {
        let (dir, path) = log_file(&record("2024-01-02T03:04:01Z", "stdout", "F", "1"));
        append(&path, &record("2024-01-02T03:04:02Z", "stdout", "F", "2"));
        let ended = CancellationToken::new();
        let mut f = Follower::start(
            &path,
            LogOptions::default(),
            ended.clone().cancelled_owned(),
            NO_POLL,
        )
        .await;
        f.until("2\n").await;

        // The log manager renames; the runtime writes once more to the old file before
        // it reopens and writes to a new one.
        f.until_parked().await;
        let rotated = dir.path().join("0.log.20240102-030403");
        std::fs::rename(&path, &rotated).unwrap();
        f.until_parked().await;
        append(
            &rotated,
            &record("2024-01-02T03:04:03Z", "stdout", "F", "3"),
        );
        append(&path, &record("2024-01-02T03:04:04Z", "stderr", "F", "4"));
        f.until("4\n").await;
        f.until_parked().await;
        append(&path, &record("2024-01-02T03:04:05Z", "stdout", "F", "5"));
        f.until("5\n").await;

        // A second rotation, then the container ends.
        f.until_parked().await;
        std::fs::rename(&path, dir.path().join("0.log.20240102-030406")).unwrap();
        append(&path, &record("2024-01-02T03:04:06Z", "stdout", "F", "6"));
        ended.cancel();
        f.read_to_end().await;
        assert_eq!(f.got, "1\n2\n3\n4\n5\n6\n");
    }

    #[tokio::test]
    async fn rotation_reads_what_the_old_file_got_after_its_end_was_seen() {
        // The window the stream tests cannot hit on purpose: the reader saw the old
        // file's end, then the runtime wrote to it once more and reopened.
        let (dir, path) = log_file(&record("2024-01-02T03:04:01Z", "stdout", "F", "1"));
        let opts = LogOptions {
            follow: true,
            ..Default::default()
        };
        let tuning = Tuning {
            poll: NO_POLL,
            probe: None,
            parked: None,
        };
        let mut reader = Reader::open(&path, &opts, Box::pin(pending()), tuning)
            .await
            .unwrap();
        assert_eq!(&reader.next_chunk().await.unwrap().unwrap()[..], b"1\n");
        assert_eq!(reader.fill().await.unwrap(), 0);
        let rotated = dir.path().join("0.log.20240102-030402");
        std::fs::rename(&path, &rotated).unwrap();
        append(
            &rotated,
            &record("2024-01-02T03:04:02Z", "stdout", "F", "2"),
        );
        append(&path, &record("2024-01-02T03:04:03Z", "stdout", "F", "3"));
        assert!(reader.reopen_if_rotated().await.unwrap());
        let mut got = String::new();
        while !got.ends_with("3\n") {
            let chunk = tokio::time::timeout(DEADLINE, reader.next_chunk())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            got.push_str(std::str::from_utf8(&chunk).unwrap());
        }
        assert_eq!(got, "2\n3\n");
    }

    #[tokio::test]
    async fn follow_reads_a_truncated_file_from_its_start() {
        let first = record("2024-01-02T03:04:01Z", "stdout", "F", "a long first line");
        let (_dir, path) = log_file(&first);
        let mut f = Follower::start(&path, LogOptions::default(), pending(), NO_POLL).await;
        f.until("line\n").await;
        f.until_parked().await;
        std::fs::write(&path, record("2024-01-02T03:04:02Z", "stdout", "F", "new")).unwrap();
        f.until("new\n").await;
        assert_eq!(f.got, "a long first line\nnew\n");
    }

    #[tokio::test]
    async fn follow_ends_after_the_remaining_lines_once_the_container_ended() {
        let (_dir, path) = log_file(&record("2024-01-02T03:04:01Z", "stdout", "F", "a"));
        let ended = CancellationToken::new();
        let mut f = Follower::start(
            &path,
            LogOptions::default(),
            ended.clone().cancelled_owned(),
            NO_POLL,
        )
        .await;
        f.until_parked().await;
        assert_eq!(f.got, "a\n");
        // Written while the reader waits, but no event wakes it: the end does, and it
        // reads them before it ends.
        append(&path, &record("2024-01-02T03:04:02Z", "stdout", "F", "b"));
        append(&path, "2024-01-02T03:04:03Z stdout F c");
        ended.cancel();
        f.read_to_end().await;
        assert_eq!(f.got, "a\nb\nc");
    }

    #[tokio::test]
    async fn follow_with_tail_and_limit() {
        let text = [
            record("2024-01-02T03:04:01Z", "stdout", "F", "a"),
            record("2024-01-02T03:04:02Z", "stdout", "F", "b"),
        ]
        .concat();
        let (_dir, path) = log_file(&text);
        let opts = LogOptions {
            tail_lines: Some(1),
            limit_bytes: Some(6),
            ..Default::default()
        };
        let mut f = Follower::start(&path, opts, pending(), NO_POLL).await;
        f.until_parked().await;
        assert_eq!(f.got, "b\n");
        append(
            &path,
            &record("2024-01-02T03:04:03Z", "stdout", "F", "cdefg"),
        );
        // The limit ends the follow.
        f.read_to_end().await;
        assert_eq!(f.got, "b\ncdef");
    }

    #[tokio::test]
    async fn dropping_the_stream_ends_the_watcher() {
        let (_dir, path) = log_file(&record("2024-01-02T03:04:01Z", "stdout", "F", "a"));
        let mut f = Follower::start(&path, LogOptions::default(), pending(), NO_POLL).await;
        f.until_parked().await;
        assert_eq!(f.got, "a\n");
        // The reader waits, its probe in the inotify handler.
        let probe = f.probe.clone();
        assert_eq!(Arc::strong_count(&probe), 3, "test, follower and handler");
        drop(f);
        tokio::time::timeout(DEADLINE, async {
            while Arc::strong_count(&probe) > 1 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the inotify watcher outlived the stream");
    }

    #[test]
    fn options_decode_as_the_kubelet() {
        let o = LogOptions::from_query(
            "follow=true&tailLines=10&timestamps=1&limitBytes=500&previous=TRUE&sinceSeconds=60",
            now(),
        )
        .unwrap();
        assert_eq!(
            o,
            LogOptions {
                follow: true,
                tail_lines: Some(10),
                since_time: Some(ts("2024-01-02T03:03:05Z")),
                timestamps: true,
                limit_bytes: Some(500),
                previous: true,
                stream: StreamFilter::All,
            }
        );
        assert_eq!(
            LogOptions::from_query("", now()).unwrap(),
            LogOptions::default()
        );
        // Booleans: false only for false/0, any case; present without a value is true.
        for (q, want) in [
            ("follow", true),
            ("follow=", true),
            ("follow=yes", true),
            ("follow=False", false),
            ("follow=0", false),
            ("follow=false&follow=true", false),
        ] {
            assert_eq!(
                LogOptions::from_query(q, now()).unwrap().follow,
                want,
                "{q}"
            );
        }
        // sinceTime, escaped as clients send it; empty and null mean none.
        let o =
            LogOptions::from_query("sinceTime=2024-01-02T05%3A00%3A00%2B02%3A00", now()).unwrap();
        assert_eq!(o.since_time, Some(ts("2024-01-02T03:00:00Z")));
        assert_eq!(
            LogOptions::from_query("sinceTime=null", now())
                .unwrap()
                .since_time,
            None
        );
        assert_eq!(
            LogOptions::from_query("sinceTime=", now())
                .unwrap()
                .since_time,
            None
        );
        // The legacy `tail`.
        assert_eq!(
            LogOptions::from_query("tail=5", now()).unwrap().tail_lines,
            Some(5)
        );
        assert_eq!(
            LogOptions::from_query("tailLines=5&tail=all", now())
                .unwrap()
                .tail_lines,
            None
        );
        // Split streams.
        assert_eq!(
            LogOptions::from_query("stream=Stderr", now())
                .unwrap()
                .stream,
            StreamFilter::Stderr
        );
        // Pairs as axum decodes them.
        let o =
            LogOptions::from_pairs([("tailLines", "3"), ("timestamps", "true")], now()).unwrap();
        assert_eq!((o.tail_lines, o.timestamps), (Some(3), true));
        // Unknown parameters and undecodable pairs are ignored.
        assert_eq!(
            LogOptions::from_query("container=c&x=%zz&tailLines=%zz", now()).unwrap(),
            LogOptions::default()
        );
    }

    #[test]
    fn options_reject_bad_values() {
        let decode = |q: &str| match LogOptions::from_query(q, now()) {
            Err(e @ OptionsError::Decode(_)) => {
                assert_eq!(e.status(), StatusCode::BAD_REQUEST);
                e.to_string()
            }
            other => panic!("{q}: {other:?}"),
        };
        assert_eq!(
            decode("tailLines=ten"),
            "unable to decode query: tailLines: invalid value \"ten\": not an integer"
        );
        assert!(decode("limitBytes=1.5").contains("limitBytes"));
        assert!(decode("sinceSeconds=").contains("sinceSeconds"));
        assert!(decode("tailLines=99999999999999999999").contains("tailLines"));
        assert!(decode("sinceTime=yesterday").contains("sinceTime"));
        assert!(decode("sinceTime=2024-01-02T03:04:05").contains("sinceTime"));
        // Every undecodable value at once.
        assert_eq!(
            LogOptions::from_query("tailLines=x&limitBytes=y", now()),
            Err(OptionsError::Decode(vec![
                "tailLines: invalid value \"x\": not an integer".into(),
                "limitBytes: invalid value \"y\": not an integer".into(),
            ]))
        );

        let invalid = |q: &str| match LogOptions::from_query(q, now()) {
            Err(e @ OptionsError::Invalid(_)) => {
                assert_eq!(e.status(), StatusCode::UNPROCESSABLE_ENTITY);
                e.to_string()
            }
            other => panic!("{q}: {other:?}"),
        };
        assert_eq!(
            invalid("tailLines=-1"),
            "invalid request: tailLines: Invalid value: -1: must be greater than or equal to 0"
        );
        assert_eq!(
            invalid("limitBytes=0"),
            "invalid request: limitBytes: Invalid value: 0: must be greater than 0"
        );
        assert_eq!(
            invalid("sinceSeconds=0"),
            "invalid request: sinceSeconds: Invalid value: 0: must be greater than 0"
        );
        assert_eq!(
            invalid("sinceSeconds=10&sinceTime=2024-01-02T03:04:05Z"),
            "invalid request: Forbidden: at most one of `sinceTime` or `sinceSeconds` may be specified"
        );
        assert_eq!(
            invalid("stream=Both"),
            "invalid request: stream: Unsupported value: \"Both\": supported values: \"All\", \"Stderr\", \"Stdout\""
        );
        assert_eq!(
            invalid("stream=Stdout&tailLines=1"),
            "invalid request: Forbidden: `tailLines` and specific `stream` are mutually exclusive for now"
        );
        assert_eq!(
            invalid("tailLines=-1&limitBytes=-5"),
            "invalid request: [tailLines: Invalid value: -1: must be greater than or equal to 0, \
             limitBytes: Invalid value: -5: must be greater than 0]"
        );
    }
}
