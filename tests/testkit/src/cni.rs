//! A private CNI network for a test: a configuration directory holding a network
//! list of `bridge` with `host-local`, then `portmap`, with a bridge and a /24 of its
//! own, the IPAM allocations in a directory of its own, and Debian's plugins. What the
//! network leaves on the machine is named after the run (`wn-<pid>-<n>`), listed by
//! [`CniNetwork::leftovers`] and removed when the value is dropped.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::containerd::{CNI_BIN_DIR, Subnet, choose_subnet, host_routes};

/// One test's CNI network.
#[derive(Debug)]
pub struct CniNetwork {
    dir: tempfile::TempDir,
    /// The network's (and its bridge's) name.
    pub name: String,
    pub subnet: Subnet,
}

impl CniNetwork {
    /// A bridge network with `host-local` IPAM and `portmap` chained after it.
    pub fn new() -> anyhow::Result<Self> {
        Self::with_plugins(&[])
    }

    /// The same, with `extra` plugin configurations chained after `portmap`.
    pub fn with_plugins(extra: &[serde_json::Value]) -> anyhow::Result<Self> {
        static RUNS: AtomicU32 = AtomicU32::new(0);
        let pid = std::process::id();
        let n = RUNS.fetch_add(1, Ordering::Relaxed);
        let name = format!("wn-{}-{n}", pid % 100_000);
        // Away from the private containerd's seeds (pid × 16 + n).
        let seed = pid.wrapping_mul(16).wrapping_add(8 + n);
        let subnet = choose_subnet(seed, &host_routes())
            .ok_or_else(|| anyhow::anyhow!("no free /24 near candidate {seed}"))?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("{name}."))
            .tempdir()?;
        let this = CniNetwork { dir, name, subnet };
        std::fs::create_dir_all(this.conf_dir())?;
        std::fs::create_dir_all(this.ipam_dir())?;
        let mut plugins = vec![
            serde_json::json!({
                "type": "bridge",
                "bridge": this.name,
                "isGateway": true,
                "ipMasq": false,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": subnet.to_string(), "gateway": subnet.gateway()}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": this.ipam_dir(),
                },
            }),
            serde_json::json!({"type": "portmap", "capabilities": {"portMappings": true}}),
        ];
        plugins.extend(extra.iter().cloned());
        let list = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": this.name,
            "plugins": plugins,
        });
        std::fs::write(
            this.conf_dir().join("10-test.conflist"),
            serde_json::to_vec_pretty(&list)?,
        )?;
        Ok(this)
    }

    /// The configuration directory (`--cni-conf-dir`).
    pub fn conf_dir(&self) -> PathBuf {
        self.dir.path().join("net.d")
    }

    /// host-local's allocations.
    pub fn ipam_dir(&self) -> PathBuf {
        self.dir.path().join("ipam")
    }

    /// The plugin directories (`--cni-bin-dir`).
    pub fn bin_dirs(&self) -> Vec<PathBuf> {
        vec![PathBuf::from(CNI_BIN_DIR)]
    }

    /// A directory for the test's network namespaces.
    pub fn netns_dir(&self) -> PathBuf {
        self.dir.path().join("netns")
    }

    /// The addresses host-local has handed out and not released.
    pub fn allocations(&self) -> Vec<String> {
        let dir = self.ipam_dir().join(&self.name);
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        let mut ips: Vec<String> = entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
            .collect();
        ips.sort();
        ips
    }

    /// The veths attached to the bridge.
    pub fn bridge_ports(&self) -> Vec<String> {
        let ports = Path::new("/sys/class/net").join(&self.name).join("brif");
        let mut names: Vec<String> = std::fs::read_dir(ports)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// The iptables rules that name the network (portmap's chains and rules carry its
    /// name or the pods' addresses in their comments).
    pub fn iptables_rules(&self) -> Vec<String> {
        let Ok(out) = std::process::Command::new("iptables-save").output() else {
            return Vec::new();
        };
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains(&self.name) || l.contains(&self.subnet_prefix()))
            .map(str::to_owned)
            .collect()
    }

    fn subnet_prefix(&self) -> String {
        let [a, b, c] = self.subnet.0;
        format!("{a}.{b}.{c}.")
    }

    /// The namespace files left in [`Self::netns_dir`].
    pub fn namespaces(&self) -> Vec<String> {
        std::fs::read_dir(self.netns_dir())
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    }

    /// Everything pods left on the network: allocations, veths, iptables rules,
    /// namespaces. Empty once every pod is gone.
    pub fn leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        left.extend(
            self.allocations()
                .into_iter()
                .map(|ip| format!("allocation {ip}")),
        );
        left.extend(self.bridge_ports().into_iter().map(|p| format!("veth {p}")));
        left.extend(
            self.iptables_rules()
                .into_iter()
                .map(|r| format!("iptables {r}")),
        );
        left.extend(self.namespaces().into_iter().map(|n| format!("netns {n}")));
        left
    }
}

impl Drop for CniNetwork {
    fn drop(&mut self) {
        // What a failed test left: namespaces unmounted, the bridge and its ports.
        for ns in self.namespaces() {
            let path = self.netns_dir().join(ns);
            let _ = nix::mount::umount2(&path, nix::mount::MntFlags::MNT_DETACH);
        }
        crate::containerd::delete_bridge(&self.name);
    }
}
