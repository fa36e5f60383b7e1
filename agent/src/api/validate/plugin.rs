//! `spec.provider.plugin` and `spec.provider.secretsStoreCSI`: the stores whose backend is a
//! plugin process the agent calls over a socket (endpoint, TLS, audiences, call timeout).

use std::fmt::Display;
use std::time::Duration;

use super::Invalid;
use super::fields::{name, not_empty, shaped};
use crate::api::rules;
use crate::api::store::{PluginProvider, SecretsStoreCsiProvider};

/// Default of `spec.provider.plugin.timeout`.
pub const PLUGIN_DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest `spec.provider.plugin.timeout`: a publish waits for it, and kubelet's own call times
/// out after about two minutes.
pub const PLUGIN_MAX_TIMEOUT: Duration = Duration::from_secs(300);

/// Where a plugin listens, parsed from `spec.provider.plugin.endpoint`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PluginEndpoint<'a> {
    /// `unix://<dir>/<name>`: a socket `name` in directory `dir` (absolute, no `.`/`..`).
    Unix {
        /// The directory as written, without a trailing `/` (`/` for the root).
        dir: &'a str,
        /// The socket's file name (`[A-Za-z0-9_.-]{1,64}.sock`).
        name: &'a str,
    },
    /// `host:port`, plaintext gRPC over TCP.
    Tcp {
        /// DNS name, IPv4 address or bracketed IPv6 address.
        host: &'a str,
        /// TCP port (1-65535).
        port: u16,
    },
}

/// `spec.provider.plugin`: the endpoint's shape, the timeout, the config reference, the
/// audiences and `tls` (TCP only). Whether a unix socket is in the directory the agent allows
/// is the provider's check (it knows the flag), as is whether `tls.caBundle` holds certificates.
/// Returns the call timeout.
pub fn plugin(p: &PluginProvider) -> Result<Duration, Invalid> {
    plugin_at("spec.provider.plugin", p)
}

/// [`plugin`] for a plugin block at `at` (a PluginGenerator's `spec.provider`, or the one a
/// ClusterGenerator wraps), so that messages name the field where it is.
pub fn plugin_at(at: impl Display + Copy, p: &PluginProvider) -> Result<Duration, Invalid> {
    let endpoint = endpoint_at(format_args!("{at}.endpoint"), &p.endpoint)?;
    let timeout = call_timeout(format_args!("{at}.timeout"), p.timeout.as_deref())?;
    audiences(format_args!("{at}.audiences"), &p.audiences)?;
    if let Some(tls) = &p.tls {
        if matches!(endpoint, PluginEndpoint::Unix { .. }) {
            return Err(Invalid::rule(at, &rules::PLUGIN_TLS_TCP_ONLY));
        }
        match (&tls.ca_bundle, &tls.ca_provider) {
            (Some(bundle), None) => {
                not_empty(format_args!("{at}.tls.caBundle"), bundle.trim())?;
                if bundle.len() > rules::MAX_CA_BUNDLE_LEN {
                    return Err(Invalid::schema(
                        format_args!("{at}.tls.caBundle"),
                        format!("must be at most {} KiB", rules::MAX_CA_BUNDLE_LEN >> 10),
                    ));
                }
            }
            (None, Some(ca)) => super::ca_provider(format_args!("{at}.tls.caProvider"), ca)?,
            _ => {
                return Err(Invalid::rule(
                    format_args!("{at}.tls"),
                    &rules::PLUGIN_TLS_ONE_CA,
                ));
            }
        }
        if let Some(secret) = &tls.client_cert_secret_ref {
            name(
                format_args!("{at}.tls.clientCertSecretRef.name"),
                &secret.name,
            )?;
        }
    }
    if let Some(c) = &p.config_ref {
        not_empty(format_args!("{at}.configRef.name"), &c.name)?;
        for (field, value) in [
            ("apiVersion", &c.api_version),
            ("kind", &c.kind),
            ("name", &c.name),
        ] {
            if value.chars().count() > rules::MAX_NAME_LEN || value.chars().any(char::is_control) {
                return Err(Invalid(format!(
                    "{at}.configRef.{field}: must be at most {} characters, without control characters",
                    rules::MAX_NAME_LEN
                )));
            }
        }
    }
    Ok(timeout)
}

/// A call timeout at `path`: [`PLUGIN_DEFAULT_TIMEOUT`] when absent, else more than 0 and at
/// most [`PLUGIN_MAX_TIMEOUT`].
fn call_timeout(path: impl Display + Copy, text: Option<&str>) -> Result<Duration, Invalid> {
    let Some(text) = text else {
        return Ok(PLUGIN_DEFAULT_TIMEOUT);
    };
    shaped(path, text, rules::MAX_DURATION_LEN, &rules::DURATION)?;
    match crate::api::duration::parse(text) {
        Some(t) if !t.is_zero() && t <= PLUGIN_MAX_TIMEOUT => Ok(t),
        _ => Err(Invalid(format!(
            "{path}: must be more than 0 and at most {}",
            humantime::format_duration(PLUGIN_MAX_TIMEOUT)
        ))),
    }
}

/// Most bytes of `spec.provider.secretsStoreCSI.parameters` (keys and values): they travel in
/// every Mount call; a SecretProviderClass's are a few KiB.
pub const MAX_SECRETS_STORE_PARAMETERS_BYTES: usize = 64 << 10;

