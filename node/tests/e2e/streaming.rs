//! `kubectl exec`, `attach` and `port-forward` on container pods, as a v1.32 API
//! server drives them: the real kubectl speaking SPDY (`KUBECTL_REMOTE_COMMAND_WEBSOCKETS`
//! and `KUBECTL_PORT_FORWARD_WEBSOCKETS` off) to the testkit API server, which
//! proxies the upgrade to the node with its kubelet client certificate; the node
//! proxies it on to containerd's streaming server, or, for a Wasm pod's exec, serves
//! the SPDY session itself.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use wasmlet_testkit::containerd::{Containerd, images::BUSYBOX_IMAGE};

use crate::cluster::*;
use crate::*;

/// kubectl against the test API server, speaking SPDY as the API server does to
/// kubelets.
fn kubectl(kubeconfig: &std::path::Path) -> Command {
    let mut cmd = Command::new("kubectl");
    cmd.arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--request-timeout=30s")
        .env("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false")
        .env("KUBECTL_PORT_FORWARD_WEBSOCKETS", "false");
    cmd
}

fn run(cmd: &mut Command, stdin: &str) -> (Option<i32>, String, String) {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A busybox pod running `script` (the node API tests' `command_pod`), its container
/// with `stdin` open or not.
fn busybox_pod(name: &str, script: &str, stdin: bool) -> Pod {
    let mut pod =
        crate::node_api::command_pod(name, BUSYBOX_IMAGE, &["sh", "-c", script], "Always");
    pod.spec.as_mut().unwrap().containers[0].stdin = Some(stdin);
    pod
}

fn running(c: &Cluster, name: &str) {
    wait(&format!("{name} to run"), LONG, || {
        c.api.get::<Pod>(Some("default"), name).filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|cs| cs.first())
                .is_some_and(|cs| cs.state.as_ref().is_some_and(|s| s.running.is_some()))
        })
    });
}

