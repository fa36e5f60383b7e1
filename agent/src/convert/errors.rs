//! Why `latchkey convert` failed as a whole. Problems with single objects or fields are not
//! errors: they are [`super::notes::Note`]s, reported next to the output.

use std::path::PathBuf;

/// A failure that stops the conversion. Messages never quote document contents, since inputs can
/// hold secret values (ESO fake stores, Secrets). Causes are sources, not part of the message:
/// `main` prints the chain.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    /// An input could not be read.
    #[error("reading {path}")]
    Read {
        /// The file, or `-` for stdin.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// An input is not valid YAML; nothing was converted so that no object is lost unnoticed.
    #[error("{source_name}: document {index}: {reason}; nothing was converted")]
    Parse {
        /// The file name, or `<stdin>`.
        source_name: String,
        /// 1-based document number.
        index: usize,
        /// Where, without the text around it.
        reason: String,
    },
    /// An input is larger, deeper or expands further than `latchkey convert` reads; nothing was
    /// converted.
    #[error("{source_name}: {refused}; nothing was converted")]
    Refused {
        /// The file name, or `<stdin>`.
        source_name: String,
        /// The bound passed.
        refused: crate::catalog::yaml_limits::Refused,
    },
    /// Every object was skipped or failed.
    #[error(
        "nothing could be converted ({objects} object(s) read; see the messages above); \
         latchkey convert reads SecretProviderClasses and External Secrets Operator \
         ExternalSecrets, SecretStores, ClusterSecretStores and generators"
    )]
    NothingConverted {
        /// How many objects the inputs held.
        objects: usize,
    },
    /// Some objects could not be converted; the others were written.
    #[error(
        "{failed} of {objects} object(s) were not converted (the errors above name them and \
         why); the output holds the others"
    )]
    NotAllConverted {
        /// Objects not converted.
        failed: usize,
        /// How many objects the inputs held.
        objects: usize,
    },
    /// A converted document could not be rendered as YAML.
    #[error("rendering {what} as YAML")]
    Render {
        /// The object.
        what: String,
        /// Cause.
        source: serde_norway::Error,
    },
    /// Writing the output failed.
    #[error("writing the output")]
    Write(#[source] std::io::Error),
}
