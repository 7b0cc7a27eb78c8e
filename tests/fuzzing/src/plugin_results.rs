//! Plugin answers as the host receives them: built from the input's bytes as the
//! canonical ABI would lift them, then put through the host's checks
//! (`wasmlet_plugin_host::results`) and the node's check of an allocation's host paths.

use std::path::PathBuf;

use wasmlet_plugin_host::results;
use wasmlet_plugin_host::types::{
    Allocation, Candidate, Decision, Denial, Device, DeviceNode, Mount, Pair, PodInfo, ProbeResult,
};

use crate::Context;

/// Reads values off the input, yielding zeros and empty strings once it runs out.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }

    fn bool(&mut self) -> bool {
        self.byte() & 1 == 1
    }

    /// A string of up to 255 bytes (lossy UTF-8, as only valid strings cross the ABI).
    fn string(&mut self) -> String {
        let len = usize::from(self.byte()).min(self.0.len());
        let (s, rest) = self.0.split_at(len);
        self.0 = rest;
        String::from_utf8_lossy(s).into_owned()
    }

    /// Up to 15 items; a byte whose high nibble is all ones asks for 10,000 copies of
    /// the first, to reach the size limit (a plugin's answer, which it sizes).
    fn list<T: Clone>(&mut self, mut item: impl FnMut(&mut Self) -> T) -> Vec<T> {
        let n = self.byte();
        let mut v: Vec<T> = (0..n & 0x0f).map(|_| item(self)).collect();
        if n & 0xf0 == 0xf0
            && let Some(first) = v.first().cloned()
        {
            v.resize(10_000, first);
        }
        v
    }

    /// Up to 15 items: what the node passes in, which it sizes.
    fn few<T>(&mut self, mut item: impl FnMut(&mut Self) -> T) -> Vec<T> {
        let n = self.byte() & 0x0f;
        (0..n).map(|_| item(self)).collect()
    }

    fn pair(&mut self) -> Pair {
        Pair {
            key: self.string(),
            value: self.string(),
        }
    }

    fn pod(&mut self) -> PodInfo {
        PodInfo {
            namespace: self.string(),
            name: self.string(),
            uid: self.string(),
            labels: self.few(Self::pair),
            annotations: Vec::new(),
            qos_class: self.string(),
            priority: self.u32() as i32,
            runtime_class: String::new(),
            containers: Vec::new(),
        }
    }
}

pub fn plugin_results(_: &Context, data: &[u8]) {
    let mut r = Reader(data);
    match r.byte() % 6 {
        0 => {
            let result = if r.bool() {
                ProbeResult::Success
            } else {
                ProbeResult::Failure(r.string())
            };
            let _ = results::size(&result);
        }
        1 => {
            let decision = if r.bool() {
                Decision::Admit
            } else {
                Decision::Deny(Denial {
                    reason: r.string(),
                    message: r.string(),
                })
            };
            if results::size(&decision).is_ok() {
                let _ = results::admission(&decision);
            }
        }
        2 => {
            let candidates = r.few(|r| Candidate {
                pod: r.pod(),
                usage: u64::from(r.u32()),
                request: u64::from(r.u32()),
            });
            let ranked = r.list(|r| u32::from(r.byte()));
            // The host sizes an answer before it checks it.
            if results::size(&ranked).is_err() {
                return;
            }
            if let Ok(order) = results::ranking(&ranked, &candidates) {
                // A complete order: every candidate once.
                let mut sorted = order.clone();
                sorted.sort_unstable();
                assert!(
                    sorted.iter().copied().eq(0..candidates.len() as u32),
                    "ranking {ranked:?} of {} candidates completed to {order:?}",
                    candidates.len()
                );
            }
        }
        3 => {
            let devices = r.list(|r| Device {
                id: r.string(),
                healthy: r.bool(),
                numa_node: r.bool().then(|| r.u32()),
            });
            if results::size(&devices).is_ok() {
                let _ = results::discovered(&devices);
            }
        }
        4 => {
            let available = r.few(Reader::string);
            let must_include = r.few(Reader::string);
            let picked = r.list(Reader::string);
            if results::size(&picked).is_ok() {
                let _ = results::preferred(&picked, &available, &must_include);
            }
        }
        _ => {
            let allocation = Allocation {
                envs: r.list(Reader::pair),
                mounts: r.list(|r| Mount {
                    container_path: r.string(),
                    host_path: r.string(),
                    read_only: r.bool(),
                }),
                devices: r.list(|r| DeviceNode {
                    container_path: r.string(),
                    host_path: r.string(),
                    permissions: r.string(),
                }),
                annotations: r.list(Reader::pair),
            };
            if results::size(&allocation).is_err() {
                return;
            }
            let allowed = [PathBuf::from("/dev/fuzz"), PathBuf::from("/var/lib/fuzz")];
            for path in allocation
                .mounts
                .iter()
                .map(|m| &m.host_path)
                .chain(allocation.devices.iter().map(|d| &d.host_path))
            {
                let _ = wasmlet_node::cm::devicemanager::endpoint::granted(path, &allowed);
            }
        }
    }
}
