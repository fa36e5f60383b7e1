//! A PushSecret's generator source (`spec.selector.generatorRef`): ESO's semantics, made safe.
//!
//! - **Identity.** The generator is bound with the node agent's tenancy rules (a generator of
//!   the PushSecret's namespace, or a ClusterGenerator that admits it) and run AS the
//!   PushSecret's service account: the account must have opted in (checked even for a password,
//!   which needs no token), and the tokens its auth needs are minted under the mirror's consent
//!   rules. The binding and the run are the mirror's ([`crate::mirror::generated`]), not a copy.
//! - **When.** A value is generated on the first push and then once per `refreshInterval`
//!   (`0`: once, never again), never on a quiet reconcile, a store change or a restart. The
//!   last generation is the `creationTimestamp` of the PushSecret's newest GeneratorState
//!   (written by the API server, so it survives a restart and no clock of ours sets it); that
//!   state carries the annotation [`ANNOTATION_PUSHED`] once every store holds its value.
//! - **Where the value lives.** Only in this process's memory, from generation until it is
//!   replaced: never in a Secret, the status, a log or an Event. That is what lets a push that
//!   failed in one of several stores be retried with the SAME value (no new generation until
//!   every store has it). After a restart in that window the value is gone: the newest state
//!   lacks the annotation, so a new value is generated and pushed to every store, and the
//!   interrupted one retires with the others.
//! - **States.** Each credential gets its own GeneratorState, labelled [`LABEL_PUSH_SECRET`]
//!   (even a password's, which has nothing to clean up: its creation time is the record of the
//!   generation). Once every store holds a new value, the earlier states get the garbage
//!   collection deadline (`--generator-grace-period`); a value no store took is cleaned up at
//!   once. The PushSecret owns its states only with `deletionPolicy: Delete`: then deleting it
//!   removes what it pushed, so the credentials may go with it (Kubernetes' garbage collector,
//!   then the cleanup finalizer). With `None` the pushed values stay in the stores after the
//!   PushSecret is gone and their consumers still use them: the credentials must stay valid,
//!   so the states are not owned and outlive it (deleting such a state revokes the credential).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Resource, ResourceExt};
use tracing::{debug, warn};

use crate::api::external_secret::GeneratorRef;
use crate::api::generator::GeneratorState;
use crate::api::push_secret::{PushDeletionPolicy, PushSecret, PushSecretStatus};
use crate::catalog::{BindingError, Catalog, bind_generator};
use crate::generators::states::{
    ANNOTATION_PUSHED, LABEL_GENERATOR, LABEL_PUSH_SECRET, label_value,
};
use crate::identity::PodInfo;
use crate::mirror::generated::{self, Holder, Made, MirrorGenerators};
use crate::mirror::tokens::TokenMinter;
use crate::providers::Env;
use crate::secret::SecretBytes;

/// Most values held at once (one per PushSecret with a generator); past it the oldest is
/// dropped, which costs that PushSecret a new value in every store, never a wrong one.
const MAX_HELD: usize = 10_000;

/// What running generators for PushSecrets needs.
pub struct PushGenerators {
    /// The providers' shared side, for generators that reach a backend.
    pub env: Env,
    /// Mints the account's tokens; refuses an account that did not opt in.
    pub minter: Arc<TokenMinter>,
    /// `--allow-agent-identity`.
    pub allow_agent_identity: bool,
    /// Where the states go and how earlier ones retire (the mirror's).
    pub states: MirrorGenerators,
}

