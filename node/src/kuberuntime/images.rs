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
        let waiting_from = std::time::Instant::now();
        // The pod's pull secrets matching the image, best first, then the node's own
        // (its docker configuration, the credential providers), each tried until one
        // works (the kubelet's keyring); none: an anonymous pull, or what the runtime
        // itself is configured with.
        let mut credentials = self.pull_credentials(pod, c, &image).await;
        if let Some(keyring) = &self.node_keyring {
            credentials.extend(keyring.lookup(&image).await);
        }
        let (pulled, pull_time) = match self.pull_limits.admit().await {
            Ok(permit) => {
                let started = std::time::Instant::now();
                let mut pulled = None;
                for auth in &credentials {
                    let attempt = runtime.pull_image(&image, Some(auth)).await;
                    let ok = attempt.is_ok();
                    pulled = Some(attempt);
                    if ok {
                        break;
                    }
                }
                let pulled = match pulled {
                    Some(p) => p,
                    None => runtime.pull_image(&image, None).await,
                };
                drop(permit);
                (pulled, started.elapsed())
            }
            Err(refused) => (
                Err(wasmlet_runtime::Error::image_pull(&image, refused)),
                std::time::Duration::ZERO,
            ),
        };
        match pulled {
            Ok(_) => {
                self.pull_errors.lock().unwrap().remove(&key);
                let size = runtime
                    .image_status(&image)
                    .await
                    .ok()
                    .flatten()
                    .map(|i| i.size)
                    .unwrap_or(0);
                use crate::images::puller::event_duration;
                self.events.pod(
                    pod,
                    Some(&c.name),
                    NORMAL,
                    "Pulled",
                    format!(
                        "Successfully pulled image {image:?} in {} ({} including waiting). Image size: {size} bytes.",
                        event_duration(pull_time),
                        event_duration(waiting_from.elapsed()),
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

    /// The credentials of the pod's `imagePullSecrets` for `image`. A secret that
    /// cannot be read or parsed is reported (the kubelet's
    /// `FailedToRetrieveImagePullSecret`) and skipped.
    async fn pull_credentials(
        &self,
        pod: &Pod,
        c: &Container,
        image: &str,
    ) -> Vec<wasmlet_runtime::AuthConfig> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let mut all = Vec::new();
        let names = pod
            .spec
            .iter()
            .flat_map(|s| s.image_pull_secrets.iter().flatten())
            .map(|r| r.name.clone());
        for name in names {
            let found = match self.objects.secret(namespace, &name).await {
                Ok(Some(secret)) => crate::images::credentials::from_secret(&secret),
                Ok(None) => Err(format!("secret {namespace}/{name} not found")),
                Err(e) => Err(e),
            };
            match found {
                Ok(credentials) => all.extend(credentials),
                Err(e) => self.events.pod(
                    pod,
                    Some(&c.name),
                    WARNING,
                    "FailedToRetrieveImagePullSecret",
                    format!(
                        "Unable to retrieve some image pull secrets ({name}); attempting to pull the image may not succeed: {e}"
                    ),
                ),
            }
        }
        crate::images::credentials::lookup(&all, image)
    }
}
