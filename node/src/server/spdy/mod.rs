//! The server side of SPDY/3.1 as Kubernetes streaming uses it (moby/spdystream, the
//! library of kubectl, client-go and the API server): the client opens streams with
//! SYN_STREAM, the server answers each with SYN_REPLY, data flows in DATA frames,
//! either side half-closes with FIN. No crate with a compatible licence serves this
//! (see `docs/streaming-plan.md`), so the framing is here; the Kubernetes channel
//! layer is in [`super::remotecommand`].
//!
//! Frames (big-endian): a control frame is `1 | version(15)=3 | type(16) | flags(8) |
//! length(24) | payload`, a data frame `0 | stream-id(31) | flags(8) | length(24) |
//! data`. Header blocks are `count(32)` then `len(32) name len(32) value` pairs,
//! compressed with one zlib stream per direction for the whole session, primed with
//! the SPDY/3 dictionary ([`DICTIONARY`]) and flushed with Z_SYNC_FLUSH per block.
//!
//! Flow control is not enforced in either direction, as spdystream does not: the
//! client's WINDOW_UPDATE and SETTINGS are read and ignored, and we send none.

use std::collections::HashMap;
use std::io;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// The SPDY/3 header compression dictionary (draft-mbelshe-httpbis-spdy-00
/// §2.6.10.1), 1423 bytes.
pub const DICTIONARY: &[u8] = include_bytes!("dictionary.bin");

const VERSION: u16 = 3;
const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const FLAG_FIN: u8 = 0x01;
/// The largest frame payload the session accepts (the 24-bit length's limit).
const MAX_FRAME: usize = (1 << 24) - 1;
/// The largest DATA frame the session sends.
const MAX_DATA: usize = 32 * 1024;
/// RST_STREAM status: the stream is not one this session knows.
pub const RST_INVALID_STREAM: u32 = 2;
/// RST_STREAM status: the stream was refused.
pub const RST_REFUSED_STREAM: u32 = 3;

/// Header names are lowercase on the wire; a value with several parts is
/// NUL-separated.
pub type Headers = Vec<(String, String)>;

/// A frame, decoded.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    SynStream {
        id: u32,
        headers: Headers,
        fin: bool,
    },
    SynReply {
        id: u32,
        headers: Headers,
        fin: bool,
    },
    RstStream {
        id: u32,
        status: u32,
    },
    Ping(u32),
    GoAway {
        last_id: u32,
        status: u32,
    },
    Data {
        id: u32,
        data: Bytes,
        fin: bool,
    },
    /// SETTINGS, WINDOW_UPDATE, HEADERS, NOOP and unknown types: read and ignored.
    Ignored(u16),
}

/// The zlib state of one direction of a session.
pub struct HeaderCodec {
    inflate: Decompress,
    deflate: Compress,
}

impl Default for HeaderCodec {
    fn default() -> Self {
        Self::new()
    }
}

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

impl HeaderCodec {
    pub fn new() -> Self {
        let mut deflate = Compress::new(Compression::default(), true);
        // Priming with the dictionary cannot fail on a fresh stream.
        let _ = deflate.set_dictionary(DICTIONARY);
        Self {
            inflate: Decompress::new(true),
            deflate,
        }
    }

    /// A compressed header block, as the peer's session state expects it next.
    pub fn encode(&mut self, headers: &[(String, String)]) -> io::Result<Vec<u8>> {
        let mut raw = BytesMut::new();
        raw.put_u32(headers.len() as u32);
        for (k, v) in headers {
            raw.put_u32(k.len() as u32);
            raw.put_slice(k.as_bytes());
            raw.put_u32(v.len() as u32);
            raw.put_slice(v.as_bytes());
        }
        let mut out = Vec::with_capacity(raw.len() + 64);
        let mut input = &raw[..];
        loop {
            out.reserve(256);
            let before = self.deflate.total_in();
            self.deflate
                .compress_vec(input, &mut out, FlushCompress::Sync)
                .map_err(|e| invalid(format!("compressing headers: {e}")))?;
            input = &input[(self.deflate.total_in() - before) as usize..];
            // Done when all input is in and the sync flush had room to finish.
            if input.is_empty() && out.len() < out.capacity() {
                return Ok(out);
            }
        }
    }

