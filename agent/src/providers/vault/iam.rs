//! Vault's `aws` auth method, `iam` type (ESO's `auth.iam`): the pod's token is exchanged for
//! temporary credentials of `role` (`sts:AssumeRoleWithWebIdentity`, through the AWS provider's
//! session cache), a `sts:GetCallerIdentity` request is signed with them (SigV4), and Vault
//! replays it to STS to learn who is logging in. The signed request is sent to Vault, never to
//! STS by the agent.
//!
//! Not for the token cache (the caller keys the login by server, namespace, mount, Vault role,
//! pod identity and IAM role) and never given anything to print: the signature, the session
//! token and the request live only in the login body.

use std::collections::BTreeMap;
use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use vaultrs::api::AuthInfo;
use vaultrs::api::auth::aws::requests::IamLoginRequest;

use super::super::{BuildContext, ProviderError};
use super::bad_request;
use super::errors::login_error;
use super::transport::Transport;
use crate::api::store::VaultIamAuth;

/// The body of the signed request (form-encoded, as STS' query protocol takes it).
const BODY: &str = "Action=GetCallerIdentity&Version=2011-06-15";
/// Region signed for when the store names none: STS' global endpoint.
const DEFAULT_REGION: &str = "us-east-1";
/// Mount path when the store names none.
pub(super) const DEFAULT_MOUNT: &str = "aws";

/// The audience of the pod token exchanged for AWS credentials.
pub fn audience(iam: &VaultIamAuth) -> &str {
    iam.jwt
        .as_ref()
        .and_then(|j| j.audience.as_deref())
        .unwrap_or(crate::providers::aws::DEFAULT_AUDIENCE)
}

/// The AWS side of the login's cache key: which role, assumed where, with which token.
pub(super) fn identity(iam: &VaultIamAuth) -> String {
    format!(
        "{}\n{}\n{}\n{}",
        iam.role,
        region(iam),
        iam.endpoint.as_deref().unwrap_or(""),
        audience(iam)
    )
}

fn region(iam: &VaultIamAuth) -> &str {
    iam.region.as_deref().unwrap_or(DEFAULT_REGION)
}

/// Logs in at `auth/<mount>/login` as `vaultRole` with a freshly signed GetCallerIdentity.
pub(super) async fn login(
    iam: &VaultIamAuth,
    mount: &str,
    ctx: &BuildContext<'_>,
    client: &Transport,
) -> Result<AuthInfo, ProviderError> {
    let region = region(iam);
    let endpoint = iam.endpoint.as_deref();
    let creds =
        crate::providers::aws::web_identity(ctx, region, endpoint, &iam.role, audience(iam))
            .await?;
    let url = sts_url(region, endpoint);
    let headers = signed_headers(&creds, region, &url, iam.vault_aws_iam_server_id.as_deref())?;
    let headers = serde_json::to_vec(&headers).map_err(|_| bad_request())?;
    let request = IamLoginRequest::builder()
        .mount(mount)
        .role(iam.vault_role.clone())
        .iam_http_request_method("POST")
        .iam_request_url(STANDARD.encode(&url))
        .iam_request_body(STANDARD.encode(BODY))
        .iam_request_headers(STANDARD.encode(headers))
        .build()
        .map_err(|_| bad_request())?;
    client
        .login(request)
        .await
        .map_err(|e| login_error(e, "aws", mount, Some(&iam.vault_role)))
}

/// The STS URL the request names: the endpoint override, the global endpoint for `us-east-1`,
/// else the region's.
fn sts_url(region: &str, endpoint: Option<&str>) -> String {
    match endpoint {
        Some(e) => format!("{}/", e.trim_end_matches('/')),
        None if region == DEFAULT_REGION => "https://sts.amazonaws.com/".into(),
        None => format!("https://sts.{region}.amazonaws.com/"),
    }
}

/// The headers of a GetCallerIdentity POST to `url` signed with `creds`, as Vault reads them
/// (`iam_request_headers`: a JSON map of header name to values).
fn signed_headers(
    creds: &Credentials,
    region: &str,
    url: &str,
    server_id: Option<&str>,
) -> Result<BTreeMap<String, Vec<String>>, ProviderError> {
    let host = url
        .split_once("://")
        .map(|(_, rest)| rest.split('/').next().unwrap_or(rest))
        .filter(|h| !h.is_empty())
        .ok_or_else(|| ProviderError::Config("auth.iam.endpoint is not a URL".into()))?;
    let mut headers: Vec<(&str, &str)> = vec![
        ("host", host),
        (
            "content-type",
            "application/x-www-form-urlencoded; charset=utf-8",
        ),
    ];
    if let Some(id) = server_id {
        headers.push(("x-vault-aws-iam-server-id", id));
    }
    let identity: Identity = creds.clone().into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name("sts")
        .time(SystemTime::now())
        .settings(SigningSettings::default())
        .build()
        .map_err(|_| ProviderError::Config("auth.iam: cannot sign the STS request".into()))?
        .into();
    let signable = SignableRequest::new(
        "POST",
        url,
        headers.iter().copied(),
        SignableBody::Bytes(BODY.as_bytes()),
    )
    .map_err(|_| ProviderError::Config("auth.iam: the STS URL cannot be signed".into()))?;
    let (instructions, _) = sign(signable, &params)
        .map_err(|_| ProviderError::Config("auth.iam: cannot sign the STS request".into()))?
        .into_parts();
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, value) in headers.iter().copied().chain(instructions.headers()) {
        out.entry(canonical(name))
            .or_default()
            .push(value.to_string());
    }
    Ok(out)
}

/// `x-amz-date` -> `X-Amz-Date`: Go's canonical header form, which Vault reads the map with.
fn canonical(name: &str) -> String {
    name.split('-')
        .map(|part| {
            let mut chars = part.chars();
            match chars.next() {
                Some(first) => {
                    first.to_ascii_uppercase().to_string() + &chars.as_str().to_ascii_lowercase()
                }
                None => String::new(),
            }
        })
        .collect::<Vec<_>>()
        .join("-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signed_request_names_sts_and_carries_a_sigv4_signature() {
        let creds = Credentials::new(
            "AKIDIAMTEST",
            "iam-secret-key",
            Some("iam-session".into()),
            None,
            "t",
        );
        let h = signed_headers(
            &creds,
            "eu-west-1",
            &sts_url("eu-west-1", None),
            Some("vault.example"),
        )
        .unwrap();
        assert_eq!(h["Host"], ["sts.eu-west-1.amazonaws.com"]);
        assert_eq!(h["X-Vault-Aws-Iam-Server-Id"], ["vault.example"]);
        assert_eq!(h["X-Amz-Security-Token"], ["iam-session"]);
        let auth = &h["Authorization"][0];
        assert!(
            auth.starts_with("AWS4-HMAC-SHA256 Credential=AKIDIAMTEST/"),
            "{auth}"
        );
        assert!(auth.contains("/eu-west-1/sts/aws4_request"), "{auth}");
        assert!(
            auth.contains("x-vault-aws-iam-server-id"),
            "the server id is signed: {auth}"
        );
        assert!(!format!("{h:?}").contains("iam-secret-key"));
        assert_eq!(sts_url("us-east-1", None), "https://sts.amazonaws.com/");
        assert_eq!(
            sts_url("x", Some("http://127.0.0.1:5000/")),
            "http://127.0.0.1:5000/"
        );
        assert_eq!(canonical("x-amz-date"), "X-Amz-Date");
    }
}
