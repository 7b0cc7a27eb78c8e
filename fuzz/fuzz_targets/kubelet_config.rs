#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use wasmlet_fuzzing::Context;

static CX: LazyLock<Context> = LazyLock::new(Context::new);

fuzz_target!(|data: &[u8]| wasmlet_fuzzing::kubelet_config(&CX, data));
