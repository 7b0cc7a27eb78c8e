//! The object store: JSON objects keyed by resource, namespace and name, one global
//! resourceVersion counter, a bounded event history and the open watches.
//!
//! Every method runs under the server's store lock and never awaits; watches get
//! their events through unbounded channels filled while the lock is held, so a
//! watch sees exactly the changes after its starting resourceVersion, in order.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::errors::ApiError;
use super::resources::{self, ResourceId, ResourceType};
use super::selectors::{FieldSelector, LabelSelector};
use super::strategy::{self, ensure_object};

/// How many changes are kept for watches that resume from a resourceVersion.
const HISTORY_LIMIT: usize = 1000;

/// Namespaces that exist from the start.
const INITIAL_NAMESPACES: [&str; 4] = ["default", "kube-system", "kube-public", "kube-node-lease"];

/// What a change did to an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ChangeType {
    Added,
    Modified,
    Deleted,
}

/// One stored change, as kept in the history and sent to watches.
#[derive(Debug)]
pub(crate) struct Change {
    pub rv: u64,
    pub res: &'static ResourceType,
    pub kind: ChangeType,
    /// The object after the change (for deletions: its last state, with the deletion's RV).
    pub object: Value,
    /// The object before a modification, to tell selector transitions apart.
    pub old: Option<Value>,
}

/// Which part of an object a write may change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    /// The main resource: for resources with a status subresource, status is kept.
    Main,
    /// The `status` subresource: only status changes.
    Status,
    /// Everything (test administration).
    Whole,
}

/// The parts of `DeleteOptions` the store acts on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct DeleteOptions {
    pub grace_seconds: Option<i64>,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

/// The outcome of a DELETE.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Deletion {
    /// The object is gone; its last state.
    Removed(Value),
    /// Deletion is pending (grace period or finalizers); the object as stored.
    Pending(Value),
}

/// Which objects a list or watch selects.
#[derive(Clone, Debug, Default)]
pub(crate) struct Filter {
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub fields: FieldSelector,
    pub labels: LabelSelector,
}

impl Filter {
    pub(crate) fn matches(&self, obj: &Value) -> bool {
        self.namespace
            .as_deref()
            .is_none_or(|ns| meta_str(obj, "namespace") == ns)
            && self
                .name
                .as_deref()
                .is_none_or(|name| meta_str(obj, "name") == name)
            && self.fields.matches(obj)
            && self.labels.matches(obj)
    }

    /// The watch event `change` produces for this filter: a modification that makes
    /// an object match is ADDED, one that makes it stop matching is DELETED.
    pub(crate) fn project(&self, change: &Change) -> Option<(&'static str, Value)> {
        let now = self.matches(&change.object);
        match change.kind {
            ChangeType::Added => now.then(|| ("ADDED", change.object.clone())),
            ChangeType::Deleted => now.then(|| ("DELETED", change.object.clone())),
            ChangeType::Modified => {
                let before = change.old.as_ref().is_some_and(|old| self.matches(old));
                match (before, now) {
                    (true, true) => Some(("MODIFIED", change.object.clone())),
                    (false, true) => Some(("ADDED", change.object.clone())),
                    (true, false) => {
                        let mut last = change.old.clone().unwrap_or_default();
                        set_meta(
                            &mut last,
                            "resourceVersion",
                            Some(json!(change.rv.to_string())),
                        );
                        Some(("DELETED", last))
                    }
                    (false, false) => None,
                }
            }
        }
    }
}

/// Where a watch starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WatchStart {
    /// From the current state: every matching object as ADDED first.
    Now,
    /// After this resourceVersion, replayed from the history.
    After(u64),
}

/// A registered watch: the events to send first, then the live channel.
pub(crate) struct WatchSetup {
    pub initial: Vec<(&'static str, Value)>,
    pub live: mpsc::UnboundedReceiver<Arc<Change>>,
    /// The resourceVersion the initial events bring the watcher to.
    pub rv: u64,
}

struct Watcher {
    res: ResourceId,
    tx: mpsc::UnboundedSender<Arc<Change>>,
}

/// Stored objects of one resource, by (namespace, name); cluster-scoped ones use `""`.
type Objects = BTreeMap<(String, String), Value>;

/// The state of the test API server.
pub(crate) struct Store {
    objects: HashMap<ResourceId, Objects>,
    rv: u64,
    history: VecDeque<Arc<Change>>,
    /// Watches may resume from this resourceVersion or later.
    history_start: u64,
    watchers: Vec<Watcher>,
    ids: IdSource,
}

impl Store {
    /// A store holding the initial namespaces (each with its `default` service account).
    pub(crate) fn new() -> Store {
        let mut store = Store {
            objects: HashMap::new(),
            rv: 0,
            history: VecDeque::new(),
            history_start: 0,
            watchers: Vec::new(),
            ids: IdSource::default(),
        };
        for ns in INITIAL_NAMESPACES {
            let created = store.create(
                resources::namespaces(),
                "",
                json!({ "metadata": { "name": ns } }),
            );
            debug_assert!(created.is_ok(), "initial namespace {ns}: {created:?}");
        }
        store
    }

