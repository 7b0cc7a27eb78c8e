//! `crasher`: prints `about to crash`, then panics. The guests are built with
//! `panic = "abort"`, so the panic ends in a Wasm trap (`unreachable`), which
//! is what the runtime's crash handling is tested against.

use std::io::Write;

fn main() {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "about to crash");
    let _ = out.flush();
    drop(out);
    panic!("crasher: deliberate panic");
}
