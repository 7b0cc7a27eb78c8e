//! Images: a container's image is present, or pulled, within the pull back-off.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Container, Pod};
use wasmlet_runtime::Runtime;

use crate::cluster::events::{NORMAL, WARNING};
use crate::pod::uid;
use crate::pod_state::Waiting;
use crate::sync::{PodSyncer, StartError};

impl PodSyncer {
    pub(crate) async fn ensure_image(
        &self,
        runtime: &dyn Runtime,
        pod: &Pod,
        c: &Container,
    ) -> Result<(), StartError> {
        let image = c.image.clone().unwrap_or_default();
        let policy = c.image_pull_policy.as_deref().unwrap_or("IfNotPresent");
        let present = runtime.image_status(&image).await.map_err(|e| StartError {
            waiting: Waiting::new("ErrImagePull", format!("image status of {image:?}: {e}")),
            retry: self.retry_after_error,
        })?;
        match (policy, present.is_some()) {
            ("Never", false) => {
                return Err(StartError {
                    waiting: Waiting::new(
                        "ErrImageNeverPull",
                        format!(
                            "Container image {image:?} is not present with pull policy of Never"
                        ),
                    ),
                    retry: self.retry_after_error,
                });
            }
            ("Never", true) | ("IfNotPresent", true) => {
                self.events.pod(
                    pod,
                    Some(&c.name),
                    NORMAL,
                    "Pulled",
                    format!("Container image {image:?} already present on machine"),
                );
                return Ok(());
            }
            _ => {}
        }
        let key = format!("{}/{image}", uid(pod));
        let now = Timestamp::now();
        {
            let backoff = self.image_backoff.lock().unwrap();
            if let Some(left) = backoff.remaining_since_update(&key, now) {
                self.events.pod(
                    pod,
                    Some(&c.name),
                    NORMAL,
                    "BackOff",
                    format!("Back-off pulling image {image:?}"),
                );
                let last = self.pull_errors.lock().unwrap().get(&key).cloned();
                return Err(StartError {
                    waiting: Waiting::new(
                        "ImagePullBackOff",
                        match last {
                            Some(e) => {
                                format!("Back-off pulling image {image:?}: ErrImagePull: {e}")
                            }
                            None => format!("Back-off pulling image {image:?}"),
                        },
                    ),
                    retry: left,
                });
            }
        }
        self.events.pod(
            pod,
            Some(&c.name),
            NORMAL,
            "Pulling",
            format!("Pulling image {image:?}"),
        );
        let pull_started = std::time::Instant::now();
        // No credentials are resolved for pods yet (imagePullSecrets, credential
        // providers): anonymous pulls, or what the runtime itself is configured with.
        match runtime.pull_image(&image, None).await {
            Ok(_) => {
                self.pull_errors.lock().unwrap().remove(&key);
                self.events.pod(
                    pod,
                    Some(&c.name),
                    NORMAL,
                    "Pulled",
                    format!(
                        "Successfully pulled image {image:?} in {:.3?}",
                        pull_started.elapsed()
                    ),
                );
                Ok(())
            }
            Err(e) => {
                self.events.pod(
                    pod,
                    Some(&c.name),
                    WARNING,
                    "Failed",
                    format!("Failed to pull image {image:?}: {e}"),
                );
                // The back-off runs from the failure, not from the start of a pull
                // that may have taken a while (the kubelet's `backOff.Next(key, now)`).
                let failed_at = Timestamp::now();
                let mut backoff = self.image_backoff.lock().unwrap();
                backoff.next(&key, failed_at, failed_at);
                let delay = backoff.get(&key).unwrap_or(self.retry_after_error);
                self.pull_errors.lock().unwrap().insert(key, e.to_string());
                // Look again halfway through the back-off, so the status moves from
                // ErrImagePull to ImagePullBackOff as the kubelet's does.
                Err(StartError {
                    waiting: Waiting::new("ErrImagePull", e.to_string()),
                    retry: delay / 2,
                })
            }
        }
    }
}