/// `spec.provider.secretsStoreCSI`: the provider name (it names a socket: no `/`, no `.`), the
/// parameters' size, the audiences and the timeout. Returns the call timeout.
pub fn secrets_store_csi(p: &SecretsStoreCsiProvider) -> Result<Duration, Invalid> {
    const AT: &str = "spec.provider.secretsStoreCSI";
    if !rules::SECRETS_STORE_PROVIDER.is_match(&p.provider) {
        return Err(Invalid::pattern(
            format_args!("{AT}.provider"),
            &rules::SECRETS_STORE_PROVIDER,
        ));
    }
    let bytes: usize = p.parameters.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > MAX_SECRETS_STORE_PARAMETERS_BYTES {
        return Err(Invalid(format!(
            "{AT}.parameters: must be at most {} KiB in all",
            MAX_SECRETS_STORE_PARAMETERS_BYTES >> 10
        )));
    }
    if p.parameters
        .keys()
        .any(|k| k.starts_with(crate::identity::POD_INFO_PREFIX))
    {
        // The pod attributes are the agent's to set: a store must not forge another pod's.
        return Err(Invalid(format!(
            "{AT}.parameters: keys starting with {} are set by the agent (the pod's attributes \
             and tokens)",
            crate::identity::POD_INFO_PREFIX
        )));
    }
    if p.audiences.len() > rules::MAX_AUDIENCES {
        return Err(Invalid::schema(
            format_args!("{AT}.audiences"),
            rules::too_many_items(rules::MAX_AUDIENCES),
        ));
    }
    for (i, audience) in p.audiences.iter().enumerate() {
        if audience.chars().count() > rules::MAX_NAME_LEN || audience.chars().any(char::is_control)
        {
            return Err(Invalid(format!(
                "{AT}.audiences[{i}]: must be at most {} characters, without control characters",
                rules::MAX_NAME_LEN
            )));
        }
    }
    if let Some(r) = &p.node_publish_secret_ref {
        name(format_args!("{AT}.nodePublishSecretRef.name"), &r.name)?;
    }
    call_timeout(format_args!("{AT}.timeout"), p.timeout.as_deref())
}

/// A list of token audiences at `path`: at most [`rules::MAX_AUDIENCES`], each bounded and
/// without control characters.
fn audiences(path: impl Display, list: &[String]) -> Result<(), Invalid> {
    if list.len() > rules::MAX_AUDIENCES {
        return Err(Invalid::schema(
            path,
            rules::too_many_items(rules::MAX_AUDIENCES),
        ));
    }
    for (i, audience) in list.iter().enumerate() {
        if audience.chars().count() > rules::MAX_NAME_LEN || audience.chars().any(char::is_control)
        {
            return Err(Invalid(format!(
                "{path}[{i}]: must be at most {} characters, without control characters",
                rules::MAX_NAME_LEN
            )));
        }
    }
    Ok(())
}

/// Parses a plugin endpoint: `unix:///abs/dir/name.sock` or `host:port`. Refuses relative
/// socket paths, `.`/`..` and empty segments, socket names outside `[A-Za-z0-9_.-]{1,64}.sock`,
/// URL schemes other than `unix://`, and ports outside 1-65535.
pub fn plugin_endpoint(text: &str) -> Result<PluginEndpoint<'_>, Invalid> {
    endpoint_at("spec.provider.plugin.endpoint", text)
}

/// [`plugin_endpoint`] for an endpoint at `path`.
fn endpoint_at(path: impl Display + Copy, text: &str) -> Result<PluginEndpoint<'_>, Invalid> {
    let bad = |why: &str| {
        Invalid(format!(
            "{path}: {:?} {why}",
            crate::telemetry::escape::printable(text, 80)
        ))
    };
    if text.chars().count() > rules::MAX_PLUGIN_ENDPOINT_LEN {
        return Err(Invalid::schema(
            path,
            rules::too_long(rules::MAX_PLUGIN_ENDPOINT_LEN),
        ));
    }
    if let Some(path) = text.strip_prefix("unix://") {
        let Some(rest) = path.strip_prefix('/') else {
            return Err(bad("must be unix:// followed by an absolute socket path"));
        };
        let (dir, name) = match rest.rsplit_once('/') {
            Some((dir, name)) => (&path[..dir.len() + 1], name),
            None => ("/", rest),
        };
        if dir != "/"
            && dir[1..]
                .split('/')
                .any(|seg| seg.is_empty() || seg == "." || seg == "..")
        {
            return Err(bad("must not contain empty, '.' or '..' path segments"));
        }
        let stem = name.strip_suffix(".sock").unwrap_or_default();
        let stem_ok = (1..=64).contains(&stem.len())
            && stem
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if !stem_ok || name.starts_with('.') {
            return Err(bad(
                "must name a socket file of 1 to 64 letters, digits, '_', '.' or '-' (not \
                 starting with '.') followed by .sock",
            ));
        }
        return Ok(PluginEndpoint::Unix { dir, name });
    }
    if text.contains("://") {
        return Err(bad("must be unix:///<path> or host:port (no other scheme)"));
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(bad("must be unix:///<path> or host:port"));
    };
    let port = match port.parse::<u16>() {
        Ok(p) if p > 0 && port.bytes().all(|b| b.is_ascii_digit()) => p,
        _ => return Err(bad("has no valid port (1-65535)")),
    };
    let host_ok = if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        v6.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        !host.is_empty()
            && host.len() <= 253
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-'))
    };
    if !host_ok {
        return Err(bad(
            "has no valid host (a DNS name, an IPv4 address or a bracketed IPv6 address)",
        ));
    }
    Ok(PluginEndpoint::Tcp { host, port })
}
