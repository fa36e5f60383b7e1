//! Generators in mirrored ExternalSecrets, as ESO design 011 describes: every sync that writes
//! the Secret generates anew, each credential gets its own GeneratorState, and once the new
//! Secret is written the states of earlier credentials get a garbage-collection deadline
//! (`--generator-grace-period` from now), after which they are deleted and their credentials
//! cleaned up (see [`crate::generator_gc`]... by the controller's GeneratorState loop).
//!
//! The identity is the ExternalSecret's service account (the token the mirror minted for it),
//! never the controller's. A state is owned by its ExternalSecret only with `deletionPolicy:
//! Delete`: then deleting the ExternalSecret deletes the Secret and, through Kubernetes' garbage
//! collector and the cleanup finalizer, revokes its credentials; with `Retain` (the default) or
//! `Merge` the Secret outlives the ExternalSecret, so its credentials must stay valid.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Resource, ResourceExt};
use tracing::warn;

use crate::api::ExternalSecret;
use crate::api::external_secret::{DeletionPolicy, GeneratorRef};
use crate::api::generator::{GeneratorObject, GeneratorState};
use crate::catalog::{Catalog, bind_generator};
use crate::generators::states::{self, LABEL_EXTERNAL_SECRET, StateStore, label_value};
use crate::generators::{self, Generator, GeneratorSpec};
use crate::identity::PodInfo;
use crate::providers::{self, BuildContext};
use crate::resolve::{self, Context, Fetched};
use crate::secret::SecretBytes;

use super::consent;

/// One credential made by a sync: its state, and what Cleanup needs if the sync fails.
pub struct Made {
    namespace: String,
    name: String,
    state: Option<serde_json::Value>,
    generator: Arc<dyn Generator>,
}

impl Made {
    /// Namespace and name of its GeneratorState.
    pub fn state(&self) -> (&str, &str) {
        (&self.namespace, &self.name)
    }
}

/// The object credentials are made for (an ExternalSecret, a PushSecret): its GeneratorStates
/// are labelled with it, and owned by it when its deletion is to revoke them.
pub struct Holder {
    /// Its namespace, where the states go.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The label naming it on its states ([`LABEL_EXTERNAL_SECRET`], ...).
    pub label: &'static str,
    /// Set on each state when deleting the holder must clean its credentials up.
    pub owner: Option<OwnerReference>,
    /// Record a state even for a generator with nothing to clean up (a password): its creation
    /// time then tells when the value was made.
    pub always_record: bool,
}

/// How the mirror records and retires generated credentials.
#[derive(Clone)]
pub struct MirrorGenerators {
    /// Where GeneratorStates are recorded.
    pub states: Arc<dyn StateStore>,
    /// How long an earlier credential stays valid once a new Secret is written.
    pub grace: Duration,
    /// Whether states carry the cleanup finalizer (the controller's own loop releases it).
    pub finalizer: bool,
}

/// The generators `es` names, bound with the tenancy rules of the node agent.
pub(super) async fn bind_all(
    catalog: &dyn Catalog,
    es: &ExternalSecret,
) -> Result<Vec<(GeneratorRef, GeneratorObject)>, String> {
    let namespace = es.namespace().unwrap_or_default();
    let name = es.name_any();
    let mut bound = Vec::new();
    for reference in resolve::generator_refs(&es.spec) {
        let object = bind_generator(catalog, &namespace, &name, &reference)
            .await
            .map_err(|e| e.to_string())?;
        bound.push((reference, object));
    }
    Ok(bound)
}

/// The token audiences the generators need, under the rules stores follow.
pub fn audiences(
    bound: &[(GeneratorRef, GeneratorObject)],
    allow_agent_identity: bool,
) -> Result<Vec<String>, String> {
    let mut all = Vec::new();
    for (reference, object) in bound {
        let Some(provider) = GeneratorSpec::of(object).and_then(|s| s.provider()) else {
            continue;
        };
        let scope = GeneratorSpec::scope(object);
        let wanted = consent::audiences(provider, scope, allow_agent_identity)
            .map_err(|e| format!("generator {reference}: {e}"))?;
        all.extend(wanted);
    }
    all.sort();
    all.dedup();
    Ok(all)
}

