//! `widget-device`: a device adapter for pretend `example.com/widget` devices,
//! described entirely by its node settings. A real adapter would look at `/dev`
//! or a vendor library; this one shows the protocol.
//!
//! | key | default | meaning |
//! | --- | --- | --- |
//! | `resource-name` | `example.com/widget` | the extended resource |
//! | `count` | `3` | devices `widget-0` .. `widget-<count-1>` |
//! | `unhealthy` | none | comma-separated ids reported unhealthy |
//! | `numa` | none | the NUMA node of every device, or a comma-separated list, one per device |
//! | `host-device` | none | a host device node given to the container as `/dev/<id>` for each device; `{id}` and `{index}` are replaced |
//! | `mount-host-path` | none | a host directory mounted read-only at `mount-container-path` |
//! | `mount-container-path` | `/var/run/widget` | where that directory appears |
//! | `fail-after-ms` | none | from this wall-clock time (ms since the epoch) on, `discover` traps: a broken device driver, for testing the node's failure path |
//!
//! An allocation sets `WIDGET_IDS=<id>,<id>` and the annotation
//! `example.com/widget-ids`; asking for an unknown or unhealthy id fails it.
//! Preferred allocation takes the must-include devices first, then the lowest ids.

use wasmlet_plugin_sdk::device::{Allocation, Device, DeviceAdapter, DeviceNode, Mount};
use wasmlet_plugin_sdk::host::{self, SettingError, Settings};
use wasmlet_plugin_sdk::types::Pair;

const PREFIX: &str = "widget-";

/// The devices and what a container gets, read from the settings.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Widgets {
    resource_name: String,
    count: u32,
    unhealthy: Vec<String>,
    numa: Vec<u32>,
    host_device: Option<String>,
    mount: Option<(String, String)>,
}

