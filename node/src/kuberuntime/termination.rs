//! Termination messages: the file each container attempt writes, or the end of its
//! log.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::{Container, Pod};
use wasmlet_runtime::ContainerState;

use crate::pod::uid;
use crate::pod_state::PodState;
use crate::sync::{PodSyncer, pod_log_dir};

/// The text of the last `lines` lines of a CRI log file, at most `max_bytes` bytes
/// (the end is kept).
pub fn tail_of_log(path: &std::path::Path, lines: usize, max_bytes: usize) -> String {
    let Ok(text) = std::fs::read_to_string(path) else {
        return String::new();
    };
    let texts: Vec<&str> = text
        .lines()
        .filter_map(|l| l.splitn(4, ' ').nth(3))
        .collect();
    let start = texts.len().saturating_sub(lines);
    let joined = texts[start..].join("\n");
    let mut cut = joined.len().saturating_sub(max_bytes);
    while !joined.is_char_boundary(cut) {
        cut += 1;
    }
    joined[cut..].to_owned()
}

impl PodSyncer {
    /// The host file a container attempt writes its termination message to.
    pub(crate) fn termination_file(
        &self,
        pod: &Pod,
        c: &Container,
        attempt: u32,
    ) -> Option<PathBuf> {
        let path = c
            .termination_message_path
            .as_deref()
            .unwrap_or("/dev/termination-log");
        let base = std::path::Path::new(path).file_name()?;
        Some(
            self.pods_dir
                .as_ref()?
                .join(uid(pod))
                .join("containers")
                .join(&c.name)
                .join(attempt.to_string())
                .join(base),
        )
    }

    /// Fills the message of containers that exited from their termination message
    /// file (at most 4096 bytes), or — with `FallbackToLogsOnError` and a failure — from
    /// the last lines of their log (80 lines, 2048 bytes), as the kubelet does.
    pub(crate) fn termination_messages(&self, pod: &Pod, st: &mut PodState) {
        for c in crate::pod::containers(pod) {
            let Some(rec) = st.containers.get_mut(&c.name) else {
                continue;
            };
            let attempt = rec.restart_count;
            let Some(cs) = rec.current.as_mut() else {
                continue;
            };
            if cs.state != ContainerState::Exited || !cs.message.is_empty() {
                continue;
            }
            let mut message = self
                .termination_file(pod, c, attempt)
                .and_then(|f| std::fs::read(f).ok())
                .map(|mut b| {
                    b.truncate(4096);
                    String::from_utf8_lossy(&b).into_owned()
                })
                .unwrap_or_default();
            if message.is_empty()
                && cs.exit_code != 0
                && c.termination_message_policy.as_deref() == Some("FallbackToLogsOnError")
            {
                let log = pod_log_dir(&self.pod_logs_dir, pod)
                    .join(&c.name)
                    .join(format!("{attempt}.log"));
                message = tail_of_log(&log, 80, 2048);
            }
            cs.message = message;
        }
    }
}