    /// The current global resourceVersion.
    pub(crate) fn rv(&self) -> u64 {
        self.rv
    }

    fn objects(&self, res: &ResourceType) -> Option<&Objects> {
        self.objects.get(&res.id())
    }

    /// One object.
    pub(crate) fn get(
        &self,
        res: &ResourceType,
        namespace: &str,
        name: &str,
    ) -> Result<Value, ApiError> {
        self.objects(res)
            .and_then(|o| o.get(&(namespace.to_string(), name.to_string())))
            .cloned()
            .ok_or_else(|| ApiError::not_found(res, name))
    }

    /// The matching objects, ordered by namespace and name, and the current RV.
    pub(crate) fn list(&self, res: &ResourceType, filter: &Filter) -> (Vec<Value>, u64) {
        let items = self
            .objects(res)
            .map(|objects| {
                objects
                    .values()
                    .filter(|o| filter.matches(o))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        (items, self.rv)
    }

    fn namespace_exists(&self, namespace: &str) -> bool {
        self.objects(resources::namespaces())
            .is_some_and(|o| o.contains_key(&(String::new(), namespace.to_string())))
    }

    /// Creates `obj` in `namespace` (ignored for cluster-scoped resources).
    pub(crate) fn create(
        &mut self,
        res: &'static ResourceType,
        namespace: &str,
        mut obj: Value,
    ) -> Result<Value, ApiError> {
        check_body(res, &obj)?;
        let body_ns = meta_str(&obj, "namespace").to_string();
        let namespace = if res.namespaced {
            match (namespace, body_ns.as_str()) {
                ("", "") => return Err(ApiError::bad_request("a namespace is required")),
                ("", body) => body.to_string(),
                (url, body) if !body.is_empty() && body != url => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
                (url, _) => url.to_string(),
            }
        } else {
            String::new()
        };
        let name = match meta_str(&obj, "name") {
            "" => match meta_str(&obj, "generateName") {
                "" => {
                    return Err(ApiError::invalid(
                        res,
                        "",
                        "metadata.name",
                        "Required value: name or generateName is required",
                    ));
                }
                prefix => self.generate_name(res, &namespace, prefix),
            },
            name => name.to_string(),
        };
        validate_name(res, &name)?;
        if res.namespaced && !self.namespace_exists(&namespace) {
            return Err(ApiError::not_found(resources::namespaces(), &namespace));
        }
        let key = (namespace.clone(), name.clone());
        if self.objects(res).is_some_and(|o| o.contains_key(&key)) {
            return Err(ApiError::already_exists(res, &name));
        }
        set_type(res, &mut obj);
        let uid = self.ids.uid();
        let meta = ensure_object(&mut obj, "metadata");
        meta.insert("name".into(), json!(name));
        if res.namespaced {
            meta.insert("namespace".into(), json!(namespace));
        } else {
            meta.remove("namespace");
        }
        meta.insert("uid".into(), json!(uid));
        meta.insert(
            "creationTimestamp".into(),
            json!(format_time(Timestamp::now())),
        );
        for system in [
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "selfLink",
        ] {
            meta.remove(system);
        }
        strategy::prepare_create(res, &mut obj);
        let rv = self.next_rv();
        set_meta(&mut obj, "resourceVersion", Some(json!(rv.to_string())));
        self.objects
            .entry(res.id())
            .or_default()
            .insert(key, obj.clone());
        self.emit(rv, res, ChangeType::Added, obj.clone(), None);
        if res.is("", "namespaces") {
            let account = json!({ "metadata": { "name": "default" } });
            let created = self.create(resources::service_accounts(), &name, account);
            debug_assert!(created.is_ok(), "default service account: {created:?}");
        }
        Ok(obj)
    }

    /// Replaces an object with what `make` builds from the stored one, as PUT and
    /// PATCH do: a non-empty resourceVersion in the result must match the stored one;
    /// `target` decides which parts may change; a no-op changes nothing (no new RV,
    /// no event); clearing the last finalizer of an object being deleted removes it.
    pub(crate) fn update(
        &mut self,
        res: &'static ResourceType,
        namespace: &str,
        name: &str,
        target: Target,
        make: impl FnOnce(&Value) -> Result<Value, ApiError>,
    ) -> Result<Value, ApiError> {
        let old = self.get(res, namespace, name)?;
        let mut new = make(&old)?;
        check_body(res, &new)?;
        match meta_str(&new, "name") {
            "" => {}
            n if n == name => {}
            n => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                )));
            }
        }
        match meta_str(&new, "namespace") {
            "" => {}
            n if n == namespace || !res.namespaced => {}
            _ => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
        }
        let old_rv = meta_str(&old, "resourceVersion").to_string();
        match meta_str(&new, "resourceVersion") {
            "" => {}
            rv if rv == old_rv => {}
            _ => return Err(ApiError::stale(res, name)),
        }
        match target {
            Target::Main if res.has_status() => {
                set_field(&mut new, "status", old.get("status").cloned())
            }
            Target::Status => {
                let status = new.get("status").cloned();
                new = old.clone();
                set_field(&mut new, "status", status);
            }
            Target::Main | Target::Whole => {}
        }
        // A UID in the new object is a precondition: it must be the object's own
        // (a status patch for a pod that was deleted and created again fails).
        let new_uid = new.get("metadata").and_then(|m| m.get("uid")).cloned();
        let old_uid = old.get("metadata").and_then(|m| m.get("uid")).cloned();
        if let (Some(n), Some(o)) = (&new_uid, &old_uid)
            && n != o
            && !n.is_null()
        {
            return Err(ApiError::conflict(
                res,
                name,
                &format!("Precondition failed: UID in precondition: {n}, UID in object meta: {o}"),
            ));
        }
        for system in [
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
        ] {
            let kept = old.get("metadata").and_then(|m| m.get(system)).cloned();
            set_meta(&mut new, system, kept);
        }
        set_type(res, &mut new);
        strategy::prepare_update(res, &old, &mut new);
        set_meta(&mut new, "resourceVersion", Some(json!(old_rv)));
        if new == old {
            return Ok(old);
        }
        if finalized(&old, &new) {
            return Ok(self.remove(res, namespace, name, new));
        }
        let rv = self.next_rv();
        set_meta(&mut new, "resourceVersion", Some(json!(rv.to_string())));
        self.store(res, namespace, name, new.clone());
        self.emit(rv, res, ChangeType::Modified, new.clone(), Some(old));
        Ok(new)
    }

    /// Deletes an object the way the apiserver's generic registry does: preconditions,
    /// graceful deletion for pods (a deletionTimestamp first; a later, shorter grace
    /// shortens it; zero removes), and finalizers holding the object until cleared.
    pub(crate) fn delete(
        &mut self,
        res: &'static ResourceType,
        namespace: &str,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<Deletion, ApiError> {
        let old = self.get(res, namespace, name)?;
        if let Some(uid) = &opts.uid {
            let actual = meta_str(&old, "uid");
            if uid != actual {
                let why = format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {actual}"
                );
                return Err(ApiError::conflict(res, name, &why));
            }
        }
        if let Some(rv) = &opts.resource_version {
            let actual = meta_str(&old, "resourceVersion");
            if rv != actual {
                let why = format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {actual}"
                );
                return Err(ApiError::conflict(res, name, &why));
            }
        }
        let finalizers = has_finalizers(&old);
        let mut obj = old.clone();
        enum Next {
            Keep,
            Write,
            Remove,
        }
        let graceful = strategy::grace_period(res, &old, opts.grace_seconds);
        let next = match parse_time(meta_str(&old, "deletionTimestamp")) {
            // Already being deleted: a graceful deletion may only be shortened.
            Some(deleting_at) => {
                let current = old
                    .pointer("/metadata/deletionGracePeriodSeconds")
                    .and_then(Value::as_i64)
                    .unwrap_or(0);
                match opts.grace_seconds.map(|g| g.max(0)) {
                    Some(shorter) if graceful.is_some() && current > 0 && shorter < current => {
                        let at = deleting_at
                            .checked_add(SignedDuration::from_secs(shorter - current))
                            .unwrap_or(deleting_at);
                        set_meta(&mut obj, "deletionTimestamp", Some(json!(format_time(at))));
                        set_meta(&mut obj, "deletionGracePeriodSeconds", Some(json!(shorter)));
                        if shorter == 0 && !finalizers {
                            Next::Remove
                        } else {
                            Next::Write
                        }
                    }
                    _ if graceful.is_some() && current > 0 => Next::Keep,
                    _ if finalizers => Next::Keep,
                    _ => Next::Remove,
                }
            }
            None => match graceful {
                Some(period) => {
                    mark_deleting(&mut obj, period);
                    if let Some(generation) =
                        obj.pointer("/metadata/generation").and_then(Value::as_i64)
                    {
                        set_meta(&mut obj, "generation", Some(json!(generation + 1)));
                    }
                    if period == 0 && !finalizers {
                        Next::Remove
                    } else {
                        Next::Write
                    }
                }
                None if finalizers => {
                    mark_deleting(&mut obj, 0);
                    Next::Write
                }
                None => Next::Remove,
            },
        };
        match next {
            Next::Keep => Ok(Deletion::Pending(old)),
            Next::Remove => Ok(Deletion::Removed(self.remove(res, namespace, name, obj))),
            Next::Write => {
                let rv = self.next_rv();
                set_meta(&mut obj, "resourceVersion", Some(json!(rv.to_string())));
                self.store(res, namespace, name, obj.clone());
                self.emit(rv, res, ChangeType::Modified, obj.clone(), Some(old));
                Ok(Deletion::Pending(obj))
            }
        }
    }

    /// Removes an object for good (and, for a namespace, everything in it); returns
    /// its last state carrying the deletion's resourceVersion.
    fn remove(
        &mut self,
        res: &'static ResourceType,
        namespace: &str,
        name: &str,
        mut last: Value,
    ) -> Value {
        if let Some(objects) = self.objects.get_mut(&res.id()) {
            objects.remove(&(namespace.to_string(), name.to_string()));
        }
        let rv = self.next_rv();
        set_meta(&mut last, "resourceVersion", Some(json!(rv.to_string())));
        self.emit(rv, res, ChangeType::Deleted, last.clone(), None);
        if res.is("", "namespaces") {
            for inner in resources::RESOURCES.iter().filter(|r| r.namespaced) {
                let keys: Vec<(String, String)> = self
                    .objects(inner)
                    .map(|o| o.keys().filter(|(ns, _)| ns == name).cloned().collect())
                    .unwrap_or_default();
                for (ns, obj_name) in keys {
                    if let Ok(obj) = self.get(inner, &ns, &obj_name) {
                        self.remove(inner, &ns, &obj_name, obj);
                    }
                }
            }
        }
        last
    }

    fn store(&mut self, res: &ResourceType, namespace: &str, name: &str, obj: Value) {
        self.objects
            .entry(res.id())
            .or_default()
            .insert((namespace.to_string(), name.to_string()), obj);
    }

    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    /// Records a change in the history and hands it to the watches of its resource.
    fn emit(
        &mut self,
        rv: u64,
        res: &'static ResourceType,
        kind: ChangeType,
        object: Value,
        old: Option<Value>,
    ) {
        let change = Arc::new(Change {
            rv,
            res,
            kind,
            object,
            old,
        });
        self.history.push_back(change.clone());
        while self.history.len() > HISTORY_LIMIT {
            if let Some(dropped) = self.history.pop_front() {
                self.history_start = dropped.rv;
            }
        }
        let id = res.id();
        self.watchers
            .retain(|w| w.res != id || w.tx.send(change.clone()).is_ok());
    }

    /// Registers a watch of `res` selected by `filter`.
    ///
    /// Fails with 410 Expired when `start` is older than the kept history.
    pub(crate) fn watch(
        &mut self,
        res: &'static ResourceType,
        filter: &Filter,
        start: WatchStart,
    ) -> Result<WatchSetup, ApiError> {
        let initial = match start {
            WatchStart::Now => self
                .list(res, filter)
                .0
                .into_iter()
                .map(|obj| ("ADDED", obj))
                .collect(),
            WatchStart::After(rv) if rv < self.history_start => {
                return Err(ApiError::expired(rv, self.history_start));
            }
            WatchStart::After(rv) => self
                .history
                .iter()
                .filter(|c| c.rv > rv && c.res.id() == res.id())
                .filter_map(|c| filter.project(c))
                .collect(),
        };
        let (tx, live) = mpsc::unbounded_channel();
        self.watchers.push(Watcher { res: res.id(), tx });
        Ok(WatchSetup {
            initial,
            live,
            rv: self.rv,
        })
    }

    /// Ends every open watch.
    pub(crate) fn drop_watches(&mut self) {
        self.watchers.clear();
    }

    /// The number of open watches.
    pub(crate) fn open_watches(&mut self) -> usize {
        self.watchers.retain(|w| !w.tx.is_closed());
        self.watchers.len()
    }

    /// Forgets the history (as etcd compaction does): watches resuming from any
    /// resourceVersion issued so far get 410 Expired; a fresh list works.
    pub(crate) fn expire_history(&mut self) {
        self.history.clear();
        self.history_start = self.next_rv();
    }

    /// `prefix` plus five random characters, not yet taken.
    fn generate_name(&mut self, res: &ResourceType, namespace: &str, prefix: &str) -> String {
        loop {
            let name = format!("{prefix}{}", self.ids.suffix());
            let taken = self
                .objects(res)
                .is_some_and(|o| o.contains_key(&(namespace.to_string(), name.clone())));
            if !taken {
                return name;
            }
        }
    }

    /// A fresh UID (for tokens and other generated identities).
    pub(crate) fn new_uid(&mut self) -> String {
        self.ids.uid()
    }
}

