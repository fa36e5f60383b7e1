//! `spec.provider.kubernetes`: a remote server's URL and CA, the audience its token is for, and
//! the namespace read.

use super::fields::{not_empty, secret_name, shaped};
use super::{Invalid, ca_provider};
use crate::api::rules;
use crate::api::store::KubernetesProvider;

/// `spec.provider.kubernetes`: with `server`, an https URL, exactly one CA source and either an
/// audience other than the API server's or `auth`; `auth` only with `server`; `remoteNamespace`
/// a namespace name.
pub fn kubernetes(k: &KubernetesProvider) -> Result<(), Invalid> {
    const AT: &str = "spec.provider.kubernetes";
    if let Some(ns) = &k.remote_namespace {
        shaped(
            format_args!("{AT}.remoteNamespace"),
            ns,
            rules::MAX_NAMESPACE_LEN,
            &rules::DNS_LABEL,
        )?;
    }
    if let Some(auth) = &k.auth {
        secret_name(
            format_args!("{AT}.auth.token.bearerToken"),
            &auth.token.bearer_token,
        )?;
    }
    let Some(server) = &k.server else {
        if k.auth.is_some() {
            return Err(Invalid::rule(AT, &rules::KUBERNETES_AUTH_NEEDS_SERVER));
        }
        return Ok(());
    };
    let pod_token = k.audience.as_deref().is_some_and(|a| !a.is_empty());
    let one = match &k.auth {
        Some(_) => k.audience.is_none(),
        None => pod_token,
    };
    if !one {
        return Err(Invalid::rule(AT, &rules::KUBERNETES_SERVER_AUDIENCE));
    }
    shaped(
        format_args!("{AT}.server.url"),
        &server.url,
        rules::MAX_SERVER_URL_LEN,
        &rules::HTTPS_URL,
    )?;
    match (&server.ca_bundle, &server.ca_provider) {
        (Some(bundle), None) => {
            let path = format_args!("{AT}.server.caBundle");
            if bundle.chars().count() > rules::MAX_CA_BUNDLE_LEN {
                return Err(Invalid::schema(
                    path,
                    rules::too_long(rules::MAX_CA_BUNDLE_LEN),
                ));
            }
            not_empty(path, bundle.trim())
        }
        (None, Some(ca)) => ca_provider(format_args!("{AT}.server.caProvider"), ca),
        _ => Err(Invalid::rule(
            format_args!("{AT}.server"),
            &rules::KUBERNETES_SERVER_ONE_CA,
        )),
    }
}
