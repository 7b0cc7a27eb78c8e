//! Missing images: what the node gets back when it asks for an image the store lacks.

use anyhow::Result;
use wasmlet_runtime::{Error, Runtime};

use crate::fixture::{Fixture, example_ref};

#[tokio::test]
async fn creating_a_container_from_a_missing_image_is_not_found() -> Result<()> {
    let fx = Fixture::with_images(&["hello"])?;
    let pod = fx.pod("missing-image").await?;
    let mut config = pod.container("ghost", "hello");
    config.image = "localhost/wasmlet-examples/ghost:latest".into();

    let err = fx
        .runtime
        .create_container(&pod.id, &config, &pod.config)
        .await
        .unwrap_err();
    match &err {
        Error::NotFound { kind, id } => {
            assert_eq!((*kind, id.as_str()), ("image", config.image.as_str()));
        }
        other => panic!("expected NotFound for the image, got {other:?}"),
    }
    assert!(fx.runtime.list_containers().await?.is_empty());

    // The same pod still runs a container whose image is there.
    let id = fx.run(&pod, &pod.container("hello", "hello")).await?;
    assert_eq!(fx.wait_exited(&id).await?.exit_code, 0);

    fx.runtime.remove_pod_sandbox(&pod.id).await?;
    Ok(())
}

#[tokio::test]
async fn pulling_a_missing_image_says_how_to_import_it() -> Result<()> {
    let fx = Fixture::with_images(&["hello"])?;
    let missing = "localhost/wasmlet-examples/ghost:latest";

    match fx.runtime.pull_image(missing, None).await.unwrap_err() {
        Error::ImagePull { image, message, .. } => {
            assert_eq!(image, missing);
            // Not in the store: the registry was asked (nothing listens on
            // localhost:443 here), and the message says how else to get it.
            assert!(
                message.contains("pulling localhost/wasmlet-examples/ghost"),
                "{message}"
            );
            assert!(message.contains("wasmlet images import"), "{message}");
        }
        other => panic!("expected ImagePull, got {other:?}"),
    }
    // An imported image pulled by its tag asks the registry too (as containerd
    // resolves a tag for `imagePullPolicy: Always`): with none there it fails; by its
    // digest it is the image held.
    let err = fx
        .runtime
        .pull_image(&example_ref("hello"), None)
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("pulling localhost/wasmlet-examples/hello"),
        "{err}"
    );
    let entry = fx.runtime.images().resolve(&example_ref("hello"))?;
    let by_digest = format!(
        "localhost/wasmlet-examples/hello@{}",
        entry.image.manifest_digest
    );
    let id = fx.runtime.pull_image(&by_digest, None).await?;
    assert_eq!(id, entry.image.manifest_digest);
    Ok(())
}