/// A failure: its condition reason and message (names the generator, never a value).
pub type Failed = (&'static str, String);

/// What the generator source gives a reconcile.
pub enum Generated {
    /// The values to push (the same until every store has them); the next generation is due
    /// in the given time (`None`: never).
    Values(BTreeMap<String, SecretBytes>, Option<Duration>),
    /// Every store holds the current value, which this process no longer has (a restart):
    /// nothing to push until the next generation, due in the given time (`None`: never).
    Quiet(Option<Duration>),
}

/// One PushSecret's current value.
struct Held {
    generator: GeneratorRef,
    values: BTreeMap<String, SecretBytes>,
    made: Option<Made>,
    at: SystemTime,
    /// Stores (`<kind>/<name>`) that hold it.
    stores: BTreeSet<String>,
    /// Every store held it, and its state says so.
    complete: bool,
}

/// The values generated for PushSecrets, by uid: this process's memory, nowhere else.
#[derive(Default)]
pub struct GeneratedValues {
    held: Mutex<HashMap<String, Held>>,
}

impl GeneratedValues {
    fn held(&self) -> MutexGuard<'_, HashMap<String, Held>> {
        // Every write leaves whole entries: a poisoned map is still consistent.
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The values `object` pushes now, generated when due (`every`: [`interval`]).
    /// `may_write`: this replica leads and is no dry run (a generation is a write: a
    /// credential and its state).
    #[allow(clippy::too_many_arguments)]
    pub async fn values(
        &self,
        gens: &PushGenerators,
        catalog: &dyn Catalog,
        object: &PushSecret,
        reference: &GeneratorRef,
        previous: Reached<'_>,
        every: Option<Duration>,
        may_write: bool,
    ) -> Result<Generated, Failed> {
        let uid = object.uid().unwrap_or_default();
        let now = SystemTime::now();
        {
            let held = self.held();
            if let Some(h) = held.get(&uid).filter(|h| h.generator == *reference) {
                let due = due_in(h.at, every, now);
                if !h.complete || due != Some(Duration::ZERO) {
                    return Ok(Generated::Values(h.values.clone(), due));
                }
            }
        }
        if !self.held().contains_key(&uid)
            && let Some(due) =
                last_generation(gens, object, reference, previous, every, now).await?
            && due != Some(Duration::ZERO)
        {
            return Ok(Generated::Quiet(due));
        }
        if !may_write {
            return Err((
                "NotLeading",
                "not generating: this replica does not write (not leading, or a dry run)".into(),
            ));
        }
        let (made, values) = self.generate(gens, catalog, object, reference).await?;
        if let Some(missing) = missing_key(object, &values) {
            if let Some(made) = made {
                gens.states.discard(vec![made]).await;
            }
            return Err(("MissingKey", missing));
        }
        let mut held = self.held();
        if held.len() >= MAX_HELD && !held.contains_key(&uid) {
            let oldest = held
                .iter()
                .min_by_key(|(_, h)| h.at)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                held.remove(&oldest);
            }
        }
        let entry = Held {
            generator: reference.clone(),
            values: values.clone(),
            made,
            at: now,
            stores: BTreeSet::new(),
            complete: false,
        };
        // A value replaced before every store took it keeps its state: it retires with the
        // others once the new one is everywhere.
        held.insert(uid, entry);
        Ok(Generated::Values(values, every))
    }

    /// Runs the generator as the PushSecret's service account.
    async fn generate(
        &self,
        gens: &PushGenerators,
        catalog: &dyn Catalog,
        object: &PushSecret,
        reference: &GeneratorRef,
    ) -> Result<(Option<Made>, BTreeMap<String, SecretBytes>), Failed> {
        let namespace = object.namespace().unwrap_or_default();
        let name = object.name_any();
        let service_account = object.service_account();
        let who = format!("PushSecret {namespace}/{name}, generator {reference}");
        let bound = bind_generator(catalog, &namespace, &name, reference)
            .await
            .map_err(|e| ("GeneratorUnavailable", format!("{who}: {}", binding(&e))))?;
        let unavailable = |e: &dyn std::fmt::Display| ("SourceUnavailable", format!("{who}: {e}"));
        // A password needs no token, so the minter alone would not ask: the opt-in is checked
        // for every generation.
        gens.minter
            .opted_in(&namespace, service_account)
            .await
            .map_err(|e| unavailable(&e))?;
        let pair = [(reference.clone(), bound)];
        let audiences =
            generated::audiences(&pair, gens.allow_agent_identity).map_err(|e| unavailable(&e))?;
        let tokens = gens
            .minter
            .tokens(&namespace, service_account, &audiences)
            .await
            .map_err(|e| unavailable(&e))?;
        let identity = PodInfo {
            namespace: namespace.clone(),
            name: name.clone(),
            uid: String::new(),
            service_account: service_account.to_string(),
            tokens,
        };
        let owned = object.spec.deletion_policy == PushDeletionPolicy::Delete;
        let holder = Holder {
            owner: owned.then(|| owner(object)),
            namespace,
            name,
            label: LABEL_PUSH_SECRET,
            always_record: true,
        };
        let [(_, bound)] = pair;
        let made = gens
            .states
            .generate_for(&gens.env, &holder, &identity, reference, &bound, &who)
            .await
            .map_err(|e| ("GeneratorFailed", e))?;
        debug!(push_secret = %holder.name, namespace = %holder.namespace, generator = %reference,
            "generated a new value to push");
        Ok(made)
    }

    /// After a push of `object`'s held value to the stores `wanted` (those written now):
    /// `delivered` are the stores that hold it now.
    /// Once every store does, its state says so and earlier states retire; a value no store
    /// took is cleaned up.
    pub async fn settle(
        &self,
        gens: &PushGenerators,
        object: &PushSecret,
        wanted: &BTreeSet<String>,
        delivered: BTreeSet<String>,
    ) {
        let uid = object.uid().unwrap_or_default();
        enum Next {
            Wait,
            Discard(Option<Made>),
            Complete(Option<(String, String)>),
        }
        let next = {
            let mut held = self.held();
            match held.get_mut(&uid) {
                None => return,
                Some(h) if h.complete => return,
                Some(h) => {
                    h.stores.extend(delivered);
                    if h.stores.is_empty() {
                        Next::Discard(held.remove(&uid).and_then(|h| h.made))
                    } else if h.stores.is_superset(wanted) {
                        h.complete = true;
                        let state = h.made.as_ref().map(Made::state);
                        Next::Complete(state.map(|(ns, name)| (ns.to_string(), name.to_string())))
                    } else {
                        Next::Wait
                    }
                }
            }
        };
        let state = match next {
            Next::Wait => return,
            Next::Discard(made) => {
                gens.states.discard(made.into_iter().collect()).await;
                return;
            }
            Next::Complete(state) => state,
        };
        if let Some((ns, name)) = &state {
            let when = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
            if let Err(e) = gens
                .states
                .states
                .annotate(ns, name, ANNOTATION_PUSHED, &when)
                .await
            {
                // Unmarked, a restart generates anew: a new value everywhere, never a stale one.
                warn!(namespace = %ns, state = %name, error = %e,
                    "cannot mark a GeneratorState as pushed to every store");
            }
        }
        let holder = Holder {
            namespace: object.namespace().unwrap_or_default(),
            name: object.name_any(),
            label: LABEL_PUSH_SECRET,
            owner: None,
            always_record: true,
        };
        let keep: Vec<(&str, &str)> = state
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        gens.states.retire_except(&holder, &keep).await;
    }

    /// `object` is going: its value is forgotten.
    pub fn forget(&self, object: &PushSecret) {
        self.held().remove(&object.uid().unwrap_or_default());
    }
}

