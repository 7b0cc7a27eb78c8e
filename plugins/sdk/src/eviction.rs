//! The `eviction-plugin` world: rank eviction candidates when a resource runs short.
//!
//! Implement [`Eviction`] and export it with
//! [`export_eviction!`](crate::export_eviction). [`Eviction::rank`] returns
//! indexes into `candidates`, first to evict first; indexes left out are ranked
//! after, in the node's built-in order; an index out of range or repeated makes
//! the whole answer invalid and the node falls back to its own order.
//!
//! ```no_run
//! use wasmlet_plugin_sdk::eviction::{Candidate, Eviction};
//!
//! /// Evicts the largest user first, whatever its priority.
//! struct LargestFirst;
//!
//! impl Eviction for LargestFirst {
//!     fn rank(_signal: String, candidates: Vec<Candidate>) -> Vec<u32> {
//!         let mut order: Vec<u32> = (0..candidates.len() as u32).collect();
//!         order.sort_by_key(|&i| std::cmp::Reverse(candidates[i as usize].usage));
//!         order
//!     }
//! }
//!
//! wasmlet_plugin_sdk::export_eviction!(LargestFirst);
//! ```

pub use crate::bindings::eviction_world::exports::wasmlet::plugin::eviction::Candidate;

/// An eviction plugin.
pub trait Eviction {
    /// Orders `candidates` for the eviction `signal` (`memory.available`,
    /// `nodefs.available`, ...): indexes, first to evict first.
    fn rank(signal: String, candidates: Vec<Candidate>) -> Vec<u32>;
}

impl Candidate {
    /// How far usage exceeds the request (0 when within it).
    pub fn above_request(&self) -> u64 {
        self.usage.saturating_sub(self.request)
    }

    /// Whether usage exceeds the request.
    pub fn exceeds_request(&self) -> bool {
        self.usage > self.request
    }
}

/// Exports an [`Eviction`] implementation as the plugin's
/// `wasmlet:plugin/eviction` interface. Use it once, at the crate's top level.
#[macro_export]
macro_rules! export_eviction {
    ($ty:ty) => {
        const _: () = {
            struct __WasmletEvictionExport;
            impl $crate::bindings::eviction_world::exports::wasmlet::plugin::eviction::Guest
                for __WasmletEvictionExport
            {
                fn rank(
                    signal: ::std::string::String,
                    candidates: ::std::vec::Vec<$crate::eviction::Candidate>,
                ) -> ::std::vec::Vec<u32> {
                    <$ty as $crate::eviction::Eviction>::rank(signal, candidates)
                }
            }
            $crate::bindings::eviction_world::__export_eviction_plugin!(
                __WasmletEvictionExport with_types_in $crate::bindings::eviction_world
            );
        };
    };
}