/// Random identities: UUID-shaped uids and generateName suffixes.
#[derive(Default)]
struct IdSource {
    hasher: RandomState,
    counter: u64,
}

impl IdSource {
    fn next(&mut self) -> u64 {
        self.counter += 1;
        self.hasher.hash_one(self.counter)
    }

    fn uid(&mut self) -> String {
        let (a, b) = (self.next(), self.next());
        let hex = format!("{a:016x}{b:016x}");
        format!(
            "{}-{}-4{}-a{}-{}",
            &hex[0..8],
            &hex[8..12],
            &hex[13..16],
            &hex[17..20],
            &hex[20..32]
        )
    }

    fn suffix(&mut self) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        let mut bits = self.next();
        (0..5)
            .map(|_| {
                let c = ALPHABET[(bits % ALPHABET.len() as u64) as usize] as char;
                bits /= ALPHABET.len() as u64;
                c
            })
            .collect()
    }
}

/// `metadata.<key>` as a string, `""` when absent.
pub(crate) fn meta_str<'a>(obj: &'a Value, key: &str) -> &'a str {
    obj.get("metadata")
        .and_then(|m| m.get(key))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// Sets (`Some`) or removes (`None`) `metadata.<key>`.
pub(crate) fn set_meta(obj: &mut Value, key: &str, value: Option<Value>) {
    let meta = ensure_object(obj, "metadata");
    match value {
        Some(value) => {
            meta.insert(key.to_string(), value);
        }
        None => {
            meta.remove(key);
        }
    }
}

