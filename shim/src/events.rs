//! Task events to containerd (`containerd.services.events.ttrpc.v1.Events/Forward`
//! on `$TTRPC_ADDRESS`), in order. An event that cannot be sent (containerd is
//! restarting) is retried until containerd is back, for up to [`GIVE_UP_AFTER`]: a
//! restarted containerd still learns how its tasks ended.

use std::time::Duration;

use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::protobuf::well_known_types::timestamp::Timestamp;
use containerd_shim_protos::protobuf::{MessageDyn, MessageField};
use containerd_shim_protos::shim::event::Envelope;
use containerd_shim_protos::shim::events::ForwardRequest;
use containerd_shim_protos::shim_async::{Client, EventsClient};
use tokio::sync::mpsc;

/// How long one event is retried while containerd does not answer.
pub const GIVE_UP_AFTER: Duration = Duration::from_secs(120);
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone)]
pub struct Publisher {
    tx: mpsc::UnboundedSender<(&'static str, Any)>,
}

impl Publisher {
    /// Starts the sender for containerd at `address` (its ttrpc socket); without one,
    /// events are dropped (logged at debug).
    pub fn start(address: Option<String>, namespace: String) -> Publisher {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(send_all(address, namespace, rx));
        Publisher { tx }
    }

    pub fn publish(&self, topic: &'static str, event: &dyn MessageDyn) {
        let any = Any {
            // containerd's typeurl resolves messages by their full name.
            type_url: event.descriptor_dyn().full_name().to_owned(),
            value: event.write_to_bytes_dyn().expect("events encode"),
            ..Default::default()
        };
        tracing::debug!(topic, event = %any.type_url, "publishing");
        let _ = self.tx.send((topic, any));
    }
}

async fn send_all(
    address: Option<String>,
    namespace: String,
    mut rx: mpsc::UnboundedReceiver<(&'static str, Any)>,
) {
    let Some(address) = address else {
        while let Some((topic, _)) = rx.recv().await {
            tracing::debug!(topic, "no TTRPC_ADDRESS: event dropped");
        }
        return;
    };
    let address = if address.contains("://") {
        address
    } else {
        format!("unix://{address}")
    };
    let mut client: Option<EventsClient> = None;
    while let Some((topic, event)) = rx.recv().await {
        let mut request = ForwardRequest::new();
        request.envelope = MessageField::some(Envelope {
            timestamp: MessageField::some(timestamp(jiff::Timestamp::now())),
            namespace: namespace.clone(),
            topic: topic.to_owned(),
            event: MessageField::some(event),
            ..Default::default()
        });
        let deadline = tokio::time::Instant::now() + GIVE_UP_AFTER;
        let mut backoff = Duration::from_millis(50);
        loop {
            let result = match &client {
                Some(c) => c.forward(context(&namespace), &request).await.map(drop),
                None => match Client::connect(&address).await {
                    Ok(c) => {
                        client = Some(EventsClient::new(c));
                        continue;
                    }
                    Err(e) => Err(e),
                },
            };
            match result {
                Ok(()) => break,
                Err(e) if tokio::time::Instant::now() < deadline => {
                    tracing::debug!(topic, "containerd did not take the event ({e}); retrying");
                    client = None;
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
                Err(e) => {
                    tracing::warn!(topic, "event dropped after {GIVE_UP_AFTER:?}: {e}");
                    client = None;
                    break;
                }
            }
        }
    }
}

/// A protobuf timestamp.
pub fn timestamp(t: jiff::Timestamp) -> Timestamp {
    let mut ts = Timestamp::new();
    ts.seconds = t.as_second();
    ts.nanos = t.subsec_nanosecond();
    ts
}

fn context(namespace: &str) -> ttrpc::context::Context {
    let mut ctx = ttrpc::context::with_duration(CALL_TIMEOUT);
    ctx.add("containerd-namespace-ttrpc".into(), namespace.into());
    ctx
}