/// When the next generation is due after restart, from the newest state: `None` when a new
/// value is needed now (no state, one whose push did not finish, another generator, or a
/// store or remote key of the spec that the status does not list: this process has no value
/// for it); `Some(due)` otherwise. States that cannot be listed are a failure, retried: a
/// restart must not make a new value because the API server was briefly away.
async fn last_generation(
    gens: &PushGenerators,
    object: &PushSecret,
    reference: &GeneratorRef,
    previous: Reached<'_>,
    every: Option<Duration>,
    now: SystemTime,
) -> Result<Option<Option<Duration>>, Failed> {
    let namespace = object.namespace().unwrap_or_default();
    let selector = format!("{LABEL_PUSH_SECRET}={}", label_value(&object.name_any()));
    let states = gens.states.states.list(&selector).await.map_err(|e| {
        let who = format!("PushSecret {namespace}/{}", object.name_any());
        (
            "StateUnavailable",
            format!("{who}: its GeneratorStates: {e}"),
        )
    })?;
    Ok(newest_due(
        states, &namespace, reference, object, previous, every, now,
    ))
}

/// [`last_generation`] over the states listed.
fn newest_due(
    states: Vec<GeneratorState>,
    namespace: &str,
    reference: &GeneratorRef,
    object: &PushSecret,
    previous: Reached<'_>,
    every: Option<Duration>,
    now: SystemTime,
) -> Option<Option<Duration>> {
    let newest = states
        .into_iter()
        .filter(|s| {
            s.namespace().as_deref() == Some(namespace)
                && s.spec.garbage_collection_deadline.is_none()
                && s.metadata.deletion_timestamp.is_none()
        })
        .max_by_key(|s| s.metadata.creation_timestamp.as_ref().map(|t| t.0))?;
    let generator = label_value(&format!("{}.{}", reference.kind, reference.name));
    if !newest.annotations().contains_key(ANNOTATION_PUSHED)
        || newest.labels().get(LABEL_GENERATOR) != Some(&generator)
        || !covered(object, previous)
    {
        return None;
    }
    let created = newest.metadata.creation_timestamp.as_ref()?.0;
    Some(due_in(SystemTime::from(created), every, now))
}

