//! The `device-adapter-plugin` world: expose devices to pods as an extended
//! resource (`example.com/widget`), like a Kubernetes device plugin.
//!
//! Implement [`DeviceAdapter`] and export it with
//! [`export_device_adapter!`](crate::export_device_adapter). The node calls
//! [`DeviceAdapter::discover`] at load and periodically, advertises the healthy
//! devices as the node's capacity of [`DeviceAdapter::resource_name`], and calls
//! [`DeviceAdapter::allocate`] for each container that requests the resource.

pub use crate::bindings::device_world::exports::wasmlet::plugin::device_adapter::{
    Allocation, Device, DeviceNode, Mount,
};

/// A device adapter plugin.
pub trait DeviceAdapter {
    /// The extended resource name, e.g. `example.com/widget`.
    fn resource_name() -> String;

    /// The devices present now, with their health.
    fn discover() -> Vec<Device>;

    /// Prepares `device_ids` for one container: environment, mounts, device nodes,
    /// annotations. `Err` fails the container's start with the message.
    fn allocate(device_ids: Vec<String>) -> Result<Allocation, String>;

    /// Picks `size` devices among `available`, keeping every one of
    /// `must_include`. The default is [`default_preferred_allocation`].
    fn preferred_allocation(
        available: Vec<String>,
        must_include: Vec<String>,
        size: u32,
    ) -> Vec<String> {
        default_preferred_allocation(&available, &must_include, size)
    }
}

/// `must_include` first (in its order), then the other `available` devices in
/// their order: `size` in all, fewer when there are not enough, and every one of
/// `must_include` even when they alone are more than `size`. Duplicates are dropped.
pub fn default_preferred_allocation(
    available: &[String],
    must_include: &[String],
    size: u32,
) -> Vec<String> {
    let size = usize::try_from(size).unwrap_or(usize::MAX);
    let mut picked: Vec<String> =
        Vec::with_capacity(size.min(available.len() + must_include.len()));
    for id in must_include.iter().chain(available) {
        if picked.len() >= size.max(must_include.len()) {
            break;
        }
        if !picked.contains(id) {
            picked.push(id.clone());
        }
    }
    picked
}

impl Allocation {
    /// An empty allocation to fill in.
    pub fn empty() -> Self {
        Allocation {
            envs: Vec::new(),
            mounts: Vec::new(),
            devices: Vec::new(),
            annotations: Vec::new(),
        }
    }
}

/// Exports a [`DeviceAdapter`] implementation as the plugin's
/// `wasmlet:plugin/device-adapter` interface. Use it once, at the crate's top level.
#[macro_export]
macro_rules! export_device_adapter {
    ($ty:ty) => {
        const _: () = {
            struct __WasmletDeviceAdapterExport;
            impl $crate::bindings::device_world::exports::wasmlet::plugin::device_adapter::Guest
                for __WasmletDeviceAdapterExport
            {
                fn resource_name() -> ::std::string::String {
                    <$ty as $crate::device::DeviceAdapter>::resource_name()
                }
                fn discover() -> ::std::vec::Vec<$crate::device::Device> {
                    <$ty as $crate::device::DeviceAdapter>::discover()
                }
                fn allocate(
                    device_ids: ::std::vec::Vec<::std::string::String>,
                ) -> ::std::result::Result<$crate::device::Allocation, ::std::string::String>
                {
                    <$ty as $crate::device::DeviceAdapter>::allocate(device_ids)
                }
                fn preferred_allocation(
                    available: ::std::vec::Vec<::std::string::String>,
                    must_include: ::std::vec::Vec<::std::string::String>,
                    size: u32,
                ) -> ::std::vec::Vec<::std::string::String> {
                    <$ty as $crate::device::DeviceAdapter>::preferred_allocation(
                        available,
                        must_include,
                        size,
                    )
                }
            }
            $crate::bindings::device_world::__export_device_adapter_plugin!(
                __WasmletDeviceAdapterExport with_types_in $crate::bindings::device_world
            );
        };
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn preferred_allocation_keeps_must_include_then_fills_in_order() {
        let available = ids(&["w0", "w1", "w2", "w3"]);
        let cases: [(&[&str], u32, &[&str]); 5] = [
            (&[], 2, &["w0", "w1"]),
            (&["w2"], 2, &["w2", "w0"]),
            (&["w3", "w1"], 3, &["w3", "w1", "w0"]),
            (&[], 9, &["w0", "w1", "w2", "w3"]),
            (&["w1", "w2"], 1, &["w1", "w2"]),
        ];
        for (must, size, want) in cases {
            assert_eq!(
                default_preferred_allocation(&available, &ids(must), size),
                ids(want),
                "must {must:?} size {size}"
            );
        }
    }
}
