//! The fetched (and generated) values of a mirrored ExternalSecret as the entries of its Secret.

use super::Reconciler;
use crate::api::ExternalSecret;
use crate::resolve::{self, Context};

impl Reconciler {
    /// The fetched values as Secret entries: on the compute pool unless trivially small.
    pub(super) async fn render(
        &self,
        cx: &Context,
        es: &ExternalSecret,
        fetched: resolve::Fetched,
    ) -> Result<std::collections::BTreeMap<String, crate::secret::SecretBytes>, String> {
        if resolve::is_light(&es.spec, &fetched) {
            return resolve::entries(cx, &es.spec, &fetched, None).map_err(|e| e.to_string());
        }
        let (spec, owned) = (es.spec.clone(), cx.clone());
        self.compute
            .run_fallible(&cx.namespace, move || {
                resolve::entries(&owned, &spec, &fetched, None)
            })
            .await
            .map_err(|e| format!("{cx}: {e}"))?
            .map_err(|e| e.to_string())
    }
}