fn set_field(obj: &mut Value, key: &str, value: Option<Value>) {
    if let Value::Object(map) = obj {
        match value {
            Some(value) => {
                map.insert(key.to_string(), value);
            }
            None => {
                map.remove(key);
            }
        }
    }
}

fn set_type(res: &ResourceType, obj: &mut Value) {
    if let Value::Object(map) = obj {
        map.insert("kind".into(), json!(res.kind));
        map.insert("apiVersion".into(), json!(res.api_version()));
    }
}

/// A body must be an object of the resource's kind and apiVersion (when given).
fn check_body(res: &ResourceType, obj: &Value) -> Result<(), ApiError> {
    if !obj.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    if let Some(kind) = obj.get("kind").and_then(Value::as_str)
        && !kind.is_empty()
        && kind != res.kind
    {
        return Err(ApiError::bad_request(format!(
            "the kind of the provided object ({kind}) does not match the resource ({})",
            res.kind
        )));
    }
    if let Some(version) = obj.get("apiVersion").and_then(Value::as_str)
        && !version.is_empty()
        && version != res.api_version()
    {
        return Err(ApiError::bad_request(format!(
            "the apiVersion of the provided object ({version}) does not match the resource ({})",
            res.api_version()
        )));
    }
    if obj
        .get("metadata")
        .is_some_and(|m| !m.is_object() && !m.is_null())
    {
        return Err(ApiError::bad_request("metadata must be an object"));
    }
    Ok(())
}

