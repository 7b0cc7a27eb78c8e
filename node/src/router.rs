//! RuntimeRouter: which runtime runs a pod.
//!
//! The pod's RuntimeClass names a handler (in standalone mode the table comes from
//! the node config; `wasmtime` is always the native Wasm runtime). A pod without a
//! RuntimeClass goes to the Wasm runtime when every one of its images is a Wasm image
//! in the node's store, else to the default runtime (CRI when one is configured). A pod
//! is never split across runtimes.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::Pod;
use wasmlet_runtime::Runtime;
use wasmlet_runtime_wasm::ImageStore;

/// The runtimes of the node, by handler.
#[derive(Clone)]
pub struct RuntimeRouter {
    /// RuntimeClass name -> handler.
    classes: BTreeMap<String, String>,
    /// handler -> runtime.
    handlers: BTreeMap<String, Arc<dyn Runtime>>,
    /// The handler of pods without a RuntimeClass.
    default_handler: String,
    /// The Wasm image store, to route pods whose images are all Wasm images.
    wasm_images: Option<ImageStore>,
    /// RuntimeClass name -> handler from the API server's RuntimeClass objects, when
    /// the node is in a cluster; they win over the configured classes.
    api_classes: Arc<RwLock<Option<BTreeMap<String, String>>>>,
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
            wasm_images: None,
            api_classes: Arc::default(),
        }
    }

    /// Routes pods without a RuntimeClass whose images are all in `store` to the Wasm
    /// runtime.
    pub fn with_wasm_images(mut self, store: ImageStore) -> Self {
        self.wasm_images = Some(store);
        self
    }

    fn all_images_are_wasm(&self, pod: &Pod) -> bool {
        let Some(store) = &self.wasm_images else {
            return false;
        };
        let Some(spec) = &pod.spec else { return false };
        spec.containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .all(|c| c.image.as_deref().is_some_and(|i| store.resolve(i).is_ok()))
    }

    /// Replaces the RuntimeClasses known from the API server.
    pub fn set_api_classes(&self, classes: BTreeMap<String, String>) {
        *self.api_classes.write().unwrap() = Some(classes);
    }

    /// The handler of a RuntimeClass: the API's RuntimeClass object, else this node's
    /// configuration.
    fn class_handler(&self, class: &str) -> Option<String> {
        if let Some(h) = self
            .api_classes
            .read()
            .unwrap()
            .as_ref()
            .and_then(|m| m.get(class))
        {
            return Some(h.clone());
        }
        self.classes.get(class).cloned()
    }

    /// The runtime for a pod and the handler name to pass it.
    pub fn for_pod(&self, pod: &Pod) -> Result<(Arc<dyn Runtime>, String), String> {
        let class = pod.spec.as_ref().and_then(|s| s.runtime_class_name.clone());
        let handler = match &class {
            Some(class) => self
                .class_handler(class)
                .ok_or_else(|| format!("RuntimeClass {class:?} is not configured on this node"))?,
            None if self.all_images_are_wasm(pod) => wasmlet_runtime_wasm::HANDLER.to_owned(),
            None => self.default_handler.clone(),
        };
        // A handler the node was not told about goes to the CRI runtime (the default
        // handler `""`), which knows its own handlers, as the kubelet passes it on.
        let runtime = self
            .handlers
            .get(&handler)
            .or_else(|| {
                (handler != wasmlet_runtime_wasm::HANDLER)
                    .then(|| self.handlers.get(""))
                    .flatten()
            })
            .cloned()
            .ok_or_else(|| format!("no runtime for handler {handler:?} is configured"))?;
        Ok((runtime, handler))
    }

    /// The handler names pods can use (`""` is the default runtime's).
    pub fn handler_names(&self) -> Vec<String> {
        self.handlers.keys().cloned().collect()
    }

    /// The runtime of pods without a RuntimeClass.
    pub fn default_runtime(&self) -> Option<Arc<dyn Runtime>> {
        self.handlers.get(&self.default_handler).cloned()
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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec};

    fn pod(images: &[&str]) -> Pod {
        Pod {
            spec: Some(PodSpec {
                containers: images
                    .iter()
                    .enumerate()
                    .map(|(i, image)| Container {
                        name: format!("c{i}"),
                        image: Some(image.to_string()),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn pods_whose_images_are_all_wasm_images_go_to_the_wasm_runtime() {
        let images = wasmlet_testkit::images::ensure_example_images().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path()).unwrap();
        store.import_archive(&images.join("hello.tar")).unwrap();
        let router =
            RuntimeRouter::new(BTreeMap::new(), BTreeMap::new(), "").with_wasm_images(store);
        let wasm = "localhost/wasmlet-examples/hello:latest";
        assert!(router.all_images_are_wasm(&pod(&[wasm])));
        assert!(router.all_images_are_wasm(&pod(&[wasm, wasm])));
        assert!(
            !router.all_images_are_wasm(&pod(&[wasm, "busybox:1.36"])),
            "never split a pod"
        );
        assert!(!router.all_images_are_wasm(&pod(&["busybox:1.36"])));
        let without_store = RuntimeRouter::new(BTreeMap::new(), BTreeMap::new(), "");
        assert!(!without_store.all_images_are_wasm(&pod(&[wasm])));
    }

    #[test]
    fn runtime_classes_from_the_api_win_over_the_configured_ones() {
        let router = RuntimeRouter::new(
            BTreeMap::from([("wasm".to_owned(), "wasmtime".to_owned())]),
            BTreeMap::new(),
            "",
        );
        assert_eq!(router.class_handler("wasm").as_deref(), Some("wasmtime"));
        assert_eq!(router.class_handler("edge"), None);
        // Clones share the API's classes (the watcher holds one).
        router.clone().set_api_classes(BTreeMap::from([
            ("edge".to_owned(), "wasmtime".to_owned()),
            ("wasm".to_owned(), "runc".to_owned()),
        ]));
        assert_eq!(router.class_handler("edge").as_deref(), Some("wasmtime"));
        assert_eq!(router.class_handler("wasm").as_deref(), Some("runc"));
    }
}
