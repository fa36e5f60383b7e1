//! `latchkey convert`: reads SecretProviderClasses and External Secrets Operator objects from
//! files or stdin and prints the Latchkey manifests. Only ever writes to stdout and stderr.

use std::io::Write;
use std::path::PathBuf;

use crate::catalog::yaml_limits::{Limits, read_bounded};
use crate::convert::{self, ConvertError, Input};

/// Flags of `latchkey convert`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Reads Secrets Store CSI Driver SecretProviderClasses (aws and vault natively, any other provider \
through its provider pod) and External \
Secrets Operator ExternalSecrets, SecretStores and ClusterSecretStores (v1, v1beta1) and its \
Password, VaultDynamicSecret and ClusterGenerator generators, in multi-document YAML or \
kubectl's List output, and prints the equivalent Latchkey manifests on stdout. Every field that could not be carried over is named in a \
`# latchkey convert:` comment and on stderr; for a SecretProviderClass, a commented pod volume \
shows what replaces the CSI driver's. Other kinds are skipped (noted on stderr).

The input files are never written: the output goes to stdout only (redirect it to a new file).
Exits non-zero when an input cannot be read or parsed or is past the YAML bounds (nothing is \
printed then), when nothing could be converted, or when any object could not be converted (one \
with a field convert does not know, e.g. a typo, is not converted at all): the objects that \
could are still printed.

Example: kubectl get secretproviderclasses -A -o yaml | latchkey convert > latchkey.yaml")]
pub struct ConvertArgs {
    /// Input files; `-` or none reads stdin.
    pub files: Vec<PathBuf>,
    /// Write each store's provider block as a provider object of its own, named like the store,
    /// which the store names by `spec.providerRef` (the provider kind's CRD must be installed:
    /// `kubectl apply -k crds/providers/<kind>`).
    #[arg(long)]
    pub provider_refs: bool,
}

/// Converts the inputs, prints the result on stdout and the notes on stderr.
pub fn run(args: ConvertArgs) -> Result<(), ConvertError> {
    let inputs = read_inputs(&args.files)?;
    let options = convert::Options {
        provider_refs: args.provider_refs,
    };
    let conversion = convert::convert_with(&inputs, options)?;
    let mut stderr = std::io::stderr().lock();
    for line in &conversion.messages {
        // Best effort: a closed stderr must not cost the output.
        let _ = writeln!(stderr, "{line}");
    }
    if conversion.documents == 0 {
        return Err(ConvertError::NothingConverted {
            objects: conversion.objects,
        });
    }
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(conversion.yaml.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(ConvertError::Write)?;
    // The output is written, but a script applying it must not take it for the whole.
    if conversion.failed > 0 {
        return Err(ConvertError::NotAllConverted {
            failed: conversion.failed,
            objects: conversion.objects,
        });
    }
    Ok(())
}

fn read_inputs(files: &[PathBuf]) -> Result<Vec<Input>, ConvertError> {
    if files.is_empty() {
        return Ok(vec![read_stdin()?]);
    }
    files
        .iter()
        .map(|path| {
            if path.as_os_str() == "-" {
                return read_stdin();
            }
            std::fs::File::open(path)
                .and_then(|file| read_bounded(file, &Limits::CONVERT))
                .map(|text| Input {
                    name: path.display().to_string(),
                    text,
                })
                .map_err(|source| ConvertError::Read {
                    path: path.clone(),
                    source,
                })
        })
        .collect()
}

fn read_stdin() -> Result<Input, ConvertError> {
    let text =
        read_bounded(std::io::stdin(), &Limits::CONVERT).map_err(|source| ConvertError::Read {
            path: PathBuf::from("-"),
            source,
        })?;
    Ok(Input {
        name: "<stdin>".into(),
        text,
    })
}
