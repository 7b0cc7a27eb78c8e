//! The background task that follows `GetContainerEvents` and republishes it as
//! [`RuntimeEvent`]s.
//!
//! The stream is only a hint: the node's PLEG relists anyway. So the task never
//! fails anyone: a runtime without the RPC (containerd before 1.7, CRI-O before
//! 1.26) is logged once and left alone; a broken or ended stream is reopened with
//! back-off, which also carries the node across runtime restarts.

use std::time::Duration;

use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tonic::transport::Channel;
use wasmlet_proto::cri::v1 as cri;
use wasmlet_proto::cri::v1::runtime_service_client::RuntimeServiceClient;
use wasmlet_runtime::RuntimeEvent;

use crate::convert;

/// The first pause before reopening the stream; it doubles up to [`MAX_BACKOFF`].
pub(crate) const INITIAL_BACKOFF: Duration = Duration::from_millis(500);
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Why the task stopped following events.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    Cancelled,
    Unimplemented,
}

/// Follows the runtime's events until `stop` is cancelled or the runtime says it has
/// no such RPC.
pub(crate) async fn follow(
    client: RuntimeServiceClient<Channel>,
    events: broadcast::Sender<RuntimeEvent>,
    endpoint: String,
    stop: CancellationToken,
) -> Ended {
    let mut backoff = INITIAL_BACKOFF;
    let mut failures = 0u32;
    loop {
        let outcome = tokio::select! {
            _ = stop.cancelled() => return Ended::Cancelled,
            outcome = stream_once(client.clone(), &events) => outcome,
        };
        // A stream that carried events, or stayed open a while, shows a healthy
        // runtime: start over with a short pause. One that ends at once keeps backing off.
        if outcome.delivered > 0 || outcome.lasted >= MAX_BACKOFF {
            backoff = INITIAL_BACKOFF;
            failures = 0;
        }
        match outcome.error {
            None => {
                tracing::debug!(%endpoint, delivered = outcome.delivered, "CRI event stream ended; reopening");
            }
            Some(status) if status.code() == Code::Unimplemented => {
                tracing::info!(
                    %endpoint,
                    "the runtime does not implement GetContainerEvents ({}); \
                     container changes are found by relisting only",
                    status.message()
                );
                return Ended::Unimplemented;
            }
            Some(status) => {
                failures += 1;
                if failures == 1 {
                    tracing::warn!(%endpoint, code = ?status.code(), "CRI event stream failed: {}; retrying", status.message());
                } else {
                    tracing::debug!(%endpoint, code = ?status.code(), failures, "CRI event stream failed again: {}", status.message());
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return Ended::Cancelled,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// How one attempt at following the stream went.
struct Outcome {
    /// Messages received before the stream ended.
    delivered: u64,
    /// How long the attempt took, from the call to the end of the stream.
    lasted: Duration,
    /// Why it ended; `None` when the runtime closed it normally (CRI-O does so at
    /// once on some versions).
    error: Option<tonic::Status>,
}

async fn stream_once(
    mut client: RuntimeServiceClient<Channel>,
    events: &broadcast::Sender<RuntimeEvent>,
) -> Outcome {
    let started = tokio::time::Instant::now();
    let mut delivered = 0;
    let mut stream = match client.get_container_events(cri::GetEventsRequest {}).await {
        Ok(response) => response.into_inner(),
        Err(status) => {
            return Outcome {
                delivered,
                lasted: started.elapsed(),
                error: Some(status),
            };
        }
    };
    loop {
        match stream.message().await {
            Ok(Some(message)) => {
                delivered += 1;
                match convert::event(&message) {
                    // No receivers is fine: events are hints.
                    Some(event) => drop(events.send(event)),
                    None => tracing::debug!(
                        kind = message.container_event_type,
                        "skipping a CRI container event of unknown type"
                    ),
                }
            }
            Ok(None) => {
                return Outcome {
                    delivered,
                    lasted: started.elapsed(),
                    error: None,
                };
            }
            Err(status) => {
                return Outcome {
                    delivered,
                    lasted: started.elapsed(),
                    error: Some(status),
                };
            }
        }
    }
}
