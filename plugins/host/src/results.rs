//! The checks a plugin's answer passes before the node uses it. The canonical ABI has
//! already lifted it into these types (wasmtime checks the encoding); what is checked
//! here is what the types cannot say: its size, and the rules of each world. A failed
//! check fails the call with `invalid_result`, as a trap would.

use crate::types::{Candidate, Decision, Device, EncodedSize};

/// A plugin's answer larger than this (strings and lists, encoded) is an
/// [`InvalidResult`](crate::CallError::InvalidResult).
pub const RESULT_MAX: usize = 1 << 20;

/// An answer is at most [`RESULT_MAX`] bytes, as the ABI encodes it.
pub fn size<R: EncodedSize>(answer: &R) -> Result<(), String> {
    let size = answer.encoded_size();
    if size > RESULT_MAX {
        return Err(format!(
            "the answer is {size} bytes, more than {RESULT_MAX}"
        ));
    }
    Ok(())
}

/// An admission denial says why.
pub fn admission(decision: &Decision) -> Result<(), String> {
    match decision {
        Decision::Deny(d) if d.reason.is_empty() => Err("a denial needs a reason".to_string()),
        _ => Ok(()),
    }
}

/// Discovered devices have ids, each once.
pub fn discovered(devices: &[Device]) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    match devices
        .iter()
        .find(|d| d.id.is_empty() || !seen.insert(&d.id))
    {
        Some(d) => Err(format!("device id {:?} is empty or repeated", d.id)),
        None => Ok(()),
    }
}

/// A preferred allocation picks available devices, each once, and every one of
/// `must_include`.
pub fn preferred(
    ids: &[String],
    available: &[String],
    must_include: &[String],
) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    if let Some(id) = ids
        .iter()
        .find(|id| !available.contains(id) || !seen.insert(*id))
    {
        return Err(format!("device {id:?} is not available or picked twice"));
    }
    if let Some(id) = must_include.iter().find(|id| !ids.contains(id)) {
        return Err(format!("device {id:?} must be included"));
    }
    Ok(())
}

/// An eviction ranking names candidates by index, in range, each once; the
/// candidates it leaves out follow in the built-in order. Returns the whole order.
pub fn ranking(ranked: &[u32], candidates: &[Candidate]) -> Result<Vec<u32>, String> {
    crate::policy::complete_ranking(ranked, candidates)
}
