//! The image store: importing the archive shapes found in the wild, resolving
//! references, listing and removing through the `Runtime` trait, refusing bad archives.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use wasmlet_runtime::Runtime;
use wasmlet_runtime_wasm::WasmKind;
use wasmlet_runtime_wasm::image::{ImageError, ImageStore, sha256_hex};
use wasmlet_testkit::images::{
    ANNOTATION_IMAGE_NAME, ANNOTATION_REF_NAME, ImageIndex, OciImage, WasmImage, WasmLayout,
    manifest_digest, write_oci_archive,
};

use crate::fixture::{Fixture, example_ref, example_wasm, examples_dir};

/// The blob files in the store, by hex digest.
fn stored_blobs(store: &ImageStore) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(store.root().join("blobs/sha256"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Writes an OCI layout tarball of `image` with `index.json` annotations of our choosing.
fn write_archive_with_annotations(
    image: &OciImage,
    annotations: BTreeMap<String, String>,
    out: &Path,
) -> Result<()> {
    let mut index: ImageIndex = serde_json::from_slice(&image.index_json()?)?;
    index.manifests[0].annotations = annotations;
    let mut tar = tar::Builder::new(std::fs::File::create(out)?);
    let mut add = |path: &str, data: &[u8]| -> std::io::Result<()> {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        tar.append_data(&mut header, path, data)
    };
    add("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    add("index.json", &serde_json::to_vec(&index)?)?;
    for blob in image.blobs().values() {
        add(&format!("blobs/sha256/{}", blob.hex()), &blob.data)?;
    }
    tar.into_inner()?.sync_all()?;
    Ok(())
}

#[test]
fn every_example_shape_imports_as_its_kind_with_the_exact_wasm_blob() -> Result<()> {
    let cases = [
        ("hello", WasmLayout::Artifact, WasmKind::Module),
        ("hello-component", WasmLayout::Artifact, WasmKind::Component),
        (
            "hello-runwasi",
            WasmLayout::RunwasiComponentLayer,
            WasmKind::Component,
        ),
        ("hello-plain", WasmLayout::PlainImage, WasmKind::Module),
    ];
    for (name, layout, kind) in cases {
        let fx = Fixture::new()?;
        let store = fx.runtime.images();
        let wasm = example_wasm(name);
        let reference = example_ref(name);

        let imported = fx.import(name)?;
        assert_eq!(imported.len(), 1, "{name}: {imported:#?}");
        let entry = &imported[0];
        assert_eq!(entry.reference, reference);
        assert_eq!(entry.image.kind, kind, "{name}");
        assert_eq!(
            entry.image.wasm_digest,
            format!("sha256:{}", sha256_hex(&wasm)),
            "{name}"
        );
        let want_id = manifest_digest(&WasmImage::new(&reference, wasm.clone(), layout))?;
        assert_eq!(entry.image.manifest_digest, want_id, "{name}");

        // The blob the sandbox will run is byte for byte the binary that was packaged.
        let blob = std::fs::read(store.blob_path(&entry.image.wasm_digest))?;
        assert_eq!(sha256_hex(&blob), sha256_hex(&wasm), "{name}");
        for digest in &entry.image.blobs {
            assert!(
                store.blob_path(digest).is_file(),
                "{name}: {digest} missing"
            );
        }

        assert_eq!(store.resolve(&reference)?.image, entry.image, "{name}");
        if layout == WasmLayout::PlainImage {
            // The config of a plain image is kept: its entrypoint names the file.
            assert_eq!(entry.image.entrypoint, ["/app.wasm"]);
            assert_eq!(entry.image.env, ["PATH=/"]);
        }
    }
    Ok(())
}

#[tokio::test]
async fn resolve_takes_full_references_ids_and_repo_digests_but_not_short_names() -> Result<()> {
    let fx = Fixture::with_images(&["hello"])?;
    let store = fx.runtime.images();
    let reference = example_ref("hello");
    let id = store.resolve(&reference)?.image.manifest_digest;

    // Short names mean Docker Hub, as in containerd: they do not find a local image.
    for short in ["hello", "wasmlet-examples/hello", "hello:latest"] {
        let err = store.resolve(short).unwrap_err();
        assert!(matches!(err, ImageError::NotFound(_)), "{short}: {err}");
        assert_eq!(fx.runtime.image_status(short).await?, None, "{short}");
    }

    let repo = "localhost/wasmlet-examples/hello";
    for found in [
        reference.clone(),
        repo.to_owned(), // no tag means `latest`
        id.clone(),
        format!("{repo}@{id}"),
    ] {
        let entry = store.resolve(&found)?;
        assert_eq!(entry.reference, reference, "{found}");
        assert_eq!(entry.image.manifest_digest, id, "{found}");
        let image = fx.runtime.image_status(&found).await?;
        assert_eq!(image.map(|i| i.id), Some(id.clone()), "{found}");
    }

    // A digest only counts under the repository that holds it.
    for missing in [
        format!("localhost/other/hello@{id}"),
        format!("sha256:{}", "0".repeat(64)),
        "localhost/wasmlet-examples/hello:v2".to_owned(),
    ] {
        let err = store.resolve(&missing).unwrap_err();
        assert!(matches!(err, ImageError::NotFound(_)), "{missing}: {err}");
    }
    Ok(())
}

#[tokio::test]
async fn list_images_groups_references_by_image_with_tags_and_digests() -> Result<()> {
    let fx = Fixture::with_images(&["hello", "hello-component"])?;
    // The same binary under a second name: same manifest, so the same image.
    let mirror = "localhost/mirror/hello:v1";
    let archive = fx.path().join("mirror.tar");
    write_oci_archive(
        &WasmImage::new(mirror, example_wasm("hello"), WasmLayout::Artifact),
        &archive,
    )?;
    fx.runtime.images().import_archive(&archive)?;

    let runtime = &fx.runtime;
    let id_of = |image: String| async move {
        anyhow::Ok(
            runtime
                .image_status(&image)
                .await?
                .context("the image is held")?
                .id,
        )
    };
    let hello_id = id_of(example_ref("hello")).await?;
    let component_id = id_of(example_ref("hello-component")).await?;
    assert_eq!(id_of(mirror.to_owned()).await?, hello_id);

    let mut images = fx.runtime.list_images().await?;
    assert_eq!(images.len(), 2, "{images:#?}");
    for image in &mut images {
        image.repo_tags.sort();
        image.repo_digests.sort();
    }
    let hello = images.iter().find(|i| i.id == hello_id).expect("hello");
    assert_eq!(
        hello.repo_tags,
        [mirror.to_owned(), example_ref("hello")],
        "{hello:#?}"
    );
    assert_eq!(
        hello.repo_digests,
        [
            format!("localhost/mirror/hello@{hello_id}"),
            format!("localhost/wasmlet-examples/hello@{hello_id}"),
        ]
    );
    assert!(
        hello.size > example_wasm("hello").len() as u64,
        "{hello:#?}"
    );

    let component = images
        .iter()
        .find(|i| i.id == component_id)
        .expect("component");
    assert_eq!(component.repo_tags, [example_ref("hello-component")]);
    assert_eq!(
        component.repo_digests,
        [format!(
            "localhost/wasmlet-examples/hello-component@{component_id}"
        )]
    );
    Ok(())
}

#[tokio::test]
async fn remove_image_drops_the_reference_and_collects_unshared_blobs() -> Result<()> {
    let fx = Fixture::with_images(&["hello", "hello-component"])?;
    let store = fx.runtime.images();
    let mirror = "localhost/mirror/hello:v1";
    let archive = fx.path().join("mirror.tar");
    write_oci_archive(
        &WasmImage::new(mirror, example_wasm("hello"), WasmLayout::Artifact),
        &archive,
    )?;
    store.import_archive(&archive)?;
    let hello = store.resolve(&example_ref("hello"))?.image;
    let component = store.resolve(&example_ref("hello-component"))?.image;
    let all_blobs = |image: &wasmlet_runtime_wasm::image::StoredImage| {
        image.blobs.iter().all(|d| store.blob_path(d).is_file())
    };
    let no_blobs = |image: &wasmlet_runtime_wasm::image::StoredImage| {
        image.blobs.iter().all(|d| !store.blob_path(d).exists())
    };
    assert!(all_blobs(&hello) && all_blobs(&component));
    // Compiled artifacts of both binaries, as the engine caches them.
    let cache = fx.path().join("compile-cache");
    std::fs::create_dir_all(&cache)?;
    let compiled = |digest: &str| {
        cache.join(format!(
            "{}-00000000000000ab.cwasm",
            digest.trim_start_matches("sha256:")
        ))
    };
    std::fs::write(compiled(&hello.wasm_digest), b"compiled")?;
    std::fs::write(compiled(&component.wasm_digest), b"compiled")?;

    // The mirror's blobs are hello's: removing one name keeps them for the other.
    fx.runtime.remove_image(mirror).await?;
    assert_eq!(fx.runtime.image_status(mirror).await?, None);
    assert!(store.resolve(&example_ref("hello")).is_ok());
    assert!(all_blobs(&hello), "blobs still referenced were deleted");
    assert!(
        compiled(&hello.wasm_digest).exists(),
        "hello still holds the binary"
    );

    fx.runtime.remove_image(&example_ref("hello")).await?;
    assert_eq!(fx.runtime.image_status(&example_ref("hello")).await?, None);
    assert!(!store.blob_path(&hello.wasm_digest).exists());
    assert!(no_blobs(&hello), "hello's blobs were not collected");
    assert!(all_blobs(&component), "another image's blobs were deleted");
    assert!(
        !compiled(&hello.wasm_digest).exists(),
        "the compiled artifact stayed"
    );
    assert!(compiled(&component.wasm_digest).exists());
    // Idempotent.
    fx.runtime.remove_image(&example_ref("hello")).await?;

    // By id: every reference of the image goes, and with it the last blobs.
    fx.runtime.remove_image(&component.manifest_digest).await?;
    assert_eq!(fx.runtime.list_images().await?, []);
    assert_eq!(stored_blobs(store), Vec::<String>::new());
    assert!(!compiled(&component.wasm_digest).exists());
    Ok(())
}

#[test]
fn an_archive_with_a_corrupted_blob_is_rejected_naming_archive_and_digest() -> Result<()> {
    let fx = Fixture::new()?;
    let store = fx.runtime.images();
    let image = WasmImage::new(
        example_ref("hello"),
        example_wasm("hello"),
        WasmLayout::Artifact,
    )
    .to_oci()?;
    // Each blob in turn gets one byte flipped in its middle, past any header a shape
    // check would read: only the digest check can notice.
    for what in ["wasm-layer", "config", "manifest"] {
        let mut corrupt = image.clone();
        let blob = match what {
            "wasm-layer" => &mut corrupt.layers[0],
            "config" => &mut corrupt.config,
            _ => &mut corrupt.manifest,
        };
        let digest = blob.digest.clone();
        let middle = blob.data.len() / 2;
        blob.data[middle] ^= 0x01;
        let archive = fx.path().join(format!("corrupt-{what}.tar"));
        corrupt.write_archive(&archive)?;

        let err = store.import_archive(&archive).unwrap_err();
        assert!(
            matches!(err, ImageError::BadArchive { .. }),
            "{what}: {err:?}"
        );
        let message = err.to_string();
        assert!(
            message.contains(&archive.display().to_string()),
            "{what}: {message}"
        );
        assert!(message.contains(&digest), "{what}: {message}");
    }
    assert_eq!(store.list()?, []);
    assert_eq!(stored_blobs(store), Vec::<String>::new());
    Ok(())
}

#[test]
fn an_archive_without_an_image_name_is_rejected() -> Result<()> {
    let fx = Fixture::new()?;
    let store = fx.runtime.images();
    let image = WasmImage::new(
        example_ref("hello"),
        example_wasm("hello"),
        WasmLayout::Artifact,
    )
    .to_oci()?;
    // What `skopeo copy oci-archive:x.tar:latest` writes: a tag, not a name.
    let archive = fx.path().join("unnamed.tar");
    write_archive_with_annotations(
        &image,
        BTreeMap::from([(ANNOTATION_REF_NAME.to_owned(), "latest".to_owned())]),
        &archive,
    )?;
    let err = store.import_archive(&archive).unwrap_err();
    assert!(matches!(err, ImageError::BadArchive { .. }), "{err:?}");
    let message = err.to_string();
    for needle in [
        archive.display().to_string(),
        image.manifest_digest().to_owned(),
        "no image name".to_owned(),
        ANNOTATION_IMAGE_NAME.to_owned(),
    ] {
        assert!(message.contains(&needle), "{needle:?} not in {message:?}");
    }
    assert_eq!(store.list()?, []);

    // The same archive is fine once the OCI annotation holds a full reference.
    let named = fx.path().join("named.tar");
    write_archive_with_annotations(
        &image,
        BTreeMap::from([(
            ANNOTATION_REF_NAME.to_owned(),
            "localhost/oci/hello:v2".to_owned(),
        )]),
        &named,
    )?;
    let imported = store.import_archive(&named)?;
    assert_eq!(imported.len(), 1);
    assert_eq!(imported[0].reference, "localhost/oci/hello:v2");
    Ok(())
}

#[test]
fn an_import_racing_a_remove_keeps_every_blob_it_names() -> Result<()> {
    // Two handles on one store, as `wasmlet images import` and the node's image
    // removal would have from two processes. Before imports took the store lock for
    // their blob writes, a remove's garbage collection between those writes and the
    // index update deleted the new blobs in about one import of five.
    let fx = Fixture::new()?;
    let importer = fx.runtime.images();
    let remover = ImageStore::open(importer.root())?;
    let examples = examples_dir();
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| -> Result<()> {
        let churn = scope.spawn(|| -> Result<()> {
            while !done.load(Ordering::Relaxed) {
                remover.import_archive(&examples.join("hello.tar"))?;
                remover.remove(&example_ref("hello"))?;
            }
            Ok(())
        });
        let checked = (|| -> Result<()> {
            for round in 0..100 {
                let entries = importer.import_archive(&examples.join("hello-component.tar"))?;
                let missing: Vec<&String> = entries[0]
                    .image
                    .blobs
                    .iter()
                    .filter(|d| !importer.blob_path(d).is_file())
                    .collect();
                assert!(missing.is_empty(), "round {round}: {missing:?} gone");
                importer.remove(&example_ref("hello-component"))?;
            }
            Ok(())
        })();
        done.store(true, Ordering::Relaxed);
        churn.join().expect("churn thread")?;
        checked
    })
}

#[tokio::test]
async fn image_fs_info_counts_the_stores_bytes() -> Result<()> {
    let fx = Fixture::new()?;
    let empty = fx.runtime.image_fs_info().await?;
    assert_eq!(empty.len(), 1);
    assert_eq!(empty[0].mountpoint, fx.path().join("images"));
    fx.import("hello")?;
    let used = fx.runtime.image_fs_info().await?;
    let wasm_bytes = example_wasm("hello").len() as u64;
    let (before, after) = (empty[0].used_bytes.unwrap(), used[0].used_bytes.unwrap());
    assert!(
        after >= before + wasm_bytes,
        "{before} bytes before, {after} after importing a {wasm_bytes}-byte module"
    );
    assert!(used[0].inodes_used.unwrap() > empty[0].inodes_used.unwrap());
    Ok(())
}
