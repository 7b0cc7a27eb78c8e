//! The seeds that are bytes no one writes by hand (OCI archives, SPDY and WebSocket
//! frames), made by the project's own encoders. Run once after a format change:
//! `cargo test -p wasmlet-fuzzing --test seeds -- --ignored`, then commit
//! `fuzz/seeds`. (The hand-written seeds sit beside them.)

use std::path::{Path, PathBuf};

use futures::SinkExt as _;
use tokio::io::AsyncReadExt as _;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::Role;
use wasmlet_node::server::spdy::{self, Frame, HeaderCodec};
use wasmlet_testkit::images::{WasmImage, WasmLayout, write_oci_archive};

fn seeds(target: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/seeds")
        .join(target);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
#[ignore = "writes fuzz/seeds; run by hand after a format change"]
fn write_generated_seeds() {
    // OCI archives of a tiny module in each layout the store reads.
    let wasm = wat::parse_str("(module (func (export \"_start\")))").unwrap();
    for (name, layout) in [
        ("artifact", WasmLayout::Artifact),
        ("runwasi-layer", WasmLayout::RunwasiComponentLayer),
        ("plain-image", WasmLayout::PlainImage),
        ("host-image", WasmLayout::HostImage),
    ] {
        let image = WasmImage::new(format!("localhost/fuzz/{name}:v1"), wasm.clone(), layout);
        write_oci_archive(&image, &seeds("oci_archive").join(format!("{name}.tar"))).unwrap();
    }

    // SPDY/3.1: an exec's streams as kubectl opens them, data, and the session's end.
    let mut codec = HeaderCodec::new();
    let mut bytes = Vec::new();
    let frames = [
        Frame::SynStream {
            id: 1,
            headers: vec![
                ("streamtype".into(), "error".into()),
                ("content-type".into(), String::new()),
            ],
            fin: false,
        },
        Frame::SynStream {
            id: 3,
            headers: vec![("streamtype".into(), "stdin".into())],
            fin: false,
        },
        Frame::Data {
            id: 3,
            data: bytes::Bytes::from_static(b"echo hello\n"),
            fin: true,
        },
        Frame::Ping(1),
        Frame::RstStream { id: 3, status: 5 },
        Frame::GoAway {
            last_id: 3,
            status: 0,
        },
    ];
    for frame in &frames {
        bytes.extend(spdy::encode_frame(frame, &mut codec).unwrap());
    }
    std::fs::write(seeds("spdy_frames").join("exec.bin"), &bytes).unwrap();

    // WebSocket: what a client sends (masked frames), binary and base64 channels.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for (name, flag, messages) in [
        (
            "binary.bin",
            0u8,
            vec![
                Message::binary(b"\x00echo hello\n".to_vec()),
                Message::binary(b"\x04{\"Width\":80,\"Height\":24}".to_vec()),
                Message::Ping(b"p".to_vec().into()),
                Message::Close(None),
            ],
        ),
        (
            "base64.bin",
            1u8,
            vec![
                Message::text("0ZWNobyBoZWxsbwo="),
                Message::text("4eyJXaWR0aCI6ODB9"),
                Message::Close(None),
            ],
        ),
    ] {
        let written = rt.block_on(async {
            let (client, mut server) = tokio::io::duplex(1 << 16);
            let mut ws =
                tokio_tungstenite::WebSocketStream::from_raw_socket(client, Role::Client, None)
                    .await;
            for m in messages {
                ws.send(m).await.unwrap();
            }
            drop(ws);
            let mut out = vec![flag];
            server.read_to_end(&mut out).await.unwrap();
            out
        });
        std::fs::write(seeds("websocket_frames").join(name), written).unwrap();
    }
}