    /// The headers of a compressed block received from the peer.
    pub fn decode(&mut self, block: &[u8]) -> io::Result<Headers> {
        let mut raw = Vec::with_capacity(block.len() * 4 + 64);
        let mut input = block;
        loop {
            raw.reserve(1024);
            let before = self.inflate.total_in();
            let status = match self
                .inflate
                .decompress_vec(input, &mut raw, FlushDecompress::Sync)
            {
                Ok(s) => s,
                Err(e) if e.needs_dictionary().is_some() => {
                    self.inflate
                        .set_dictionary(DICTIONARY)
                        .map_err(|e| invalid(format!("header dictionary: {e}")))?;
                    Status::Ok
                }
                Err(e) => return Err(invalid(format!("decompressing headers: {e}"))),
            };
            input = &input[(self.inflate.total_in() - before) as usize..];
            if raw.len() > MAX_FRAME {
                return Err(invalid("a header block larger than 16 MiB"));
            }
            if (input.is_empty() && raw.len() < raw.capacity()) || status == Status::StreamEnd {
                break;
            }
        }
        parse_header_block(&raw)
    }
}

fn parse_header_block(mut raw: &[u8]) -> io::Result<Headers> {
    let short = || invalid("a truncated header block");
    let take = |raw: &mut &[u8]| -> io::Result<String> {
        if raw.remaining() < 4 {
            return Err(short());
        }
        let n = raw.get_u32() as usize;
        if raw.remaining() < n {
            return Err(short());
        }
        let s = String::from_utf8(raw[..n].to_vec())
            .map_err(|_| invalid("a header that is not UTF-8"))?;
        raw.advance(n);
        Ok(s)
    };
    if raw.remaining() < 4 {
        return Err(short());
    }
    let count = raw.get_u32();
    let mut headers = Vec::new();
    for _ in 0..count {
        let k = take(&mut raw)?;
        let v = take(&mut raw)?;
        headers.push((k.to_ascii_lowercase(), v));
    }
    Ok(headers)
}

/// The value of header `name` (lowercase).
pub fn header<'a>(headers: &'a Headers, name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// Reads one frame; `Ok(None)` at a clean end of the connection.
pub async fn read_frame<R: AsyncRead + Unpin>(
    io: &mut R,
    headers: &mut HeaderCodec,
) -> io::Result<Option<Frame>> {
    let mut head = [0u8; 8];
    match io.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let word = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
    let flags = head[4];
    let len = u32::from_be_bytes([0, head[5], head[6], head[7]]) as usize;
    let mut payload = vec![0u8; len];
    io.read_exact(&mut payload).await?;
    let fin = flags & FLAG_FIN != 0;
    if word & 0x8000_0000 == 0 {
        return Ok(Some(Frame::Data {
            id: word & 0x7fff_ffff,
            data: payload.into(),
            fin,
        }));
    }
    let version = ((word >> 16) & 0x7fff) as u16;
    if version != VERSION {
        return Err(invalid(format!("SPDY version {version}, not 3")));
    }
    let kind = (word & 0xffff) as u16;
    let mut p = &payload[..];
    let need = |p: &[u8], n: usize| {
        if p.len() < n {
            Err(invalid(format!("a control frame of type {kind} too short")))
        } else {
            Ok(())
        }
    };
    Ok(Some(match kind {
        SYN_STREAM => {
            need(p, 10)?;
            let id = p.get_u32() & 0x7fff_ffff;
            let _associated = p.get_u32();
            let _priority_and_slot = p.get_u16();
            Frame::SynStream {
                id,
                headers: headers.decode(p)?,
                fin,
            }
        }
        SYN_REPLY => {
            need(p, 4)?;
            let id = p.get_u32() & 0x7fff_ffff;
            Frame::SynReply {
                id,
                headers: headers.decode(p)?,
                fin,
            }
        }
        RST_STREAM => {
            need(p, 8)?;
            Frame::RstStream {
                id: p.get_u32() & 0x7fff_ffff,
                status: p.get_u32(),
            }
        }
        PING => {
            need(p, 4)?;
            Frame::Ping(p.get_u32())
        }
        GOAWAY => {
            need(p, 8)?;
            Frame::GoAway {
                last_id: p.get_u32() & 0x7fff_ffff,
                status: p.get_u32(),
            }
        }
        other => Frame::Ignored(other),
    }))
}