/// What earlier pushes reached: the status, and the stores the PushSecret writes now (its
/// named stores and those its selectors pick).
#[derive(Clone, Copy)]
pub struct Reached<'a> {
    /// The PushSecret's status before this reconcile.
    pub status: &'a PushSecretStatus,
    /// `Kind/name` of every store written now (their keys in `syncedPushSecrets`).
    pub stores: &'a BTreeSet<String>,
}

/// Whether the status lists every remote key of the spec in every store written now.
fn covered(object: &PushSecret, previous: Reached<'_>) -> bool {
    previous.stores.iter().all(|store| {
        previous
            .status
            .synced_push_secrets
            .get(store)
            .is_some_and(|remotes| {
                object
                    .spec
                    .data
                    .iter()
                    .all(|d| remotes.contains_key(&d.match_.remote_ref.remote_key))
            })
    })
}

/// How often a new value is generated: `refreshInterval`, else `default`, at least `floor`
/// (the controller's refresh rules); `None` for `0`: never again.
pub fn interval(object: &PushSecret, default: Duration, floor: Duration) -> Option<Duration> {
    match object
        .spec
        .refresh_interval
        .as_deref()
        .map(crate::api::duration::parse)
    {
        None | Some(None) => Some(default),
        Some(Some(d)) if d.is_zero() => None,
        Some(Some(d)) => Some(d.max(floor)),
    }
}

/// Time until a value made `at` is due for renewal (zero: due), `None`: never.
fn due_in(at: SystemTime, every: Option<Duration>, now: SystemTime) -> Option<Duration> {
    let every = every?;
    let age = now.duration_since(at).unwrap_or_default();
    Some(every.saturating_sub(age))
}

/// The first `data[].match.secretKey` the generator's output lacks, as a message naming keys
/// only.
fn missing_key(object: &PushSecret, values: &BTreeMap<String, SecretBytes>) -> Option<String> {
    let (index, key) = object
        .spec
        .data
        .iter()
        .enumerate()
        .map(|(i, d)| (i, &d.match_.secret_key))
        .find(|(_, k)| !values.contains_key(*k))?;
    let has: Vec<&str> = values.keys().map(String::as_str).collect();
    Some(format!(
        "PushSecret {}/{}: the generator's output has no key {key:?} \
         (spec.data[{index}].match.secretKey); it has {}",
        object.namespace().unwrap_or_default(),
        object.name_any(),
        has.join(", ")
    ))
}

/// The PushSecret as the owner of a state.
fn owner(object: &PushSecret) -> OwnerReference {
    OwnerReference {
        api_version: PushSecret::api_version(&()).into_owned(),
        kind: PushSecret::kind(&()).into_owned(),
        name: object.name_any(),
        uid: object.uid().unwrap_or_default(),
        ..OwnerReference::default()
    }
}

/// A binding failure in a PushSecret's words (the catalog's name the ExternalSecret).
fn binding(e: &BindingError) -> String {
    match e {
        BindingError::GeneratorNotFound { generator, .. } => format!(
            "generator {generator} not found (a generator must be in the PushSecret's \
             namespace; a ClusterGenerator serves several)"
        ),
        BindingError::GeneratorNotAdmitted {
            generator, rule, ..
        } => format!("ClusterGenerator \"{generator}\" does not admit this namespace: {rule}"),
        BindingError::InvalidGenerator { reason, .. } => format!("invalid: {reason}"),
        BindingError::Catalog { source, .. } => source.to_string(),
        other => other.to_string(),
    }
}

#[cfg(test)]
#[path = "generated_tests.rs"]
mod tests;
