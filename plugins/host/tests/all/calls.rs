//! Calls under their limits: each bad plugin ends in a clear error and the host,
//! and another plugin, keep working.

use std::time::{Duration, Instant};

use wasmlet_plugin_host::types::{Decision, NodeState, Pair, ProbeRequest, ProbeResult};
use wasmlet_plugin_host::{BackoffPolicy, CallError, HostOptions, PluginConfig, PluginHost, World};

use crate::{candidates, components, config, good_still_works, host, load_good, pod};

#[tokio::test]
async fn a_ranking_is_checked_and_completed() {
    let (host, _) = host();
    load_good(&host).await;
    good_still_works(&host).await;
    host.load_bytes(config("empty", World::Eviction), components::ranking(&[]))
        .await
        .unwrap();
    // Left out: all of them, in the built-in order.
    assert_eq!(
        host.try_rank("empty", "memory.available", &candidates())
            .await
            .unwrap(),
        [1, 2, 0]
    );
}

/// Calls of `name` that ran on an instance made ahead of them.
fn prepared_calls(host: &PluginHost, name: &str) -> u64 {
    host.plugins()
        .into_iter()
        .find(|p| p.name == name)
        .unwrap()
        .metrics
        .prepared_calls
}

#[tokio::test]
async fn every_call_runs_on_an_instance_of_its_own_even_one_made_ahead_of_it() {
    let (host, _) = host();
    host.load_bytes(config("count", World::Eviction), components::counting())
        .await
        .unwrap();
    // The instance made after each call is ready in a moment: keep calling until
    // three calls found theirs made, every call seeing a fresh instance.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut calls = 0;
    while prepared_calls(&host, "count") < 3 {
        assert!(
            Instant::now() < deadline,
            "{calls} calls, none found an instance made ahead"
        );
        let order = host
            .try_rank("count", "memory.available", &candidates())
            .await
            .unwrap();
        assert_eq!(
            order[0], 0,
            "call {calls} ran on a used instance: {order:?}"
        );
        calls += 1;
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn without_warm_instances_every_call_instantiates_its_own() {
    let host = PluginHost::new(HostOptions {
        max_instances: 8,
        max_memory_bytes: 64 << 20,
        warm_instances: false,
        ..HostOptions::default()
    })
    .unwrap();
    host.load_bytes(config("count", World::Eviction), components::counting())
        .await
        .unwrap();
    for _ in 0..5 {
        let order = host
            .try_rank("count", "memory.available", &candidates())
            .await
            .unwrap();
        assert_eq!(order[0], 0);
    }
    assert_eq!(prepared_calls(&host, "count"), 0);
}

#[tokio::test]
async fn an_index_out_of_range_is_an_invalid_result_and_falls_back() {
    let (host, _) = host();
    host.load_bytes(config("bad", World::Eviction), components::ranking(&[7]))
        .await
        .unwrap();
    let err = host
        .try_rank("bad", "memory.available", &candidates())
        .await
        .unwrap_err();
    assert!(matches!(err, CallError::InvalidResult(_)), "{err}");
    assert!(err.to_string().contains("index 7 is out of range"), "{err}");
    assert_eq!(
        host.rank("bad", "memory.available", &candidates()).await,
        [1, 2, 0]
    );
}

#[tokio::test]
async fn a_trap_is_a_trap_error() {
    let (host, _) = host();
    load_good(&host).await;
    host.load_bytes(
        config("trap", World::Eviction),
        components::trapping("eviction-plugin"),
    )
    .await
    .unwrap();
    let err = host
        .try_rank("trap", "memory.available", &candidates())
        .await
        .unwrap_err();
    assert!(matches!(err, CallError::Trap(_)), "{err}");
    assert!(err.to_string().contains("unreachable"), "{err}");
    good_still_works(&host).await;
}

#[tokio::test]
async fn an_infinite_loop_times_out_at_the_deadline() {
    let (host, _) = host();
    load_good(&host).await;
    let mut c = config("loop", World::Eviction);
    c.limits.timeout_millis = 200;
    host.load_bytes(c, components::looping()).await.unwrap();
    let started = Instant::now();
    let err = host
        .try_rank("loop", "memory.available", &candidates())
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert_eq!(err, CallError::Timeout(Duration::from_millis(200)));
    assert!(
        // It ends at its deadline, not when the plugin would (the bound is loose: the
        // exact error above is the check; CI machines are busy).
        took >= Duration::from_millis(200) && took < Duration::from_secs(5),
        "{took:?}"
    );
    good_still_works(&host).await;
}

#[test]
fn a_looping_plugin_does_not_hold_the_runtime() {
    // One worker thread: the loop must yield for the other task to run.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (host, _) = host();
        let mut c = config("loop", World::Eviction);
        c.limits.timeout_millis = 4_000;
        host.load_bytes(c, components::looping()).await.unwrap();
        let call = tokio::spawn({
            let host = host.clone();
            async move { host.try_rank("loop", "memory.available", &[]).await }
        });
        // Well before the plugin's 4 s deadline, which is when a runtime the plugin
        // held would run the timer.
        let ticked = tokio::time::timeout(
            Duration::from_millis(2_000),
            tokio::time::sleep(Duration::from_millis(50)),
        )
        .await;
        assert!(
            ticked.is_ok(),
            "the timer did not fire while the plugin ran"
        );
        assert!(matches!(call.await.unwrap(), Err(CallError::Timeout(_))));
    });
}