impl MirrorGenerators {
    /// Generates every bound generator as `identity` and puts the results into `fetched`.
    /// What was made before a failure is cleaned up again.
    pub(super) async fn generate(
        &self,
        env: &providers::Env,
        cx: &Context,
        es: &ExternalSecret,
        identity: &PodInfo,
        bound: Vec<(GeneratorRef, GeneratorObject)>,
        fetched: &mut Fetched,
    ) -> Result<Vec<Made>, String> {
        let mut made = Vec::new();
        for (reference, object) in bound {
            match self
                .generate_one(env, cx, es, identity, &reference, &object)
                .await
            {
                Ok((one, values)) => {
                    made.extend(one);
                    fetched.insert_generated(reference, Arc::new(values));
                }
                Err(e) => {
                    self.discard(made).await;
                    return Err(e);
                }
            }
        }
        Ok(made)
    }

    async fn generate_one(
        &self,
        env: &providers::Env,
        cx: &Context,
        es: &ExternalSecret,
        identity: &PodInfo,
        reference: &GeneratorRef,
        object: &GeneratorObject,
    ) -> Result<(Option<Made>, BTreeMap<String, SecretBytes>), String> {
        let who = format!("{cx}, generator {reference}");
        self.generate_for(env, &holder(es), identity, reference, object, &who)
            .await
    }

    /// Generates `object` as `identity` for `holder`, recording its GeneratorState first (the
    /// intent) and what Cleanup needs right after. Errors start with `who`.
    pub async fn generate_for(
        &self,
        env: &providers::Env,
        holder: &Holder,
        identity: &PodInfo,
        reference: &GeneratorRef,
        object: &GeneratorObject,
        who: &str,
    ) -> Result<(Option<Made>, BTreeMap<String, SecretBytes>), String> {
        let failed = |e: &dyn std::fmt::Display| format!("{who}: {e}");
        let spec = GeneratorSpec::of(object)
            .ok_or_else(|| failed(&"the generator sets no block for its kind"))?;
        let ctx = BuildContext {
            env,
            pod: identity,
            scope: GeneratorSpec::scope(object).into(),
            max_age: None,
        };
        let generator = generators::build(spec, &ctx)
            .await
            .map_err(|e| failed(&e))?;
        if spec.is_stateless() && !holder.always_record {
            let made = generator.generate().await.map_err(|e| failed(&e))?;
            return Ok((None, made.values));
        }
        let state = self.intent(holder, identity, reference, object);
        let created = self.states.create(&state).await.map_err(|e| failed(&e))?;
        let (namespace, name) = (created.namespace().unwrap_or_default(), created.name_any());
        let made = match generator.generate().await {
            Ok(made) => made,
            Err(e) => {
                self.drop_state(&namespace, &name).await;
                return Err(failed(&e));
            }
        };
        if let Some(state) = &made.state
            && let Err(e) = self.states.record(&namespace, &name, state).await
        {
            // Not recorded means nobody could clean it up later: undo it now.
            if let Err(err) = generator.cleanup(state).await {
                warn!(%namespace, state = %name, generator = %reference, error = %err,
                    "cannot clean up a credential whose state was not recorded; it ends with \
                     its TTL");
            }
            self.drop_state(&namespace, &name).await;
            return Err(failed(&e));
        }
        Ok((
            Some(Made {
                namespace,
                name,
                state: made.state,
                generator,
            }),
            made.values,
        ))
    }