/// An HTTP GET of `path` on `port`: the whole answer.
fn http_get(port: u16, path: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: box\r\n\r\n").as_bytes())
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// `kubectl port-forward pod/<pod> :<port>`: the child and its local port; its stdout
/// (a line per connection) is drained so that it never blocks.
/// A `kubectl port-forward` to `port` of `pod`, over SPDY or (`websockets`) with its
/// SPDY tunnelled in a WebSocket, and logging its requests: the child, the local
/// port, and its stderr once it has ended.
fn port_forward(
    kubeconfig: &std::path::Path,
    pod: &str,
    port: u16,
    websockets: bool,
) -> (std::process::Child, u16, std::thread::JoinHandle<String>) {
    let mut cmd = kubectl(kubeconfig);
    if websockets {
        cmd.env("KUBECTL_PORT_FORWARD_WEBSOCKETS", "true");
    }
    let mut forward = cmd
        .args([
            "port-forward",
            "-v=8",
            &format!("pod/{pod}"),
            &format!(":{port}"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    let mut stdout = BufReader::new(forward.stdout.take().unwrap());
    let mut stderr = forward.stderr.take().unwrap();
    let logs = std::thread::spawn(move || {
        let mut log = String::new();
        let _ = stderr.read_to_string(&mut log);
        log
    });
    stdout.read_line(&mut first).unwrap();
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut stdout, &mut std::io::sink());
    });
    // "Forwarding from 127.0.0.1:41234 -> 8080"
    let local: u16 = first
        .split_whitespace()
        .nth(2)
        .and_then(|a| a.rsplit(':').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no local port in {first:?}"));
    (forward, local, logs)
}

/// Ends a port-forward: its stderr.
fn stop(mut forward: std::process::Child, logs: std::thread::JoinHandle<String>) -> String {
    let _ = forward.kill();
    let _ = forward.wait();
    logs.join().unwrap()
}

/// That kubectl's port-forward went the way asked, not by a fallback: its `-v=8` log
/// of the upgrade (client-go's tunneling dialer reports the protocol it negotiated
/// inside the WebSocket).
fn assert_protocol(log: &str, websockets: bool) {
    let tunnelled = log.contains("Sec-Websocket-Protocol: SPDY/3.1+portforward.k8s.io")
        && log.contains("negotiated protocol: portforward.k8s.io");
    let spdy = log.contains("Upgrade: SPDY/3.1") && !log.contains("tunneling_dialer");
    let fell_back = log.to_ascii_lowercase().contains("fallback");
    assert!(
        !fell_back && if websockets { tunnelled } else { spdy },
        "websockets {websockets}, but the log says:\n{log}"
    );
}

/// `n` GETs of `path` at once through `local`: the answers.
fn concurrent_gets(local: u16, path: &str, n: usize) -> Vec<String> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n).map(|_| s.spawn(|| http_get(local, path))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn kubectl_exec_attach_and_port_forward_reach_busybox_and_wasm_pods() {
    let containerd = Containerd::start().expect("containerd starts");
    containerd.import_test_images().expect("test images import");
    let c = cluster();
    let dir = tempfile::tempdir().unwrap();
    let (ca_dir, ca_file) = crate::node_api::client_ca_file(&c);
    let mut opts = node_options(&c, &["ticker", "httpd"]).with_cri(containerd.address());
    crate::node_api::trust_client_ca(&mut opts, &ca_file);
    // Wasm pods in network namespaces of their own: the node's port-forward dials the
    // Wasm httpd inside its pod's namespace.
    opts.cni_conf_dir = Some(containerd.layout().cni_conf_dir());
    let node = start_with(opts);
    let (_tls, kubeconfig) = crate::node_api::kubectl_access(&c, dir.path());
    drop(ca_dir);
    wait("the Node to be Ready", LONG, || {
        c.api.get::<Node>(None, NODE).filter(node_ready)
    });
    // A port of its own per run: the pod may share the node's network.
    let port = 20000 + (std::process::id() % 20000) as u16;
    c.api
        .create(&busybox_pod(
            "box",
            &format!(
                "mkdir -p /www && echo hello-from-httpd > /www/index.html && exec httpd -f -p {port} -h /www"
            ),
            false,
        ))
        .unwrap();
    c.api
        .create(&busybox_pod(
            "reader",
            "while read l; do echo got $l; done",
            true,
        ))
        .unwrap();
    let env = |pairs: &[(&str, &str)]| {
        Some(
            pairs
                .iter()
                .map(|(k, v)| k8s_openapi::api::core::v1::EnvVar {
                    name: (*k).into(),
                    value: Some((*v).into()),
                    ..Default::default()
                })
                .collect(),
        )
    };
    let mut wasm = api_pod("wasm", "ticker");
    wasm.spec.as_mut().unwrap().containers[0].env = env(&[("CHECK_EXIT", "3"), ("CAT_EXIT", "6")]);
    c.api.create(&wasm).unwrap();
    // A Wasm container that reads its stdin, kept open for attach until the first
    // client closes its own (stdinOnce).
    let mut cat = api_pod("wasm-cat", "ticker");
    let main = &mut cat.spec.as_mut().unwrap().containers[0];
    main.args = Some(vec!["cat".into()]);
    main.stdin = Some(true);
    main.stdin_once = Some(true);
    main.env = env(&[("CAT_EXIT", "0")]);
    c.api.create(&cat).unwrap();
    let web_port = port + 1000;
    let mut web = api_pod("wasm-httpd", "httpd");
    web.spec.as_mut().unwrap().containers[0].env = Some(vec![k8s_openapi::api::core::v1::EnvVar {
        name: "PORT".into(),
        value: Some(web_port.to_string()),
        ..Default::default()
    }]);
    c.api.create(&web).unwrap();
    running(&c, "box");
    running(&c, "reader");
    running(&c, "wasm");
    running(&c, "wasm-httpd");
    running(&c, "wasm-cat");

    // exec: stdout, stderr and the exit code, each where kubectl puts it.
    let (code, out, err) = run(
        kubectl(&kubeconfig).args([
            "exec",
            "box",
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2; exit 7",
        ]),
        "",
    );
    assert_eq!(
        code,
        Some(7),
        "stdout {out:?} stderr {err:?}\n{}",
        node.log()
    );
    assert_eq!(out, "out\n");
    assert!(err.starts_with("err\n"), "{err:?}");

    // exec -i: stdin piped in and closed.
    let (code, out, err) = run(
        kubectl(&kubeconfig).args(["exec", "-i", "box", "--", "sh", "-c", "cat; echo done"]),
        "piped\nlines\n",
    );
    assert_eq!(
        (code, out.as_str()),
        (Some(0), "piped\nlines\ndone\n"),
        "{err}"
    );

    // exec -t in a terminal (script's pseudo-terminal, sized 30x100): the
    // container's TTY takes kubectl's size through the resize stream.
    // The first resize may land after the command started: it polls for its size.
    let inner = format!(
        "stty rows 30 cols 100; kubectl --kubeconfig {} exec -ti box -- sh -c '{}'",
        kubeconfig.display(),
        "for i in $(seq 100); do s=$(stty size 2>/dev/null); [ -n \"$s\" ] && break; sleep 0.1; done; echo size $s"
    );
    let out = Command::new("script")
        .args(["-qec", &inner, "/dev/null"])
        .env("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false")
        .stdin(Stdio::null())
        .output()
        .expect("script runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("30 100"),
        "{text:?} {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A command the container does not have: kubectl fails and says so.
    let (code, _, err) = run(
        kubectl(&kubeconfig).args(["exec", "box", "--", "no-such-cmd"]),
        "",
    );
    assert_ne!(code, Some(0));
    assert!(err.contains("no-such-cmd"), "{err}");

    // attach: the running container's stdin and stdout.
    let mut attach = kubectl(&kubeconfig)
        .args(["attach", "-i", "reader"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = attach.stdin.take().unwrap();
    let mut lines = BufReader::new(attach.stdout.take().unwrap());
    stdin.write_all(b"hello\n").unwrap();
    let mut line = String::new();
    lines.read_line(&mut line).unwrap();
    assert_eq!(line, "got hello\n");
    let _ = attach.kill();
    let _ = attach.wait();

    // port-forward: a local port to the pod's httpd, 20 connections at once, over
    // SPDY as a v1.32 API server speaks to kubelets, and with the SPDY tunnelled in a
    // WebSocket as kubectl sends it (relayed by the test API server unchanged, as a
    // direct client would reach the node).
    // The busybox httpd is reached through containerd's streaming server, the Wasm
    // httpd is relayed by the node itself, from inside the pod's network namespace.
    let targets = [
        ("box", port, "/", "HTTP/1.1 200 OK", "hello-from-httpd\n"),
        (
            "wasm-httpd",
            web_port,
            "/healthz",
            "HTTP/1.1 200",
            "\r\n\r\nok\n",
        ),
    ];
    for websockets in [false, true] {
        let how = if websockets {
            "SPDY in a WebSocket"
        } else {
            "SPDY"
        };
        for (pod, to, path, head, tail) in targets {
            let (forward, local, logs) = port_forward(&kubeconfig, pod, to, websockets);
            let answers = concurrent_gets(local, path, 20);
            let log = stop(forward, logs);
            for a in &answers {
                assert!(a.starts_with(head) && a.ends_with(tail), "{pod}: {a:?}");
            }
            assert_protocol(&log, websockets);
            eprintln!(
                "port-forward ({pod}, {how}): 20 of 20 GETs through 127.0.0.1:{local} answered"
            );
        }
    }

    // A port nothing listens on: that connection ends, kubectl says why.
    let (forward, local, logs) = port_forward(&kubeconfig, "wasm-httpd", web_port + 1, false);
    let answer = std::panic::catch_unwind(|| http_get(local, "/")).unwrap_or_default();
    assert!(answer.is_empty(), "{answer}");
    let err = stop(forward, logs);
    assert!(err.contains("error forwarding port"), "{err}");

    // exec in a Wasm pod, served by the node over SPDY: a new instance of the
    // container's program with the command as argv, its output and exit code.
    let (code, out, err) = run(
        kubectl(&kubeconfig).args(["exec", "wasm", "--", "ticker", "check"]),
        "",
    );
    assert_eq!(
        (code, out.as_str()),
        (Some(3), "ok\n"),
        "{err}\n{}",
        node.log()
    );
    let (code, out, err) = run(
        kubectl(&kubeconfig).args(["exec", "wasm", "-c", "main", "--", "ticker", "check"]),
        "",
    );
    assert_eq!((code, out.as_str()), (Some(3), "ok\n"), "{err}");
    // exec -i: stdin piped to the instance and closed, its output and exit code.
    let (code, out, err) = run(
        kubectl(&kubeconfig).args(["exec", "-i", "wasm", "--", "ticker", "cat"]),
        "a\nb\n",
    );
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (
            Some(6),
            "got: a\ngot: b\neof\n",
            "err: a\nerr: b\ncommand terminated with exit code 6\n"
        ),
    );
    // A command the image does not hold: a clear error at once.
    let (code, _, err) = run(
        kubectl(&kubeconfig).args(["exec", "wasm", "--", "sh", "-c", "true"]),
        "",
    );
    assert_ne!(code, Some(0));
    assert!(
        err.contains("\"sh\" is not a program its image holds"),
        "{err}"
    );
    // attach to a Wasm container reading stdin: what it answers comes back; closing
    // stdin (stdinOnce) ends its input, so it says eof and exits, and attach ends.
    let (code, out, err) = run(
        kubectl(&kubeconfig).args(["attach", "-i", "wasm-cat", "-c", "main"]),
        "hello\n",
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("got: hello\n") && out.ends_with("eof\n"),
        "{out:?} {err}"
    );

    // A client that vanishes mid-exec releases what the node held for it.
    let node_fds = || wasmlet_testkit::node::open_fds(node.pid());
    let settled = || {
        wait("the node's descriptors to settle", LONG, || {
            let before = node_fds();
            std::thread::sleep(Duration::from_millis(300)); // a settle window inside a deadline
            (node_fds() == before).then_some(before)
        })
    };
    let before = settled();
    let mut hung = kubectl(&kubeconfig)
        .args(["exec", "-i", "wasm", "--", "ticker", "hang"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait("the exec's connection to the node", LONG, || {
        (node_fds() > before).then_some(())
    });
    hung.kill().unwrap();
    let _ = hung.wait();
    wait("the node to release the exec", LONG, || {
        (node_fds() <= before).then_some(())
    });

    // On the node itself: refused before any upgrade, and the kubelet's answers to
    // what cannot be streamed.
    use wasmlet_testkit::node::NodeApiAuth;
    c.api.add_token("viewer-token", "viewer", &["viewers"]);
    c.api
        .set_access_policy(|r| (r.spec.user.as_deref() != Some("viewer"), String::new()));
    let get = |path: &str, token: &str| node.api_get(path, NodeApiAuth::Token(token)).unwrap();
    let (code, body) = get(
        "/exec/default/box/main?command=true&output=1",
        "viewer-token",
    );
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("subresource(s)=[proxy]"), "{body}");
    for (path, want_code, want_body) in [
        (
            "/exec/default/box/main?command=true&output=1",
            500,
            "Upgrade request required",
        ),
        (
            "/exec/default/box/main?command=true",
            400,
            "you must specify at least 1 of stdin, stdout, stderr",
        ),
        (
            "/exec/default/box/nope?command=true&output=1",
            500,
            "container not found (\"nope\")",
        ),
        (
            "/exec/default/ghost/main?output=1",
            404,
            "pod does not exist",
        ),
        (
            "/attach/default/box/nope?output=1",
            500,
            "container not found (\"nope\")",
        ),
        ("/portForward/default/ghost", 404, "pod does not exist"),
        ("/portForward/default/box", 500, "Upgrade request required"),
        (
            "/portForward/default/box?port=http",
            500,
            "Upgrade request required",
        ),
    ] {
        let (code, body) = get(path, "admin-token");
        assert_eq!((code, body.trim()), (want_code, want_body), "{path}");
    }

    // The uid-qualified forms: the pod's uid, or 404.
    let uid = c
        .api
        .get::<Pod>(Some("default"), "box")
        .and_then(|p| p.metadata.uid)
        .unwrap();
    let (code, body) = get(
        &format!("/exec/default/box/{uid}/main?output=1"),
        "admin-token",
    );
    assert_eq!((code, body.trim()), (500, "Upgrade request required"));
    let (code, body) = get("/exec/default/box/not-its-uid/main?output=1", "admin-token");
    assert_eq!((code, body.trim()), (404, "pod not found"));
    let (code, _) = get(&format!("/portForward/default/box/{uid}"), "admin-token");
    assert_eq!(code, 500);

    // /run: the command to its end, its output answered; a non-zero exit a 500.
    let post = |path: &str| {
        node.api_post(path, NodeApiAuth::Token("admin-token"))
            .unwrap()
    };
    assert_eq!(
        post("/run/default/box/main?cmd=echo%20run%20out"),
        (200, "run out\n".into())
    );
    let (code, body) = post("/run/default/box/main?cmd=false");
    assert_eq!(code, 500, "{body}");
    assert!(body.contains("exited with 1"), "{body}");
    let (code, body) = post("/run/default/wasm/main?cmd=ticker%20check");
    assert_eq!(code, 500, "{body}");
    assert!(body.contains("exited with 3"), "{body}");
    assert_eq!(get("/run/default/box/main?cmd=true", "admin-token").0, 405);

    base64_websocket(&node, "admin-token");
    websocket_clients(&kubeconfig, web_port, port);
}

/// exec on a Wasm pod over `v4.base64.channel.k8s.io`, straight to the node: text
/// messages, the channel as a digit, the bytes in base64 — stdin in, output out, the
/// exit code in the Status on channel 3.
fn base64_websocket(node: &wasmlet_testkit::node::TestNode, token: &str) {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD as B64;
    use tokio_tungstenite::tungstenite::{self, Message, client::IntoClientRequest as _};
    let open = |query: &str| {
        let url = format!(
            "wss://127.0.0.1:{}/exec/default/wasm/main?{query}",
            node.api_port
        );
        let mut req = url.into_client_request().unwrap();
        let h = req.headers_mut();
        h.insert(
            "sec-websocket-protocol",
            "v4.base64.channel.k8s.io".parse().unwrap(),
        );
        h.insert("authorization", format!("Bearer {token}").parse().unwrap());
        let (ws, response) = tungstenite::client(req, node.api_connect().unwrap())
            .unwrap_or_else(|e| panic!("base64 exec {query}: {e}"));
        assert_eq!(
            response.headers()["sec-websocket-protocol"],
            "v4.base64.channel.k8s.io"
        );
        ws
    };
    // Reads text messages until one on `channel` holds `want`: what came on each.
    let read_until = |ws: &mut tungstenite::WebSocket<_>, channel: char, want: &str| {
        let mut seen = std::collections::BTreeMap::<char, String>::new();
        loop {
            let m = ws.read().unwrap_or_else(|e| panic!("{e}; so far {seen:?}"));
            let Message::Text(t) = m else { continue };
            let (c, data) = t.split_at(1);
            let bytes = B64.decode(data).unwrap_or_else(|e| panic!("{t:?}: {e}"));
            let got = seen.entry(c.chars().next().unwrap()).or_default();
            got.push_str(&String::from_utf8_lossy(&bytes));
            if c.starts_with(channel) && got.contains(want) {
                return seen;
            }
        }
    };

    let mut ws = open("command=ticker&command=check&output=1&error=1");
    let seen = read_until(&mut ws, '3', "\"reason\":\"ExitCode\"");
    assert_eq!(seen.get(&'1').map(String::as_str), Some("ok\n"), "{seen:?}");
    assert!(seen[&'3'].contains("\"message\":\"3\""), "{seen:?}");
    eprintln!("base64 websocket: exec in wasm gave {seen:?}");

    let mut ws = open("command=ticker&command=cat&input=1&output=1&error=1");
    ws.send(Message::text(format!("0{}", B64.encode("a\n"))))
        .unwrap();
    read_until(&mut ws, '1', "got: a\n");
    ws.close(None).unwrap();
}

/// kube-rs over WebSocket (as direct clients and newer API servers speak): exec and
/// port-forward on both kinds of pod.
fn websocket_clients(kubeconfig: &std::path::Path, wasm_port: u16, box_port: u16) {
    use kube::api::{Api, AttachParams};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let step = |what: &str| eprintln!("websocket: {what}");
    let within = Duration::from_secs(20);
    rt.block_on(async {
        let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap();
        let client = kube::Client::try_from(config).unwrap();
        let pods: Api<Pod> = Api::namespaced(client, "default");

        // exec: stdout, stderr and the Status with the exit code, for each kind.
        for (pod, command, want_out, want_code) in [
            (
                "box",
                vec!["sh", "-c", "echo out; echo err >&2; exit 7"],
                "out\n",
                "7",
            ),
            ("wasm", vec!["ticker", "check"], "ok\n", "3"),
        ] {
            step(&format!("exec in {pod}"));
            let ap = AttachParams::default().stderr(true);
            let mut p = tokio::time::timeout(within, pods.exec(pod, command, &ap))
                .await
                .unwrap_or_else(|_| panic!("exec in {pod}: no answer"))
                .unwrap_or_else(|e| panic!("exec in {pod}: {e}"));
            let mut stdout = p.stdout().unwrap();
            let mut stderr = p.stderr().unwrap();
            let status = p.take_status().unwrap();
            let (mut out, mut err) = (String::new(), String::new());
            let (a, b) = tokio::time::timeout(within, async {
                tokio::join!(
                    stdout.read_to_string(&mut out),
                    stderr.read_to_string(&mut err)
                )
            })
            .await
            .unwrap_or_else(|_| panic!("exec in {pod}: the output did not end"));
            a.unwrap();
            b.unwrap();
            step(&format!("exec in {pod}: output read"));
            let status = tokio::time::timeout(within, status)
                .await
                .unwrap_or_else(|_| panic!("exec in {pod}: no status"))
                .expect("a status");
            assert_eq!(out, want_out, "{pod}");
            if pod == "box" {
                assert_eq!(err, "err\n");
            }
            assert_eq!(
                status.status.as_deref(),
                Some("Failure"),
                "{pod}: {status:?}"
            );
            assert_eq!(status.reason.as_deref(), Some("NonZeroExitCode"));
            let cause = &status.details.unwrap().causes.unwrap()[0];
            assert_eq!(cause.message.as_deref(), Some(want_code), "{pod}");
            let _ = tokio::time::timeout(within, p.join()).await;
        }

        // exec with stdin on a Wasm pod: written, half-closed (v5), answered live.
        step("exec -i in wasm");
        let ap = AttachParams::default().stdin(true).stderr(false);
        let mut p = tokio::time::timeout(within, pods.exec("wasm", vec!["ticker", "cat"], &ap))
            .await
            .expect("exec -i in wasm: an answer")
            .expect("exec -i in wasm");
        let mut stdin = p.stdin().unwrap();
        let mut stdout = p.stdout().unwrap();
        let status = p.take_status().unwrap();
        stdin.write_all(b"x\n").await.unwrap();
        let mut first = [0u8; 7];
        tokio::time::timeout(within, stdout.read_exact(&mut first))
            .await
            .expect("exec -i in wasm: an answer before stdin closes")
            .unwrap();
        assert_eq!(&first, b"got: x\n");
        // kube-rs's stdin is a simplex pipe: its end is a shutdown, not a drop.
        stdin.shutdown().await.unwrap();
        let mut rest = String::new();
        tokio::time::timeout(within, stdout.read_to_string(&mut rest))
            .await
            .expect("exec -i in wasm: the output ends")
            .unwrap();
        assert_eq!(rest, "eof\n");
        let status = tokio::time::timeout(within, status).await.unwrap().unwrap();
        let cause = &status.details.unwrap().causes.unwrap()[0];
        assert_eq!(cause.message.as_deref(), Some("6"));
        let _ = tokio::time::timeout(within, p.join()).await;

        // port-forward: a GET through the forwarded stream, for each kind.
        for (pod, port, path, want) in [
            ("box", box_port, "/", "hello-from-httpd\n"),
            ("wasm-httpd", wasm_port, "/healthz", "ok\n"),
        ] {
            step(&format!("port-forward to {pod}"));
            let mut pf = tokio::time::timeout(within, pods.portforward(pod, &[port]))
                .await
                .unwrap_or_else(|_| panic!("port-forward to {pod}: no answer"))
                .unwrap_or_else(|e| panic!("port-forward to {pod}: {e}"));
            let mut stream = pf.take_stream(port).unwrap();
            stream
                .write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let mut answer = String::new();
            tokio::time::timeout(within, stream.read_to_string(&mut answer))
                .await
                .unwrap_or_else(|_| panic!("port-forward to {pod}: {answer:?} did not end"))
                .unwrap();
            assert!(answer.starts_with("HTTP/1.1 200"), "{pod}: {answer:?}");
            assert!(answer.ends_with(want), "{pod}: {answer:?}");
            drop(stream);
            let _ = tokio::time::timeout(within, pf.join()).await;
        }
    });
}