#[tokio::test]
async fn a_memory_bomb_is_out_of_memory() {
    let (host, _) = host();
    load_good(&host).await;
    host.load_bytes(config("bomb", World::Eviction), components::memory_bomb())
        .await
        .unwrap();
    let err = host
        .try_rank("bomb", "memory.available", &candidates())
        .await
        .unwrap_err();
    assert_eq!(err, CallError::OutOfMemory { cap: 16 << 20 });
    good_still_works(&host).await;
}

#[tokio::test]
async fn a_huge_result_is_invalid() {
    let (host, _) = host();
    load_good(&host).await;
    host.load_bytes(
        config("huge", World::Eviction),
        components::huge_ranking(300_000),
    )
    .await
    .unwrap();
    let err = host
        .try_rank("huge", "memory.available", &candidates())
        .await
        .unwrap_err();
    assert!(matches!(err, CallError::InvalidResult(_)), "{err}");
    assert!(err.to_string().contains("more than 1048576"), "{err}");
    good_still_works(&host).await;
}

#[tokio::test]
async fn admission_gets_its_settings_and_logs_are_bounded() {
    let (host, _) = host();
    let mut c = config("deny", World::Admission);
    c.settings
        .insert("missing label team".into(), "MissingLabel".into());
    // 300 log lines: the host keeps 100 and the call still succeeds.
    host.load_bytes(c, components::denying(300)).await.unwrap();
    let d = host.admit("deny", pod("p", 0), node_state()).await;
    let Decision::Deny(denial) = d else {
        panic!("{d:?}")
    };
    assert_eq!(denial.reason, "MissingLabel");
    assert_eq!(denial.message, "missing label team");
}

fn node_state() -> NodeState {
    NodeState {
        node_name: "n1".into(),
        allocatable: vec![],
        requested: vec![],
        pod_count: 0,
        labels: vec![Pair {
            key: "zone".into(),
            value: "a".into(),
        }],
    }
}

fn probe_request(container: &str, port: u16, pod_ips: &[&str], timeout_ms: u32) -> ProbeRequest {
    ProbeRequest {
        pod: pod("p", i32::from(port)),
        container: container.into(),
        probe_type: "readiness".into(),
        pod_ips: pod_ips.iter().map(|s| s.to_string()).collect(),
        settings: vec![],
        timeout_ms,
    }
}

fn probe_config(name: &str) -> PluginConfig {
    config(name, World::Probe)
}

#[tokio::test]
async fn pod_network_reaches_the_pod_ips_only() {
    let (host, _) = host();
    host.load_bytes(probe_config("tcp"), components::connecting_probe())
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let r = host
        .try_probe(
            "tcp",
            probe_request("127.0.0.1", port, &["127.0.0.1"], 1000),
        )
        .await
        .unwrap();
    assert_eq!(r, ProbeResult::Success);
    // An address that is not the pod's is refused before connecting.
    let r = host
        .try_probe("tcp", probe_request("127.0.0.1", port, &["10.0.0.1"], 1000))
        .await
        .unwrap();
    let ProbeResult::Failure(msg) = r else {
        panic!("{r:?}")
    };
    assert!(msg.contains("not one of the pod's IPs"), "{msg}");
    // A closed port fails the probe with the connection error.
    drop(listener);
    let r = host
        .try_probe(
            "tcp",
            probe_request("127.0.0.1", port, &["127.0.0.1"], 1000),
        )
        .await
        .unwrap();
    assert!(matches!(r, ProbeResult::Failure(m) if m.contains("connecting to 127.0.0.1")));
}