/// Names must be usable as one path segment (the apiserver is stricter per resource).
fn validate_name(res: &ResourceType, name: &str) -> Result<(), ApiError> {
    let bad = name.is_empty()
        || name == "."
        || name == ".."
        || name.len() > 253
        || name.contains(['/', '%'])
        || name.chars().any(char::is_whitespace);
    if bad {
        Err(ApiError::invalid(
            res,
            name,
            "metadata.name",
            "Invalid value: not a valid object name",
        ))
    } else {
        Ok(())
    }
}

fn has_finalizers(obj: &Value) -> bool {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| !f.is_empty())
}

/// An update that cleared the last finalizer of an object whose deletion is due.
fn finalized(old: &Value, new: &Value) -> bool {
    if has_finalizers(new) || !has_finalizers(old) || meta_str(new, "deletionTimestamp").is_empty()
    {
        return false;
    }
    new.pointer("/metadata/deletionGracePeriodSeconds")
        .and_then(Value::as_i64)
        .is_none_or(|grace| grace == 0)
}

fn mark_deleting(obj: &mut Value, grace: i64) {
    let now = Timestamp::now();
    let at = now
        .checked_add(SignedDuration::from_secs(grace))
        .unwrap_or(now);
    set_meta(obj, "deletionTimestamp", Some(json!(format_time(at))));
    set_meta(obj, "deletionGracePeriodSeconds", Some(json!(grace)));
}