    /// The sync that generated `made` did not write its Secret: they are cleaned up now.
    pub async fn discard(&self, made: Vec<Made>) {
        for m in made {
            if let Some(state) = &m.state
                && let Err(e) = m.generator.cleanup(state).await
            {
                warn!(namespace = %m.namespace, state = %m.name, error = %e,
                    "cannot clean up a credential of a failed sync; its state is kept for the \
                     controller to retry");
                // Kept: a deadline makes the controller's loop clean it up later.
                let _ = self
                    .states
                    .set_deadline(&m.namespace, &m.name, &deadline(Duration::ZERO))
                    .await;
                continue;
            }
            self.drop_state(&m.namespace, &m.name).await;
        }
    }

    /// The Secret with the credentials `made` was written: every other state of the
    /// ExternalSecret without a deadline gets one, `grace` from now.
    pub(super) async fn retire_older(&self, es: &ExternalSecret, made: &[Made]) {
        let keep: Vec<(&str, &str)> = made.iter().map(Made::state).collect();
        self.retire_except(&holder(es), &keep).await;
    }

    /// `holder` now uses the credentials whose states are `keep` (namespace, name): every
    /// other state of it without a deadline gets one, `grace` from now.
    pub async fn retire_except(&self, holder: &Holder, keep: &[(&str, &str)]) {
        let namespace = &holder.namespace;
        let selector = format!("{}={}", holder.label, label_value(&holder.name));
        let states = match self.states.list(&selector).await {
            Ok(s) => s,
            Err(e) => {
                warn!(%namespace, holder = %holder.name, error = %e,
                    "cannot list the GeneratorStates of earlier syncs; retrying next sync");
                return;
            }
        };
        let when = deadline(self.grace);
        for s in states {
            let (ns, name) = (s.namespace().unwrap_or_default(), s.name_any());
            let current = keep.iter().any(|(n, m)| *n == ns && *m == name);
            // Only states of this holder (a name can repeat in other namespaces), and only
            // ones not already counting down: a newer credential is never retired.
            if ns != *namespace || current || s.spec.garbage_collection_deadline.is_some() {
                continue;
            }
            if s.metadata.deletion_timestamp.is_some() {
                continue;
            }
            if let Err(e) = self.states.set_deadline(&ns, &name, &when).await {
                warn!(namespace = %ns, state = %name, error = %e,
                    "cannot set the garbage-collection deadline of an earlier credential");
            }
        }
    }

    async fn drop_state(&self, namespace: &str, name: &str) {
        if let Err(e) = self.states.remove(namespace, name).await {
            warn!(%namespace, state = %name, error = %e, "cannot remove a GeneratorState");
        }
    }

    /// The GeneratorState recorded before Generate runs for `holder`.
    fn intent(
        &self,
        holder: &Holder,
        identity: &PodInfo,
        reference: &GeneratorRef,
        object: &GeneratorObject,
    ) -> GeneratorState {
        let mut state = states::intent_for(
            &holder.namespace,
            &holder.name,
            reference,
            object,
            &identity.service_account,
            (holder.label, &holder.name),
            self.finalizer,
        );
        state.metadata.owner_references = holder.owner.clone().map(|o| vec![o]);
        state
    }
}

/// A mirrored ExternalSecret as the holder of its credentials: their owner only with
/// `deletionPolicy: Delete` (see the module's doc).
fn holder(es: &ExternalSecret) -> Holder {
    let name = es.name_any();
    let owned =
        es.spec.target.as_ref().and_then(|t| t.deletion_policy) == Some(DeletionPolicy::Delete);
    let owner = owned.then(|| OwnerReference {
        api_version: ExternalSecret::api_version(&()).into_owned(),
        kind: ExternalSecret::kind(&()).into_owned(),
        name: name.clone(),
        uid: es.metadata.uid.clone().unwrap_or_default(),
        ..OwnerReference::default()
    });
    Holder {
        namespace: es.namespace().unwrap_or_default(),
        name,
        label: LABEL_EXTERNAL_SECRET,
        owner,
        always_record: false,
    }
}

/// RFC 3339 time `after` from now.
fn deadline(after: Duration) -> String {
    let at = std::time::SystemTime::now() + after;
    humantime::format_rfc3339_seconds(at).to_string()
}
