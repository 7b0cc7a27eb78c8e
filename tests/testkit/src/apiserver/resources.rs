//! The resource types the test API server knows, and how each is addressed.

/// One served resource: its group/version, URL plural, kind and scope.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ResourceType {
    /// API group; `""` is the core group served under `/api/v1`.
    pub group: &'static str,
    pub version: &'static str,
    /// The lower-case plural used in URLs.
    pub plural: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    /// Subresources accepted after the object name (`status`, `token`, `log`, ...).
    pub subresources: &'static [&'static str],
    /// Create-only and never stored (TokenReview, SubjectAccessReview).
    pub create_only: bool,
}

/// Identity of a resource's storage: (group, plural).
pub(crate) type ResourceId = (&'static str, &'static str);

impl ResourceType {
    pub(crate) fn id(&self) -> ResourceId {
        (self.group, self.plural)
    }

    /// `v1` for the core group, `group/version` otherwise.
    pub(crate) fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `pods` or `leases.coordination.k8s.io`, as in the apiserver's messages.
    pub(crate) fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// Whether the main resource ignores `status` and `/status` changes only it.
    pub(crate) fn has_status(&self) -> bool {
        self.subresources.contains(&"status")
    }

    pub(crate) fn is(&self, group: &str, plural: &str) -> bool {
        self.group == group && self.plural == plural
    }
}

const fn core(
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
    subresources: &'static [&'static str],
) -> ResourceType {
    ResourceType {
        group: "",
        version: "v1",
        plural,
        kind,
        namespaced,
        subresources,
        create_only: false,
    }
}

const fn grouped(
    group: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
) -> ResourceType {
    ResourceType {
        group,
        version: "v1",
        plural,
        kind,
        namespaced,
        subresources: &[],
        create_only: false,
    }
}

/// A cluster-scoped review: POST answers it, nothing is stored.
const fn review(group: &'static str, plural: &'static str, kind: &'static str) -> ResourceType {
    ResourceType {
        create_only: true,
        ..grouped(group, plural, kind, false)
    }
}

/// Every resource served. Add a row to serve another plain CRUD resource.
pub(crate) static RESOURCES: &[ResourceType] = &[
    core("namespaces", "Namespace", false, &["status", "finalize"]),
    core("nodes", "Node", false, &["status", "proxy"]),
    core("pods", "Pod", true, &["status", "log"]),
    core("events", "Event", true, &[]),
    core("configmaps", "ConfigMap", true, &[]),
    core("secrets", "Secret", true, &[]),
    core("services", "Service", true, &["status"]),
    core("endpoints", "Endpoints", true, &[]),
    core("serviceaccounts", "ServiceAccount", true, &["token"]),
    core(
        "persistentvolumeclaims",
        "PersistentVolumeClaim",
        true,
        &["status"],
    ),
    core("persistentvolumes", "PersistentVolume", false, &["status"]),
    grouped("coordination.k8s.io", "leases", "Lease", true),
    grouped("events.k8s.io", "events", "Event", true),
    grouped("node.k8s.io", "runtimeclasses", "RuntimeClass", false),
    grouped("storage.k8s.io", "csidrivers", "CSIDriver", false),
    grouped("storage.k8s.io", "csinodes", "CSINode", false),
    grouped("discovery.k8s.io", "endpointslices", "EndpointSlice", true),
    ResourceType {
        subresources: &["status", "approval"],
        ..grouped(
            "certificates.k8s.io",
            "certificatesigningrequests",
            "CertificateSigningRequest",
            false,
        )
    },
    review("authentication.k8s.io", "tokenreviews", "TokenReview"),
    review(
        "authorization.k8s.io",
        "subjectaccessreviews",
        "SubjectAccessReview",
    ),
    grouped("storage.k8s.io", "storageclasses", "StorageClass", false),
    ResourceType {
        subresources: &["status"],
        ..grouped(
            "storage.k8s.io",
            "volumeattachments",
            "VolumeAttachment",
            false,
        )
    },
];

/// The CertificateSigningRequest resource.
pub(crate) fn csrs() -> &'static ResourceType {
    &RESOURCES[17]
}

/// The resource served at `group/version/plural`.
pub(crate) fn find(group: &str, version: &str, plural: &str) -> Option<&'static ResourceType> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// The namespace resource (its store holds the namespaces that exist).
pub(crate) fn namespaces() -> &'static ResourceType {
    &RESOURCES[0]
}

/// The service account resource (default accounts are made with namespaces).
pub(crate) fn service_accounts() -> &'static ResourceType {
    &RESOURCES[8]
}

/// The groups served under `/apis`, in table order, without duplicates.
pub(crate) fn groups() -> Vec<&'static str> {
    let mut groups: Vec<&'static str> = Vec::new();
    for r in RESOURCES.iter().filter(|r| !r.group.is_empty()) {
        if !groups.contains(&r.group) {
            groups.push(r.group);
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_rows_are_where_the_helpers_expect() {
        assert_eq!(namespaces().plural, "namespaces");
        assert_eq!(service_accounts().plural, "serviceaccounts");
        assert_eq!(csrs().kind, "CertificateSigningRequest");
    }

    #[test]
    fn finds_by_group_version_and_plural() {
        let lease = find("coordination.k8s.io", "v1", "leases").map(|r| r.kind);
        assert_eq!(lease, Some("Lease"));
        assert_eq!(
            find("", "v1", "pods").map(|r| r.api_version()),
            Some("v1".into())
        );
        assert!(find("", "v2", "pods").is_none());
        assert_eq!(groups()[0], "coordination.k8s.io");
    }
}
