//! What an ExternalSecret's status says after a reconcile: the `Ready` condition with a reason
//! per outcome (ESO's names where they exist), and when it must be written. Pure: no API calls.
//! Messages are the errors' texts, which name objects and keys, never values.

use k8s_openapi::jiff::Timestamp;

use crate::api::external_secret::{Condition, ExternalSecretStatus, SecretBinding};

/// How a reconcile ended, as the `Ready` condition's reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The Secret holds the current values.
    SecretSynced,
    /// The values could not be read (store missing or not admitted, backend failing, token
    /// refused); the Secret is kept as it was.
    SecretSyncedError,
    /// A Secret of the target name exists and is not this ExternalSecret's.
    SecretConflict,
    /// The remote value is gone and `deletionPolicy` removed the Secret or its keys.
    SecretDeleted,
    /// `creationPolicy: Merge` and the Secret to merge into does not exist.
    SecretMissing,
    /// A template failed or its output is not a valid Secret.
    TemplateError,
    /// The target name is not a valid Secret name, or an entry not a valid Secret key.
    InvalidTarget,
    /// The data is larger than a Secret may hold.
    SecretTooLarge,
    /// The Secret is immutable and the values changed.
    SecretImmutable,
    /// The ExternalSecret does not match the schema this controller reads.
    InvalidExternalSecret,
}

impl Reason {
    /// The reason as written in the condition and in Events.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::SecretSynced => "SecretSynced",
            Reason::SecretSyncedError => "SecretSyncedError",
            Reason::SecretConflict => "SecretConflict",
            Reason::SecretDeleted => "SecretDeleted",
            Reason::SecretMissing => "SecretMissing",
            Reason::TemplateError => "TemplateError",
            Reason::InvalidTarget => "InvalidTarget",
            Reason::SecretTooLarge => "SecretTooLarge",
            Reason::SecretImmutable => "SecretImmutable",
            Reason::InvalidExternalSecret => "InvalidExternalSecret",
        }
    }

    /// Whether the Secret is up to date.
    pub fn is_ready(self) -> bool {
        self == Reason::SecretSynced
    }
}

/// The outcome to record on the ExternalSecret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The `Ready` reason.
    pub reason: Reason,
    /// Human-readable detail (no values).
    pub message: String,
    /// Whether the values were read for this reconcile (sets `refreshTime`).
    pub refreshed: bool,
    /// The generation the Secret now reflects (set on success).
    pub synced_generation: Option<i64>,
    /// The mirrored Secret's name.
    pub secret: String,
}

/// The status to write, or `None` when `current` already says the same (nothing to write:
/// every status write is a watch event for every watcher of ExternalSecrets).
pub fn next(
    current: Option<&ExternalSecretStatus>,
    outcome: &Outcome,
) -> Option<ExternalSecretStatus> {
    let now = Timestamp::now().to_string();
    let status = if outcome.reason.is_ready() {
        "True"
    } else {
        "False"
    };
    let (conditions, same_condition) = with_ready(
        current.map_or(&[][..], |s| &s.conditions[..]),
        status,
        outcome.reason.as_str(),
        &outcome.message,
    );
    let synced = outcome
        .synced_generation
        .map(|g| g.to_string())
        .or_else(|| current.and_then(|s| s.synced_resource_version.clone()));
    let binding = Some(SecretBinding {
        name: outcome.secret.clone(),
    });
    let unchanged = same_condition
        && !outcome.refreshed
        && current.is_some_and(|s| s.synced_resource_version == synced && s.binding == binding);
    if unchanged {
        return None;
    }
    Some(ExternalSecretStatus {
        conditions,
        refresh_time: if outcome.refreshed {
            Some(now)
        } else {
            current.and_then(|s| s.refresh_time.clone())
        },
        synced_resource_version: synced,
        binding,
    })
}

/// `conditions` with their `Ready` condition set to `status`, `reason` and `message`, and whether
/// it already said exactly that. The transition time moves only when `status` changes.
pub fn with_ready(
    conditions: &[Condition],
    status: &str,
    reason: &str,
    message: &str,
) -> (Vec<Condition>, bool) {
    let previous = conditions.iter().find(|c| c.type_ == "Ready");
    let same = previous.is_some_and(|c| {
        c.status == status
            && c.reason.as_deref() == Some(reason)
            && c.message.as_deref() == Some(message)
    });
    let transition = previous
        .filter(|c| c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| Timestamp::now().to_string());
    let mut out: Vec<Condition> = conditions
        .iter()
        .filter(|c| c.type_ != "Ready")
        .cloned()
        .collect();
    out.push(Condition {
        type_: "Ready".into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_transition_time: Some(transition),
    });
    (out, same)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/troubleshooting.md explains every condition (and Event) reason. A new variant is a
    /// compile error in the match below: add it to both lists, and to the doc.
    #[test]
    fn every_reason_is_documented() {
        let doc = include_str!("../../../docs/troubleshooting.md");
        let all = [
            Reason::SecretSynced,
            Reason::SecretSyncedError,
            Reason::SecretConflict,
            Reason::SecretDeleted,
            Reason::SecretMissing,
            Reason::TemplateError,
            Reason::InvalidTarget,
            Reason::SecretTooLarge,
            Reason::SecretImmutable,
            Reason::InvalidExternalSecret,
        ];
        for reason in all {
            match reason {
                Reason::SecretSynced
                | Reason::SecretSyncedError
                | Reason::SecretConflict
                | Reason::SecretDeleted
                | Reason::SecretMissing
                | Reason::TemplateError
                | Reason::InvalidTarget
                | Reason::SecretTooLarge
                | Reason::SecretImmutable
                | Reason::InvalidExternalSecret => {}
            }
            let row = format!("| `{}` |", reason.as_str());
            assert!(doc.contains(&row), "{} is not documented", reason.as_str());
        }
    }

    fn outcome(reason: Reason, refreshed: bool) -> Outcome {
        Outcome {
            reason,
            message: format!("{} message", reason.as_str()),
            refreshed,
            synced_generation: reason.is_ready().then_some(3),
            secret: "db".into(),
        }
    }

    #[test]
    fn a_repeated_outcome_writes_nothing() {
        let first = next(None, &outcome(Reason::SecretSynced, true)).unwrap();
        assert_eq!(first.conditions[0].status, "True");
        assert_eq!(first.synced_resource_version.as_deref(), Some("3"));
        assert_eq!(first.binding.as_ref().unwrap().name, "db");
        assert!(first.refresh_time.is_some());
        assert_eq!(
            next(Some(&first), &outcome(Reason::SecretSynced, false)),
            None
        );
    }

    #[test]
    fn a_failure_keeps_what_was_synced_and_moves_the_transition_time() {
        let ok = next(None, &outcome(Reason::SecretSynced, true)).unwrap();
        let failed = next(Some(&ok), &outcome(Reason::SecretSyncedError, false)).unwrap();
        let ready = &failed.conditions[0];
        assert_eq!(ready.status, "False");
        assert_eq!(ready.reason.as_deref(), Some("SecretSyncedError"));
        assert_eq!(failed.synced_resource_version.as_deref(), Some("3"));
        assert_eq!(failed.refresh_time, ok.refresh_time);
        let again = next(Some(&failed), &outcome(Reason::SecretSyncedError, false));
        assert_eq!(again, None);
    }
}