/// RFC 3339 with whole seconds, as `metav1.Time` serializes.
pub(crate) fn format_time(at: Timestamp) -> String {
    Timestamp::from_second(at.as_second())
        .unwrap_or(at)
        .to_string()
}

fn parse_time(text: &str) -> Option<Timestamp> {
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods() -> &'static ResourceType {
        resources::find("", "v1", "pods").expect("pods are served")
    }

    fn pod(name: &str, node: &str) -> Value {
        json!({ "metadata": { "name": name }, "spec": { "nodeName": node, "containers": [] } })
    }

    #[test]
    fn starts_with_namespaces_and_default_accounts() {
        let store = Store::new();
        let (namespaces, _) = store.list(resources::namespaces(), &Filter::default());
        assert_eq!(namespaces.len(), 4);
        assert!(
            store
                .get(resources::service_accounts(), "kube-system", "default")
                .is_ok()
        );
    }

    #[test]
    fn create_update_and_no_op() {
        let mut store = Store::new();
        let created = store
            .create(pods(), "default", pod("p", "n1"))
            .expect("create");
        assert_eq!(created["status"]["phase"], "Pending");
        let rv = meta_str(&created, "resourceVersion").to_string();
        let same = store
            .update(pods(), "default", "p", Target::Main, |old| Ok(old.clone()))
            .expect("no-op update");
        assert_eq!(meta_str(&same, "resourceVersion"), rv);
        let err = store
            .update(pods(), "default", "p", Target::Main, |old| {
                let mut new = old.clone();
                set_meta(&mut new, "resourceVersion", Some(json!("1")));
                Ok(new)
            })
            .expect_err("stale resourceVersion");
        assert_eq!(err.code, 409);
        let missing = store
            .create(pods(), "nowhere", pod("p", "n1"))
            .expect_err("no namespace");
        assert_eq!(missing.code, 404);
    }

    #[test]
    fn watch_history_expires() {
        let mut store = Store::new();
        store
            .create(pods(), "default", pod("p", "n1"))
            .expect("create");
        let rv = store.rv();
        let filter = Filter::default();
        assert!(store.watch(pods(), &filter, WatchStart::After(rv)).is_ok());
        store.expire_history();
        let err = store
            .watch(pods(), &filter, WatchStart::After(rv))
            .err()
            .map(|e| e.code);
        assert_eq!(err, Some(410));
        assert!(
            store
                .watch(pods(), &filter, WatchStart::After(store.rv()))
                .is_ok()
        );
    }

    #[test]
    fn finalizers_hold_deletion_until_cleared() {
        let mut store = Store::new();
        let mut cm = json!({ "metadata": { "name": "c", "finalizers": ["x"] } });
        let configmaps = resources::find("", "v1", "configmaps").expect("served");
        store
            .create(configmaps, "default", cm.take())
            .expect("create");
        let pending = store
            .delete(configmaps, "default", "c", &DeleteOptions::default())
            .expect("delete");
        assert!(
            matches!(pending, Deletion::Pending(ref o) if !meta_str(o, "deletionTimestamp").is_empty())
        );
        store
            .update(configmaps, "default", "c", Target::Main, |old| {
                let mut new = old.clone();
                set_meta(&mut new, "finalizers", None);
                Ok(new)
            })
            .expect("clear finalizers");
        assert!(store.get(configmaps, "default", "c").is_err());
    }
}
