//! The `Registration` service on `kubelet.sock`: a device plugin says which resource
//! it serves and on which socket (in the same directory); the node validates it,
//! connects, and follows its `ListAndWatch` stream until it ends.

use std::sync::Arc;

use tokio::net::UnixListener;
use tonic::{Request, Response, Status};
use wasmlet_proto::deviceplugin::v1beta1 as api;
use wasmlet_proto::deviceplugin::v1beta1::registration_server::{Registration, RegistrationServer};

use super::endpoint::GrpcEndpoint;
use super::{DeviceManager, KUBELET_SOCKET, devices_from_plugin, valid_resource_name};

/// The device plugin API versions the node speaks.
pub const SUPPORTED_VERSIONS: [&str; 1] = ["v1beta1"];

struct Service {
    manager: DeviceManager,
}

#[tonic::async_trait]
impl Registration for Service {
    async fn register(
        &self,
        request: Request<api::RegisterRequest>,
    ) -> Result<Response<api::Empty>, Status> {
        let r = request.into_inner();
        tracing::info!(resource = %r.resource_name, endpoint = %r.endpoint, version = %r.version, "device plugin registers");
        if !SUPPORTED_VERSIONS.contains(&r.version.as_str()) {
            let message = format!(
                "requested API version {:?} is not supported by kubelet. Supported versions are {:?}",
                r.version, SUPPORTED_VERSIONS
            );
            tracing::warn!(resource = %r.resource_name, "{message}");
            return Err(Status::invalid_argument(message));
        }
        if !valid_resource_name(&r.resource_name) {
            let message = format!("the ResourceName {:?} is invalid", r.resource_name);
            tracing::warn!("{message}");
            return Err(Status::invalid_argument(message));
        }
        // The endpoint is a file name in the device plugin directory.
        let name = std::path::Path::new(&r.endpoint);
        if r.endpoint.is_empty()
            || name.components().count() != 1
            || r.endpoint == KUBELET_SOCKET
            || r.endpoint == super::CHECKPOINT_FILE
        {
            let message = format!(
                "the endpoint {:?} is not a socket name in {}",
                r.endpoint,
                self.manager.dir().display()
            );
            return Err(Status::invalid_argument(message));
        }
        let socket = self.manager.dir().join(&r.endpoint);
        let options = r.options.unwrap_or_default();
        // As the kubelet: registration answers at once; the connection and the
        // stream run on their own.
        tokio::spawn(run_endpoint(
            self.manager.clone(),
            r.resource_name,
            GrpcEndpoint::new(socket, options),
        ));
        Ok(Response::new(api::Empty {}))
    }
}

/// Follows one plugin's `ListAndWatch` until it ends (or the node stops), then marks
/// its devices unhealthy.
async fn run_endpoint(manager: DeviceManager, resource: String, endpoint: GrpcEndpoint) {
    let mut client = endpoint.client.clone();
    let socket = endpoint.socket.clone();
    // A plugin that cannot be reached does not replace one that works: the resource
    // is taken over only once the new plugin's stream is open.
    let opened = client.list_and_watch(api::Empty {}).await;
    let response = match opened {
        Ok(response) => response,
        Err(s) => {
            tracing::warn!(resource, socket = %socket.display(), "device plugin registered but cannot be reached; its registration is ignored: ListAndWatch: {}: {}", s.code(), s.message());
            return;
        }
    };
    let generation = manager.connect(&resource, Arc::new(endpoint));
    let cancel = manager.cancel_token();
    let mut stream = response.into_inner();
    let why = loop {
        let next = tokio::select! {
            () = cancel.cancelled() => return,
            next = stream.message() => next,
        };
        match next {
            Ok(Some(answer)) => {
                manager.update_devices(&resource, generation, devices_from_plugin(answer.devices));
            }
            Ok(None) => break "the ListAndWatch stream ended".to_owned(),
            Err(s) => break format!("ListAndWatch: {}: {}", s.code(), s.message()),
        }
    };
    manager.disconnected(&resource, generation, &why);
}

/// Serves `Registration` on `<dir>/kubelet.sock` until the node stops. A stale
/// socket of an earlier run is replaced: plugins watching it take the new one as the
/// signal to register again.
pub async fn serve(manager: DeviceManager) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let path = manager.socket_path();
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => anyhow::bail!("removing the stale {}: {e}", path.display()),
    }
    let listener = UnixListener::bind(&path).map_err(|e| {
        anyhow::anyhow!(
            "binding the device plugin registration socket {}: {e}",
            path.display()
        )
    })?;
    let cancel = manager.cancel_token();
    let incoming = futures::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| stream);
        Some((accepted, listener))
    });
    tracing::info!(socket = %path.display(), "device plugin registration is served");
    let service = RegistrationServer::new(Service { manager });
    Ok(tokio::spawn(async move {
        let result = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(incoming, cancel.cancelled_owned())
            .await;
        if let Err(e) = result {
            tracing::error!("device plugin registration server: {e}");
        }
        let _ = std::fs::remove_file(&path);
    }))
}

/// Device plugins that register through the plugin watcher (`plugins_registry`,
/// type `DevicePlugin`): the plugin's name is its resource, its socket serves
/// `DevicePlugin`, and its options come from `GetDevicePluginOptions`.
pub struct WatcherHandler(pub DeviceManager);

#[async_trait::async_trait]
impl crate::pluginwatcher::PluginHandler for WatcherHandler {
    fn validate(
        &self,
        name: &str,
        _endpoint: &std::path::Path,
        versions: &[String],
    ) -> Result<(), String> {
        if !versions
            .iter()
            .any(|v| SUPPORTED_VERSIONS.contains(&v.as_str()))
        {
            return Err(format!(
                "none of the plugin's versions {versions:?} is supported by kubelet. Supported versions are {SUPPORTED_VERSIONS:?}"
            ));
        }
        if !valid_resource_name(name) {
            return Err(format!("the ResourceName {name:?} is invalid"));
        }
        Ok(())
    }

    async fn register(
        &self,
        name: &str,
        endpoint: &std::path::Path,
        _versions: &[String],
    ) -> Result<(), String> {
        let mut plugin =
            GrpcEndpoint::new(endpoint.to_owned(), api::DevicePluginOptions::default());
        let mut request = Request::new(api::Empty {});
        request.set_timeout(super::endpoint::CALL_TIMEOUT);
        plugin.options = plugin
            .client
            .clone()
            .get_device_plugin_options(request)
            .await
            .map_err(|s| format!("GetDevicePluginOptions: {}: {}", s.code(), s.message()))?
            .into_inner();
        tokio::spawn(run_endpoint(self.0.clone(), name.to_owned(), plugin));
        Ok(())
    }

    fn deregister(&self, name: &str, endpoint: &std::path::Path) {
        self.0.deregister(name, endpoint);
    }
}
