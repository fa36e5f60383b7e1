//! `spec.provider.kubernetes`: a remote `server` (https URL, exactly one CA source, an audience
//! of its own) and `remoteNamespace` (a namespace name), each rule broken by a sample.

use serde_json::{Value, json};

use super::{Expect, rejected};
use crate::api::rules::{DNS_LABEL, HTTPS_URL, MAX_CA_BUNDLE_LEN, MAX_SERVER_URL_LEN, too_long};

/// (name, `spec.provider` merge patch over the fake provider, expected verdict).
pub(super) fn provider_samples() -> Vec<(&'static str, Value, Expect)> {
    const AT: &str = "spec.provider.kubernetes";
    let ca = json!({"type": "ConfigMap", "name": "remote-ca", "key": "ca.crt"});
    let remote = |server: Value| json!({"fake": null, "kubernetes": {"audience": "prod-cluster", "server": server}});
    let one_ca = rejected(format!(
        "{AT}.server: must set exactly one of caBundle, caProvider"
    ));
    let bad_url = rejected(format!("{AT}.server.url: {}", HTTPS_URL.message));
    let no_audience = rejected(format!(
        "{AT}: server needs exactly one of audience and auth: the pod's token for this \
         cluster's own API server never leaves it"
    ));
    let token = json!({"token": {"bearerToken": {"name": "remote-token", "key": "token"}}});
    vec![
        (
            "kubernetes on a remote server with a stored token",
            json!({"fake": null, "kubernetes": {
                "auth": token,
                "server": {"url": "https://k8s.prod.example", "caProvider": ca},
            }}),
            Expect::Valid,
        ),
        (
            "kubernetes on a remote server with a stored token and an audience",
            json!({"fake": null, "kubernetes": {
                "auth": token, "audience": "prod-cluster",
                "server": {"url": "https://k8s.prod.example", "caProvider": ca},
            }}),
            no_audience.clone(),
        ),
        (
            "kubernetes of this cluster with a stored token",
            json!({"fake": null, "kubernetes": {"auth": token}}),
            rejected(format!(
                "{AT}: auth is only for a remote server; this cluster's Secrets are read with \
                 the pod's own token"
            )),
        ),
        (
            "kubernetes token in a badly named Secret",
            json!({"fake": null, "kubernetes": {
                "auth": {"token": {"bearerToken": {"name": "-x", "key": "token"}}},
                "server": {"url": "https://k8s.prod.example", "caProvider": ca},
            }}),
            rejected(format!(
                "{AT}.auth.token.bearerToken.name: {}",
                crate::api::rules::DNS_SUBDOMAIN.message
            )),
        ),
        (
            "kubernetes of another namespace",
            json!({"fake": null, "kubernetes": {"remoteNamespace": "shared-secrets"}}),
            Expect::Valid,
        ),
        (
            "kubernetes of a namespace that is no label",
            json!({"fake": null, "kubernetes": {"remoteNamespace": "shared.secrets"}}),
            rejected(format!("{AT}.remoteNamespace: {}", DNS_LABEL.message)),
        ),
        (
            "kubernetes of a namespace name too long",
            json!({"fake": null, "kubernetes": {"remoteNamespace": "a".repeat(64)}}),
            rejected(format!("{AT}.remoteNamespace: {}", too_long(63))),
        ),
        (
            "kubernetes on a remote server, CA from a ConfigMap",
            remote(json!({"url": "https://k8s.prod.example:6443", "caProvider": ca})),
            Expect::Valid,
        ),
        (
            "kubernetes on a remote server, inline CA, IPv6 and a path",
            remote(json!({
                "url": "https://[fd00::1]:6443/k8s/clusters/c-1",
                "caBundle": "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0t",
            })),
            Expect::Valid,
        ),
        (
            "kubernetes on a remote server without an audience",
            json!({"fake": null, "kubernetes": {
                "server": {"url": "https://k8s.prod.example", "caProvider": ca},
            }}),
            no_audience.clone(),
        ),
        (
            "kubernetes on a remote server with an empty audience",
            json!({"fake": null, "kubernetes": {
                "audience": "",
                "server": {"url": "https://k8s.prod.example", "caProvider": ca},
            }}),
            no_audience.clone(),
        ),
        (
            "kubernetes on a remote server over plain http",
            remote(json!({"url": "http://k8s.prod.example", "caProvider": ca})),
            bad_url.clone(),
        ),
        (
            "kubernetes on a remote server with credentials in the URL",
            remote(json!({"url": "https://admin:pw@k8s.prod.example", "caProvider": ca})),
            bad_url.clone(),
        ),
        (
            "kubernetes on a remote server with a query",
            remote(json!({"url": "https://k8s.prod.example/?insecure=1", "caProvider": ca})),
            bad_url,
        ),
        (
            "kubernetes on a remote server whose URL is too long",
            remote(json!({
                "url": format!("https://{}.example", "a".repeat(MAX_SERVER_URL_LEN)),
                "caProvider": ca,
            })),
            rejected(format!("{AT}.server.url: {}", too_long(MAX_SERVER_URL_LEN))),
        ),
        (
            "kubernetes on a remote server with two CA sources",
            remote(json!({
                "url": "https://k8s.prod.example", "caProvider": ca, "caBundle": "LS0t",
            })),
            one_ca.clone(),
        ),
        (
            "kubernetes on a remote server with no CA",
            remote(json!({"url": "https://k8s.prod.example"})),
            one_ca,
        ),
        (
            "kubernetes on a remote server with a CA bundle too long",
            remote(json!({
                "url": "https://k8s.prod.example",
                "caBundle": "A".repeat(MAX_CA_BUNDLE_LEN + 1),
            })),
            rejected(format!(
                "{AT}.server.caBundle: {}",
                too_long(MAX_CA_BUNDLE_LEN)
            )),
        ),
        (
            "kubernetes on a remote server, CA in a badly named ConfigMap",
            remote(json!({
                "url": "https://k8s.prod.example",
                "caProvider": {"type": "ConfigMap", "name": "-x", "key": "ca.crt"},
            })),
            rejected(format!(
                "{AT}.server.caProvider.name: {}",
                crate::api::rules::DNS_SUBDOMAIN.message
            )),
        ),
    ]
}
