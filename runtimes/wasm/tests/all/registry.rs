//! Registry pulls: a real loopback registry (Debian's docker-registry) over TLS from a
//! test CA, with basic auth; the Wasm artifact pushed to it is pulled by tag and by
//! digest, precompiled, and run.

use std::time::Instant;

use anyhow::Result;
use wasmlet_runtime::{AuthConfig, Error, Runtime};
use wasmlet_runtime_wasm::registry::RegistrySettings;
use wasmlet_testkit::registry::{PASSWORD, Registry, USER};

use crate::fixture::{Fixture, example_wasm};

fn settings(registry: &Registry) -> RegistrySettings {
    RegistrySettings {
        certs_dir: registry.certs_dir(),
        ..Default::default()
    }
}

fn credentials(password: &str) -> AuthConfig {
    AuthConfig {
        username: USER.into(),
        password: password.into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn an_image_only_in_a_registry_is_pulled_with_credentials_by_tag_and_by_digest() -> Result<()>
{
    let registry = tokio::task::spawn_blocking(Registry::start).await??;
    let wasm = example_wasm("hello");
    let pushed = registry.push_wasm("wasm/hello", "v1", &wasm).await?;
    let fx = Fixture::with_registry(settings(&registry))?;
    let by_tag = format!("{}/wasm/hello:v1", registry.host);

    // Without credentials, or with the wrong ones: the registry's refusal, no image.
    for auth in [None, Some(credentials("wrong"))] {
        match fx
            .runtime
            .pull_image(&by_tag, auth.as_ref())
            .await
            .unwrap_err()
        {
            Error::ImagePull { message, .. } => {
                assert!(message.contains("unauthorized"), "{message}");
                assert!(
                    !message.contains(PASSWORD) && !message.contains("wrong"),
                    "{message}"
                );
            }
            other => panic!("expected ImagePull, got {other:?}"),
        }
    }
    assert!(fx.runtime.images().list()?.is_empty());

    // With them: stored under the tag, the id being the manifest's digest, and
    // compiled already.
    let started = Instant::now();
    let id = fx
        .runtime
        .pull_image(&by_tag, Some(&credentials(PASSWORD)))
        .await?;
    eprintln!("pulled and precompiled in {:?}", started.elapsed());
    assert_eq!(id, pushed);
    let entry = fx.runtime.images().resolve(&by_tag)?;
    assert_eq!(entry.image.manifest_digest, pushed);
    let cached: Vec<_> = std::fs::read_dir(fx.path().join("compile-cache"))?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".cwasm"))
        .collect();
    assert_eq!(cached.len(), 1, "compiled right after the pull");

    // By digest, into a store that has nothing: exactly that manifest.
    let fresh = Fixture::with_registry(settings(&registry))?;
    let by_digest = format!("{}/wasm/hello@{pushed}", registry.host);
    assert_eq!(
        fresh
            .runtime
            .pull_image(&by_digest, Some(&credentials(PASSWORD)))
            .await?,
        pushed
    );
    let wrong_digest = format!("{}/wasm/hello@sha256:{}", registry.host, "0".repeat(64));
    assert!(
        fresh
            .runtime
            .pull_image(&wrong_digest, Some(&credentials(PASSWORD)))
            .await
            .is_err()
    );

    // And it runs.
    let pod = fx.pod("pulled").await?;
    let mut config = pod.container("hello", "hello");
    config.image = by_tag.clone();
    let container = fx.run(&pod, &config).await?;
    assert_eq!(fx.wait_exited(&container).await?.exit_code, 0);
    fx.runtime.remove_pod_sandbox(&pod.id).await?;
    Ok(())
}

#[tokio::test]
async fn a_registry_whose_ca_is_not_trusted_is_refused() -> Result<()> {
    let registry = tokio::task::spawn_blocking(Registry::start).await??;
    let no_cas = tempfile::tempdir()?;
    let fx = Fixture::with_registry(RegistrySettings {
        certs_dir: no_cas.path().to_owned(),
        attempts: 1,
        ..Default::default()
    })?;
    let image = format!("{}/wasm/hello:v1", registry.host);
    match fx
        .runtime
        .pull_image(&image, Some(&credentials(PASSWORD)))
        .await
        .unwrap_err()
    {
        Error::ImagePull { message, .. } => {
            assert!(message.to_lowercase().contains("certificate"), "{message}");
        }
        other => panic!("expected ImagePull, got {other:?}"),
    }
    Ok(())
}

/// `imagePullPolicy: Always` pulls every time: a tag held is asked of its registry
/// again, which gives the same image while the tag names it, and the new one once it
/// was pushed anew.
#[tokio::test]
async fn a_tag_pulled_again_follows_the_registry() -> Result<()> {
    let registry = tokio::task::spawn_blocking(Registry::start).await??;
    let first = registry
        .push_wasm("wasm/app", "stable", &example_wasm("hello"))
        .await?;
    let fx = Fixture::with_registry(settings(&registry))?;
    let tag = format!("{}/wasm/app:stable", registry.host);
    let auth = credentials(PASSWORD);
    assert_eq!(fx.runtime.pull_image(&tag, Some(&auth)).await?, first);
    assert_eq!(
        fx.runtime.pull_image(&tag, Some(&auth)).await?,
        first,
        "unchanged"
    );
    let second = registry
        .push_wasm("wasm/app", "stable", &example_wasm("ticker"))
        .await?;
    assert_ne!(first, second);
    assert_eq!(fx.runtime.pull_image(&tag, Some(&auth)).await?, second);
    assert_eq!(
        fx.runtime.images().resolve(&tag)?.image.manifest_digest,
        second,
        "the tag now names the new image"
    );
    // Without the registry's consent a held tag is not used: the pull fails.
    assert!(fx.runtime.pull_image(&tag, None).await.is_err());
    Ok(())
}
