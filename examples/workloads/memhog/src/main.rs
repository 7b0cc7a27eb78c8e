//! `memhog`: allocates `MIB` MiB (default 200) in 1 MiB steps, writing to
//! every 4 KiB page so the memory is really committed, and prints
//! `allocated N MiB` every 16 MiB and at the end. Then it holds the memory
//! and sleeps forever, or exits 0 when `HOLD=0`.

use std::io::Write;
use std::time::Duration;

const MIB: usize = 1024 * 1024;
const PAGE: usize = 4096;

fn main() {
    let target: usize = match std::env::var("MIB") {
        Ok(raw) => raw.trim().parse().unwrap_or_else(|_| {
            eprintln!("MIB={raw:?} is not a non-negative integer");
            std::process::exit(2);
        }),
        Err(_) => 200,
    };
    let hold = std::env::var("HOLD").map_or(true, |v| v.trim() != "0");

    let stdout = std::io::stdout();
    let mut chunks: Vec<Vec<u8>> = Vec::with_capacity(target);
    for i in 1..=target {
        let mut chunk = vec![0u8; MIB];
        for page in chunk.chunks_mut(PAGE) {
            page[0] = (i & 0xff) as u8 | 1;
        }
        chunks.push(std::hint::black_box(chunk));
        if i % 16 == 0 || i == target {
            let mut out = stdout.lock();
            let _ = writeln!(out, "allocated {i} MiB");
            let _ = out.flush();
        }
    }
    let mut out = stdout.lock();
    let _ = writeln!(out, "holding {target} MiB");
    let _ = out.flush();
    drop(out);

    if !hold {
        return;
    }
    loop {
        std::thread::sleep(Duration::from_secs(3600));
        std::hint::black_box(&chunks);
    }
}
