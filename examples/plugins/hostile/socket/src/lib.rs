//! `hostile-socket`: a probe that opens a TCP connection of its own to
//! `<ip>:<port>` (settings; `ip` defaults to `127.0.0.1`, `port` to `80`) through
//! `wasi:sockets`, going around `pod-network`. Without a network grant the plugin
//! host must refuse: the probe then reports `Failure("denied: <error>")`.
//! `Success` means it connected.
//!
//! It first tries `std::net`, which on `wasm32-wasip1` cannot open sockets at all,
//! and then WASI 0.2's sockets, the real way out.

use std::net::Ipv4Addr;

use wasi::sockets::network::{ErrorCode, IpAddressFamily, IpSocketAddress, Ipv4SocketAddress};
use wasmlet_plugin_sdk::probe::{Probe, ProbeRequest, ProbeResult};

struct OpenSocket;

impl Probe for OpenSocket {
    fn check(request: ProbeRequest) -> ProbeResult {
        let settings = request.settings();
        let ip: Ipv4Addr = match settings.parse_or("ip", Ipv4Addr::LOCALHOST) {
            Ok(ip) => ip,
            Err(e) => return ProbeResult::failure(e),
        };
        let port: u16 = match settings.parse_or("port", 80) {
            Ok(port) => port,
            Err(e) => return ProbeResult::failure(e),
        };
        if std::net::TcpStream::connect((ip, port)).is_ok() {
            return ProbeResult::Success;
        }
        match connect(ip, port) {
            Ok(()) => ProbeResult::Success,
            Err(e) => ProbeResult::failure(format!("denied: connecting to {ip}:{port}: {e}")),
        }
    }
}

/// Connects with `wasi:sockets/tcp` and drops the connection.
fn connect(ip: Ipv4Addr, port: u16) -> Result<(), ErrorCode> {
    let network = wasi::sockets::instance_network::instance_network();
    let socket = wasi::sockets::tcp_create_socket::create_tcp_socket(IpAddressFamily::Ipv4)?;
    let [a, b, c, d] = ip.octets();
    let address = IpSocketAddress::Ipv4(Ipv4SocketAddress {
        port,
        address: (a, b, c, d),
    });
    socket.start_connect(&network, address)?;
    loop {
        match socket.finish_connect() {
            Err(ErrorCode::WouldBlock) => socket.subscribe().block(),
            Err(e) => return Err(e),
            Ok((_input, _output)) => return Ok(()),
        }
    }
}

wasmlet_plugin_sdk::export_probe!(OpenSocket);
