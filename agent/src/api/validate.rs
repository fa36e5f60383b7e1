//! Agent-side validation of objects read from the catalog. The CRD schema carries the same rules,
//! but a CRD rule is not a security boundary: every object is re-checked before use.

use super::external_secret::{CreationPolicy, DeletionPolicy, ExternalSecretSpec};
use super::store::StoreProvider;

/// Why an object was rejected; the text names the field and never contains values.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct Invalid(pub String);

/// The provider a store selects, borrowed from its spec.
#[derive(Debug, Clone, Copy)]
pub enum ProviderSpec<'a> {
    /// `provider.aws`
    Aws(&'a super::store::AwsProvider),
    /// `provider.vault`
    Vault(&'a super::store::VaultProvider),
    /// `provider.kubernetes`
    Kubernetes(&'a super::store::KubernetesProvider),
    /// `provider.fake`
    Fake(&'a super::store::FakeProvider),
}

impl ProviderSpec<'_> {
    /// The provider's name as written in the store.
    pub fn name(&self) -> &'static str {
        match self {
            ProviderSpec::Aws(_) => "aws",
            ProviderSpec::Vault(_) => "vault",
            ProviderSpec::Kubernetes(_) => "kubernetes",
            ProviderSpec::Fake(_) => "fake",
        }
    }
}

/// Checks that exactly one provider block is set and returns it.
pub fn provider(p: &StoreProvider) -> Result<ProviderSpec<'_>, Invalid> {
    let mut set = Vec::new();
    if let Some(a) = &p.aws {
        set.push(ProviderSpec::Aws(a));
    }
    if let Some(v) = &p.vault {
        set.push(ProviderSpec::Vault(v));
    }
    if let Some(k) = &p.kubernetes {
        set.push(ProviderSpec::Kubernetes(k));
    }
    if let Some(f) = &p.fake {
        set.push(ProviderSpec::Fake(f));
    }
    match set.as_slice() {
        [one] => Ok(*one),
        [] => Err(Invalid(
            "spec.provider must set exactly one of aws, vault, kubernetes, fake (none is set)"
                .into(),
        )),
        many => Err(Invalid(format!(
            "spec.provider must set exactly one of aws, vault, kubernetes, fake (found {})",
            many.iter().map(|p| p.name()).collect::<Vec<_>>().join(", ")
        ))),
    }
}

/// Checks an ExternalSecret spec for the rules the CRD schema also enforces.
pub fn external_secret(spec: &ExternalSecretSpec) -> Result<(), Invalid> {
    if spec.secret_store_ref.name.is_empty() {
        return Err(Invalid("spec.secretStoreRef.name must not be empty".into()));
    }
    if spec.data.is_empty() && spec.data_from.is_empty() {
        return Err(Invalid(
            "spec.data or spec.dataFrom must have at least one entry".into(),
        ));
    }
    for (i, d) in spec.data.iter().enumerate() {
        if d.secret_key.is_empty() {
            return Err(Invalid(format!(
                "spec.data[{i}].secretKey must not be empty"
            )));
        }
        if d.remote_ref.key.is_empty() {
            return Err(Invalid(format!(
                "spec.data[{i}].remoteRef.key must not be empty"
            )));
        }
    }
    for (i, d) in spec.data_from.iter().enumerate() {
        match (&d.extract, &d.find) {
            (Some(e), None) if e.key.is_empty() => {
                return Err(Invalid(format!(
                    "spec.dataFrom[{i}].extract.key must not be empty"
                )));
            }
            (Some(_), None) => {}
            (None, Some(f)) if f.name.is_none() && f.path.is_none() => {
                return Err(Invalid(format!(
                    "spec.dataFrom[{i}].find needs name or path"
                )));
            }
            (None, Some(_)) => {}
            _ => {
                return Err(Invalid(format!(
                    "spec.dataFrom[{i}] must set exactly one of extract, find"
                )));
            }
        }
    }
    if let Some(t) = &spec.target
        && t.deletion_policy == Some(DeletionPolicy::Delete)
        && t.creation_policy != Some(CreationPolicy::Owner)
    {
        return Err(Invalid(
            "spec.target.deletionPolicy Delete requires creationPolicy Owner".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::external_secret::*;
    use crate::api::store::*;

    fn es() -> ExternalSecretSpec {
        ExternalSecretSpec {
            secret_store_ref: SecretStoreRef {
                name: "s".into(),
                kind: StoreKind::SecretStore,
            },
            refresh_interval: None,
            data: vec![ExternalSecretData {
                secret_key: "k".into(),
                remote_ref: RemoteRef {
                    key: "r".into(),
                    ..Default::default()
                },
            }],
            data_from: vec![],
            target: None,
            service_account_name: None,
        }
    }

    #[test]
    fn accepts_a_plain_spec() {
        assert_eq!(external_secret(&es()), Ok(()));
    }

    #[test]
    fn rejects_each_broken_rule() {
        let mut s = es();
        s.data.clear();
        assert!(external_secret(&s).unwrap_err().0.contains("at least one"));

        let mut s = es();
        s.data[0].secret_key.clear();
        assert!(
            external_secret(&s)
                .unwrap_err()
                .0
                .contains("data[0].secretKey")
        );

        let mut s = es();
        s.data_from.push(DataFrom {
            extract: Some(RemoteRef {
                key: "a".into(),
                ..Default::default()
            }),
            find: Some(FindRef::default()),
            rewrite: vec![],
        });
        assert!(
            external_secret(&s)
                .unwrap_err()
                .0
                .contains("exactly one of extract, find")
        );

        let mut s = es();
        s.target = Some(Target {
            deletion_policy: Some(DeletionPolicy::Delete),
            ..Default::default()
        });
        assert!(
            external_secret(&s)
                .unwrap_err()
                .0
                .contains("requires creationPolicy Owner")
        );
    }

    #[test]
    fn provider_must_be_exactly_one() {
        assert!(
            provider(&StoreProvider::default())
                .unwrap_err()
                .0
                .contains("none is set")
        );
        let both = StoreProvider {
            fake: Some(FakeProvider::default()),
            kubernetes: Some(KubernetesProvider::default()),
            ..Default::default()
        };
        assert!(provider(&both).unwrap_err().0.contains("kubernetes, fake"));
        let one = StoreProvider {
            fake: Some(FakeProvider::default()),
            ..Default::default()
        };
        assert_eq!(provider(&one).unwrap().name(), "fake");
    }
}