fn control(kind: u16, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + payload.len());
    out.put_u16(0x8000 | VERSION);
    out.put_u16(kind);
    out.put_u8(flags);
    out.put_uint(payload.len() as u64, 3);
    out.put_slice(payload);
    out
}

/// The bytes of `frame` (headers compressed with `headers`).
pub fn encode_frame(frame: &Frame, headers: &mut HeaderCodec) -> io::Result<Vec<u8>> {
    let fin_flag = |fin: bool| if fin { FLAG_FIN } else { 0 };
    Ok(match frame {
        Frame::SynStream {
            id,
            headers: h,
            fin,
        } => {
            let mut p = Vec::new();
            p.put_u32(*id);
            p.put_u32(0);
            p.put_u16(0);
            p.extend(headers.encode(h)?);
            control(SYN_STREAM, fin_flag(*fin), &p)
        }
        Frame::SynReply {
            id,
            headers: h,
            fin,
        } => {
            let mut p = Vec::new();
            p.put_u32(*id);
            p.extend(headers.encode(h)?);
            control(SYN_REPLY, fin_flag(*fin), &p)
        }
        Frame::RstStream { id, status } => {
            let mut p = Vec::new();
            p.put_u32(*id);
            p.put_u32(*status);
            control(RST_STREAM, 0, &p)
        }
        Frame::Ping(id) => control(PING, 0, &id.to_be_bytes()),
        Frame::GoAway { last_id, status } => {
            let mut p = Vec::new();
            p.put_u32(*last_id);
            p.put_u32(*status);
            control(GOAWAY, 0, &p)
        }
        Frame::Data { id, data, fin } => {
            let mut out = Vec::with_capacity(8 + data.len());
            out.put_u32(id & 0x7fff_ffff);
            out.put_u8(fin_flag(*fin));
            out.put_uint(data.len() as u64, 3);
            out.put_slice(data);
            out
        }
        Frame::Ignored(_) => Vec::new(),
    })
}

/// A stream the client opened: its headers, what it sends (`None` once it
/// half-closed), and a writer towards it.
pub struct Stream {
    pub id: u32,
    pub headers: Headers,
    pub incoming: mpsc::Receiver<Bytes>,
    pub writer: StreamWriter,
}

/// Writes to one stream of the session.
#[derive(Clone)]
pub struct StreamWriter {
    id: u32,
    out: mpsc::Sender<Frame>,
}

impl StreamWriter {
    /// Sends `data`, in frames of at most 32 KiB; `false` once the session is gone.
    pub async fn write(&self, mut data: &[u8]) -> bool {
        while !data.is_empty() {
            let n = data.len().min(MAX_DATA);
            let frame = Frame::Data {
                id: self.id,
                data: Bytes::copy_from_slice(&data[..n]),
                fin: false,
            };
            if self.out.send(frame).await.is_err() {
                return false;
            }
            data = &data[n..];
        }
        true
    }

    /// Half-closes the stream (an empty DATA frame with FIN).
    pub async fn close(&self) {
        let _ = self
            .out
            .send(Frame::Data {
                id: self.id,
                data: Bytes::new(),
                fin: true,
            })
            .await;
    }

    /// Resolves once the session can no longer send: the client's side ended.
    pub async fn closed(&self) {
        self.out.closed().await
    }

    /// Resets the stream.
    pub async fn reset(&self, status: u32) {
        let _ = self
            .out
            .send(Frame::RstStream {
                id: self.id,
                status,
            })
            .await;
    }
}

/// A server session over an upgraded connection: [`Session::accept`] yields each
/// stream the client opens (already answered with SYN_REPLY); dropping the session
/// and every writer ends the connection.
pub struct Session {
    accepted: mpsc::Receiver<Stream>,
    out: mpsc::Sender<Frame>,
}

impl Session {
    pub fn start<T>(io: T) -> Session
    where
        T: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (mut rd, mut wr) = tokio::io::split(io);
        let (out_tx, mut out_rx) = mpsc::channel::<Frame>(64);
        let (accept_tx, accepted) = mpsc::channel::<Stream>(16);

