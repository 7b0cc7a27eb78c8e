//! RuntimeRouter: which runtime runs a pod.
//!
//! The pod's RuntimeClass names a handler (in standalone mode the table comes from
//! the node config; `wasmtime` is always the native Wasm runtime). A pod without a
//! RuntimeClass goes to the default runtime. A pod is never split across runtimes.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use wasmlet_runtime::Runtime;

/// The runtimes of the node, by handler.
#[derive(Clone)]
pub struct RuntimeRouter {
    /// RuntimeClass name -> handler.
    classes: BTreeMap<String, String>,
    /// handler -> runtime.
    handlers: BTreeMap<String, Arc<dyn Runtime>>,
    /// The handler of pods without a RuntimeClass.
    default_handler: String,
}

impl RuntimeRouter {
    pub fn new(
        classes: BTreeMap<String, String>,
        handlers: BTreeMap<String, Arc<dyn Runtime>>,
        default_handler: impl Into<String>,
    ) -> Self {
        RuntimeRouter {
            classes,
            handlers,
            default_handler: default_handler.into(),
        }
    }

    /// The runtime for a pod and the handler name to pass it.
    pub fn for_pod(&self, pod: &Pod) -> Result<(Arc<dyn Runtime>, String), String> {
        let class = pod.spec.as_ref().and_then(|s| s.runtime_class_name.clone());
        let handler =
            match &class {
                Some(class) => self.classes.get(class).cloned().ok_or_else(|| {
                    format!("RuntimeClass {class:?} is not configured on this node")
                })?,
                None => self.default_handler.clone(),
            };
        let runtime = self
            .handlers
            .get(&handler)
            .cloned()
            .ok_or_else(|| format!("no runtime for handler {handler:?} is configured"))?;
        Ok((runtime, handler))
    }

    /// Every distinct runtime, once.
    pub fn runtimes(&self) -> Vec<Arc<dyn Runtime>> {
        let mut seen: Vec<Arc<dyn Runtime>> = Vec::new();
        for r in self.handlers.values() {
            if !seen.iter().any(|s| Arc::ptr_eq(s, r)) {
                seen.push(r.clone());
            }
        }
        seen
    }
}
