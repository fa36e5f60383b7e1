//! The note every mirrored ExternalSecret gets: ESO (and the CSI driver's Secret sync) read the
//! backend with the operator's own identity; `latchkey controller` reads as the ExternalSecret's
//! service account, so the backend's bindings and the account's opt-in must follow.

use super::notes::quoted;

/// The annotation a ServiceAccount carries to let the mirror controller act as it
/// (`mirror::tokens::ALLOW_CONTROLLER_ANNOTATION`; `mirror` sits in convert's own layer, so a
/// test keeps the two equal).
pub const ALLOW_CONTROLLER: &str = "latchkey.dev/allow-controller";

/// The service account the controller acts as when `spec.serviceAccountName` is not set.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";

/// Who read the backend before: ESO's operator.
pub const BEFORE_ESO: &str = "not with the identity ESO used (its operator's own, or the \
     store's serviceAccountRef)";

/// Who read the backend before: the CSI driver's provider, as the pod.
pub const BEFORE_CSI: &str = "not as the pod mounting the class as before (set it to the \
     pods' service account if the backend admits that one)";

/// What to rebind for the mirrored Secret `secret` of an ExternalSecret in `namespace` (`None`:
/// the input named none) that reads as service account `service_account`; `before` says who
/// read the backend until now.
pub fn service_account_note(
    namespace: Option<&str>,
    service_account: &str,
    secret: &str,
    before: &str,
) -> String {
    let ns = namespace.unwrap_or("NAMESPACE");
    let unset = if namespace.is_none() {
        " (NAMESPACE: the namespace you apply it in)"
    } else {
        ""
    };
    format!(
        "Secret {} is written by latchkey controller, which reads the backend as the \
         ExternalSecret's spec.serviceAccountName (not set: {DEFAULT_SERVICE_ACCOUNT}), {before}: \
         the backend must now admit the subject \
         system:serviceaccount:{ns}:{service_account}{unset}: add it to the Vault role \
         (bound_service_account_names {service_account}, bound_service_account_namespaces {ns}) \
         or the IAM role's trust policy (the sub claim), or set spec.serviceAccountName to an \
         account already bound; that account must opt in: kubectl annotate serviceaccount -n \
         {ns} {service_account} {ALLOW_CONTROLLER}=true",
        quoted(secret)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_opt_in_is_the_mirrors() {
        assert_eq!(
            ALLOW_CONTROLLER,
            crate::mirror::tokens::ALLOW_CONTROLLER_ANNOTATION
        );
    }

    #[test]
    fn the_note_names_the_exact_subject() {
        let n = service_account_note(Some("shop"), "default", "db", BEFORE_ESO);
        assert!(n.contains("system:serviceaccount:shop:default"), "{n}");
        assert!(
            n.contains("-n shop default latchkey.dev/allow-controller=true"),
            "{n}"
        );
        let n = service_account_note(None, "default", "db", BEFORE_CSI);
        assert!(
            n.contains("system:serviceaccount:NAMESPACE:default (NAMESPACE:"),
            "{n}"
        );
    }
}