        // Cancelled when the client's side ends (EOF, an error, GOAWAY, the idle
        // timeout): the writer then sends what is queued and stops, so every
        // stream's writer fails and [`StreamWriter::closed`] resolves.
        let ended = tokio_util::sync::CancellationToken::new();
        let reader_ended = ended.clone().drop_guard();

        // One writer: frames leave in the order they were queued, with one header
        // compression state.
        tokio::spawn(async move {
            let mut codec = HeaderCodec::new();
            loop {
                let frame = tokio::select! {
                    biased;
                    f = out_rx.recv() => f,
                    () = ended.cancelled() => out_rx.try_recv().ok(),
                };
                let Some(frame) = frame else { break };
                let bytes = match encode_frame(&frame, &mut codec) {
                    Ok(b) => b,
                    Err(e) => {
                        tracing::debug!("spdy: encoding a frame: {e}");
                        break;
                    }
                };
                if wr.write_all(&bytes).await.is_err() {
                    break;
                }
                if out_rx.is_empty() && wr.flush().await.is_err() {
                    break;
                }
            }
            let _ = wr.shutdown().await;
        });

        let out = out_tx.clone();
        tokio::spawn(async move {
            let _ended = reader_ended;
            let mut codec = HeaderCodec::new();
            let mut streams: HashMap<u32, mpsc::Sender<Bytes>> = HashMap::new();
            loop {
                let frame = match read_frame(&mut rd, &mut codec).await {
                    Ok(Some(f)) => f,
                    Ok(None) => break,
                    Err(e) => {
                        tracing::debug!("spdy: reading a frame: {e}");
                        break;
                    }
                };
                match frame {
                    Frame::SynStream { id, headers, fin } => {
                        let (tx, rx) = mpsc::channel(64);
                        if !fin {
                            streams.insert(id, tx);
                        }
                        let reply = Frame::SynReply {
                            id,
                            headers: Vec::new(),
                            fin: false,
                        };
                        if out.send(reply).await.is_err() {
                            break;
                        }
                        let stream = Stream {
                            id,
                            headers,
                            incoming: rx,
                            writer: StreamWriter {
                                id,
                                out: out.clone(),
                            },
                        };
                        if accept_tx.send(stream).await.is_err() {
                            let _ = out
                                .send(Frame::RstStream {
                                    id,
                                    status: RST_REFUSED_STREAM,
                                })
                                .await;
                        }
                    }
                    Frame::Data { id, data, fin } => {
                        if let Some(tx) = streams.get(&id) {
                            // A reader that went away no longer wants the data.
                            if !data.is_empty() && tx.send(data).await.is_err() {
                                streams.remove(&id);
                            }
                        }
                        if fin {
                            streams.remove(&id);
                        }
                    }
                    Frame::RstStream { id, .. } => {
                        streams.remove(&id);
                    }
                    Frame::Ping(id) => {
                        if out.send(Frame::Ping(id)).await.is_err() {
                            break;
                        }
                    }
                    Frame::GoAway { .. } => break,
                    Frame::SynReply { .. } | Frame::Ignored(_) => {}
                }
            }
        });
        Session {
            accepted,
            out: out_tx,
        }
    }

    /// The next stream the client opens; `None` once the connection ended.
    pub async fn accept(&mut self) -> Option<Stream> {
        self.accepted.recv().await
    }

    /// Tells the client the session is over (GOAWAY, status OK).
    pub async fn go_away(&self) {
        let _ = self
            .out
            .send(Frame::GoAway {
                last_id: 0,
                status: 0,
            })
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    #[test]
    fn the_dictionary_is_the_spdy3_one() {
        assert_eq!(DICTIONARY.len(), 1423);
        assert_eq!(
            hex::encode(Sha256::digest(DICTIONARY)),
            "51d27341373f923f3cd88e1eb7162aeaa3723d7585ff2399201dc06498407f02"
        );
        assert!(DICTIONARY.starts_with(b"\0\0\0\x07options"));
    }

    #[test]
    fn header_blocks_round_trip_through_one_zlib_stream_per_direction() {
        let (mut client, mut server) = (HeaderCodec::new(), HeaderCodec::new());
        for round in 0..3 {
            let h: Headers = vec![
                ("streamtype".into(), format!("stdout{round}")),
                ("port".into(), "8080".into()),
            ];
            let block = client.encode(&h).unwrap();
            assert_eq!(server.decode(&block).unwrap(), h);
        }
    }

    #[tokio::test]
    async fn frames_round_trip() {
        let frames = vec![
            Frame::SynStream {
                id: 1,
                headers: vec![("streamtype".into(), "error".into())],
                fin: true,
            },
            Frame::SynReply {
                id: 1,
                headers: Vec::new(),
                fin: false,
            },
            Frame::Data {
                id: 3,
                data: Bytes::from_static(b"hello"),
                fin: false,
            },
            Frame::Data {
                id: 3,
                data: Bytes::new(),
                fin: true,
            },
            Frame::RstStream { id: 5, status: 5 },
            Frame::Ping(7),
            Frame::GoAway {
                last_id: 5,
                status: 0,
            },
        ];
        let mut enc = HeaderCodec::new();
        let mut wire = Vec::new();
        for f in &frames {
            wire.extend(encode_frame(f, &mut enc).unwrap());
        }
        // A WINDOW_UPDATE (type 9) is read and ignored.
        wire.extend(control(9, 0, &[0, 0, 0, 3, 0, 0, 1, 0]));
        let mut dec = HeaderCodec::new();
        let mut rd = &wire[..];
        let mut got = Vec::new();
        while let Some(f) = read_frame(&mut rd, &mut dec).await.unwrap() {
            got.push(f);
        }
        let last = got.pop().unwrap();
        assert_eq!(got, frames);
        assert_eq!(last, Frame::Ignored(9));
    }

    #[tokio::test]
    async fn when_the_client_goes_every_streams_writer_learns_it() {
        let (mut client, server_io) = tokio::io::duplex(1 << 16);
        let mut session = Session::start(server_io);
        let open = Frame::SynStream {
            id: 1,
            headers: vec![("streamtype".into(), "data".into())],
            fin: false,
        };
        let bytes = encode_frame(&open, &mut HeaderCodec::new()).unwrap();
        client.write_all(&bytes).await.unwrap();
        let mut stream = session.accept().await.unwrap();
        drop(client);
        tokio::time::timeout(std::time::Duration::from_secs(10), stream.writer.closed())
            .await
            .expect("the writer learns the session is over");
        assert!(!stream.writer.write(b"late").await);
        assert_eq!(stream.incoming.recv().await, None);
        assert!(session.accept().await.is_none());
    }

    #[tokio::test]
    async fn a_session_replies_to_streams_routes_data_and_echoes_pings() {
        let (client_io, server_io) = tokio::io::duplex(1 << 16);
        let mut session = Session::start(server_io);
        let (mut crd, mut cwr) = tokio::io::split(client_io);
        let mut enc = HeaderCodec::new();
        let mut dec = HeaderCodec::new();
        let send = |f: Frame, enc: &mut HeaderCodec| encode_frame(&f, enc).unwrap();
        let mut bytes = send(
            Frame::SynStream {
                id: 1,
                headers: vec![("streamtype".into(), "stdin".into())],
                fin: false,
            },
            &mut enc,
        );
        bytes.extend(send(
            Frame::Data {
                id: 1,
                data: Bytes::from_static(b"in"),
                fin: true,
            },
            &mut enc,
        ));
        bytes.extend(send(Frame::Ping(9), &mut enc));
        cwr.write_all(&bytes).await.unwrap();

        let mut stream = session.accept().await.unwrap();
        assert_eq!(header(&stream.headers, "streamtype"), Some("stdin"));
        assert_eq!(
            stream.incoming.recv().await.unwrap(),
            Bytes::from_static(b"in")
        );
        assert_eq!(stream.incoming.recv().await, None, "FIN is the end");
        stream.writer.write(b"out").await;
        stream.writer.close().await;

        let mut seen = Vec::new();
        while seen.len() < 4 {
            seen.push(read_frame(&mut crd, &mut dec).await.unwrap().unwrap());
        }
        assert_eq!(
            seen,
            [
                Frame::SynReply {
                    id: 1,
                    headers: Vec::new(),
                    fin: false
                },
                Frame::Ping(9),
                Frame::Data {
                    id: 1,
                    data: Bytes::from_static(b"out"),
                    fin: false
                },
                Frame::Data {
                    id: 1,
                    data: Bytes::new(),
                    fin: true
                },
            ]
        );
    }
}