impl Widgets {
    fn from_settings(settings: &Settings) -> Result<Self, SettingError> {
        let list = |key: &str| -> Vec<String> {
            settings
                .get_or(key, "")
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        };
        let numa = list("numa")
            .iter()
            .map(|n| {
                n.parse::<u32>().map_err(|e| SettingError::Invalid {
                    key: "numa".into(),
                    value: settings.get_or("numa", "").into(),
                    reason: e.to_string(),
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Widgets {
            resource_name: settings
                .get_or("resource-name", "example.com/widget")
                .to_string(),
            count: settings.parse_or("count", 3)?,
            unhealthy: list("unhealthy"),
            numa,
            host_device: settings.get("host-device").map(str::to_string),
            mount: settings.get("mount-host-path").map(|host| {
                (
                    host.to_string(),
                    settings
                        .get_or("mount-container-path", "/var/run/widget")
                        .to_string(),
                )
            }),
        })
    }

    fn load() -> Result<Self, String> {
        Widgets::from_settings(&host::settings()).map_err(|e| e.to_string())
    }

    fn devices(&self) -> Vec<Device> {
        (0..self.count)
            .map(|i| {
                let id = format!("{PREFIX}{i}");
                let numa_node = match self.numa.as_slice() {
                    [] => None,
                    [all] => Some(*all),
                    list => list.get(i as usize).copied(),
                };
                Device {
                    healthy: !self.unhealthy.contains(&id),
                    id,
                    numa_node,
                }
            })
            .collect()
    }

    fn allocate(&self, ids: &[String]) -> Result<Allocation, String> {
        let devices = self.devices();
        let mut allocation = Allocation::empty();
        for id in ids {
            let Some(device) = devices.iter().find(|d| &d.id == id) else {
                return Err(format!("no {} device {id:?}", self.resource_name));
            };
            if !device.healthy {
                return Err(format!("{} device {id} is unhealthy", self.resource_name));
            }
            if let Some(host) = &self.host_device {
                let index = id.trim_start_matches(PREFIX);
                allocation.devices.push(DeviceNode {
                    container_path: format!("/dev/{id}"),
                    host_path: host.replace("{id}", id).replace("{index}", index),
                    permissions: "rw".into(),
                });
            }
        }
        let joined = ids.join(",");
        allocation
            .envs
            .push(Pair::new("WIDGET_IDS", joined.clone()));
        allocation
            .annotations
            .push(Pair::new("example.com/widget-ids", joined));
        if let Some((host_path, container_path)) = &self.mount {
            allocation.mounts.push(Mount {
                container_path: container_path.clone(),
                host_path: host_path.clone(),
                read_only: true,
            });
        }
        Ok(allocation)
    }
}

/// The device's number, for ordering `widget-2` before `widget-10`; ids of
/// another shape sort after, by name.
fn order_key(id: &str) -> (u64, &str) {
    let n = id
        .strip_prefix(PREFIX)
        .and_then(|n| n.parse().ok())
        .unwrap_or(u64::MAX);
    (n, id)
}

/// Must-include first, then the lowest ids, `size` in all.
fn preferred(available: &[String], must_include: &[String], size: u32) -> Vec<String> {
    let mut rest: Vec<String> = available
        .iter()
        .filter(|id| !must_include.contains(id))
        .cloned()
        .collect();
    rest.sort_by(|a, b| order_key(a).cmp(&order_key(b)));
    wasmlet_plugin_sdk::device::default_preferred_allocation(&rest, must_include, size)
}

struct WidgetDevice;

impl DeviceAdapter for WidgetDevice {
    fn resource_name() -> String {
        Widgets::load()
            .map(|w| w.resource_name)
            .unwrap_or_else(|_| "example.com/widget".to_string())
    }

    fn discover() -> Vec<Device> {
        let fail_after = host::settings()
            .get("fail-after-ms")
            .and_then(|v| v.parse::<u64>().ok());
        if fail_after.is_some_and(|t| host::now_ms() >= t) {
            panic!("widget-device: the devices stopped answering (fail-after-ms)");
        }
        match Widgets::load() {
            Ok(widgets) => widgets.devices(),
            Err(e) => {
                host::error!("{e}; reporting no devices");
                Vec::new()
            }
        }
    }

    fn allocate(device_ids: Vec<String>) -> Result<Allocation, String> {
        Widgets::load()?.allocate(&device_ids)
    }

    fn preferred_allocation(
        available: Vec<String>,
        must_include: Vec<String>,
        size: u32,
    ) -> Vec<String> {
        preferred(&available, &must_include, size)
    }
}

wasmlet_plugin_sdk::export_device_adapter!(WidgetDevice);

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn widgets(settings: &[(&str, &str)]) -> Widgets {
        Widgets::from_settings(&settings.iter().copied().collect()).unwrap()
    }

    #[test]
    fn discovery_follows_the_settings() {
        let w = widgets(&[("count", "3"), ("unhealthy", "widget-1"), ("numa", "0,0,1")]);
        let devices = w.devices();
        let summary: Vec<(&str, bool, Option<u32>)> = devices
            .iter()
            .map(|d| (d.id.as_str(), d.healthy, d.numa_node))
            .collect();
        assert_eq!(
            summary,
            [
                ("widget-0", true, Some(0)),
                ("widget-1", false, Some(0)),
                ("widget-2", true, Some(1))
            ]
        );
        assert_eq!(widgets(&[]).devices().len(), 3);
        assert!(widgets(&[]).devices().iter().all(|d| d.numa_node.is_none()));
    }

    #[test]
    fn allocation() {
        let w = widgets(&[
            ("unhealthy", "widget-1"),
            ("host-device", "/dev/null"),
            ("mount-host-path", "/opt/widget"),
        ]);
        let a = w.allocate(&ids(&["widget-0", "widget-2"])).unwrap();
        assert_eq!(a.envs, vec![Pair::new("WIDGET_IDS", "widget-0,widget-2")]);
        assert_eq!(a.devices.len(), 2);
        assert_eq!(a.devices[1].container_path, "/dev/widget-2");
        assert_eq!(a.devices[1].host_path, "/dev/null");
        assert_eq!(a.mounts[0].container_path, "/var/run/widget");
        assert!(a.mounts[0].read_only);
        assert!(
            w.allocate(&ids(&["widget-1"]))
                .unwrap_err()
                .contains("unhealthy")
        );
        assert!(w.allocate(&ids(&["widget-9"])).is_err());
    }

    #[test]
    fn preferred_takes_must_include_then_lowest_ids() {
        let available = ids(&["widget-10", "widget-3", "widget-2", "widget-0"]);
        assert_eq!(
            preferred(&available, &ids(&["widget-3"]), 3),
            ids(&["widget-3", "widget-0", "widget-2"])
        );
        assert_eq!(preferred(&available, &[], 1), ids(&["widget-0"]));
    }
}