#[tokio::test]
async fn a_probe_call_uses_the_probes_timeout_and_fails_the_probe() {
    let (host, _) = host();
    host.load_bytes(probe_config("slow"), components::looping_probe())
        .await
        .unwrap();
    let started = Instant::now();
    let r = host.probe("slow", probe_request("c", 80, &[], 100)).await;
    // The probe's 100 ms, not the plugin's 500 ms: the message says which (the wall
    // clock bound is loose, CI machines are busy).
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let ProbeResult::Failure(msg) = r else {
        panic!("{r:?}")
    };
    assert_eq!(msg, "probe plugin slow: timed out after 100ms");
}

#[tokio::test]
async fn calls_to_a_missing_or_other_world_plugin_are_refused() {
    let (host, _) = host();
    load_good(&host).await;
    assert_eq!(
        host.try_probe("nope", probe_request("c", 1, &[], 100))
            .await
            .unwrap_err(),
        CallError::NotLoaded("nope".into())
    );
    let err = host
        .try_probe("good", probe_request("c", 1, &[], 100))
        .await
        .unwrap_err();
    assert!(matches!(err, CallError::WrongWorld { .. }), "{err}");
}

#[tokio::test]
async fn many_concurrent_calls_share_the_pool() {
    let (host, _) = host(); // 8 instances
    load_good(&host).await;
    let calls = (0..40).map(|_| {
        let host = host.clone();
        tokio::spawn(async move {
            host.try_rank("good", "memory.available", &candidates())
                .await
        })
    });
    for call in calls {
        assert_eq!(call.await.unwrap().unwrap(), [2, 1, 0]);
    }
}

#[tokio::test]
async fn device_adapter_discovery_and_its_fallbacks() {
    let (host, _) = host();
    host.load_bytes(
        config("widgets", World::DeviceAdapter),
        components::device_adapter(false),
    )
    .await
    .unwrap();
    let devices = host.discover("widgets").await;
    assert_eq!(devices.len(), 2);
    assert_eq!(devices[0].id, "w0");
    assert!(devices[0].healthy);
    assert_eq!(devices[0].numa_node, Some(1));
    assert_eq!(devices[1].id, "w1");
    assert!(!devices[1].healthy);
    assert_eq!(devices[1].numa_node, None);
    // allocate traps: an error for the container.
    let err = host
        .allocate("widgets", vec!["w0".into()])
        .await
        .unwrap_err();
    assert!(matches!(err, CallError::Trap(_)), "{err}");
    // preferred-allocation answers [] though w1 must be included: picked in order.
    let ids = host
        .preferred_allocation("widgets", &["w0".into(), "w1".into()], &["w1".into()], 2)
        .await;
    assert_eq!(ids, ["w1", "w0"]);
    // A new version whose discover traps: the known devices turn unhealthy.
    assert!(
        host.reload_bytes("widgets", components::device_adapter(true))
            .await
            .unwrap()
    );
    let devices = host.discover("widgets").await;
    assert_eq!(devices.len(), 2);
    assert!(devices.iter().all(|d| !d.healthy));
}

#[tokio::test]
async fn a_call_that_finds_every_instance_taken_is_busy_and_not_counted_against_the_plugin() {
    let host = PluginHost::new(HostOptions {
        max_instances: 1,
        max_memory_bytes: 64 << 20,
        backoff: BackoffPolicy {
            failure_threshold: 2,
            ..BackoffPolicy::default()
        },
        ..HostOptions::default()
    })
    .unwrap();
    let mut looping = config("loop", World::Eviction);
    looping.limits.timeout_millis = 5_000;
    host.load_bytes(looping, components::looping())
        .await
        .unwrap();
    let mut good = config("good", World::Eviction);
    good.limits.timeout_millis = 50;
    host.load_bytes(good, components::ranking(&[2, 1, 0]))
        .await
        .unwrap();
    let busy = tokio::spawn({
        let host = host.clone();
        async move { host.try_rank("loop", "memory.available", &[]).await }
    });
    // The loop holds the one instance: calls to the good plugin find none free.
    let mut busy_calls = 0;
    let deadline = Instant::now() + Duration::from_secs(4);
    while busy_calls < 3 && Instant::now() < deadline {
        match host
            .try_rank("good", "memory.available", &candidates())
            .await
        {
            Err(CallError::Busy(_)) => busy_calls += 1,
            Ok(_) => tokio::task::yield_now().await,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(
        busy_calls, 3,
        "the pool's one instance was never seen taken"
    );
    let info = host
        .plugins()
        .into_iter()
        .find(|p| p.name == "good")
        .unwrap();
    assert_eq!(
        info.consecutive_failures, 0,
        "busy is not the plugin's failure"
    );
    assert!(info.disabled_until.is_none());
    busy.abort();
}
