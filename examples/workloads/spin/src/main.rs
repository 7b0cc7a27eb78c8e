//! `spin`: prints `spinning` once, then busy-loops forever without making a
//! single WASI call, so only an epoch deadline, fuel or a CPU limit can stop
//! or slow it.

use std::io::Write;

fn main() {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "spinning");
    let _ = out.flush();
    drop(out);

    let mut counter: u64 = 0;
    loop {
        counter = std::hint::black_box(counter.wrapping_add(1));
    }
}
