//! What an entry's `metadata` asks of AWS Secrets Manager, and how far a secret is from it:
//! the checks Secrets Manager would otherwise fail a write with, the tags to set and remove, the
//! KMS key comparison and the replica regions to add and remove.

use std::collections::BTreeMap;

use aws_sdk_secretsmanager::operation::describe_secret::DescribeSecretOutput;
use aws_sdk_secretsmanager::types::{ReplicaRegionType, Tag};

use super::super::push::{MARK_KEY, MARK_VALUE, PushError};
use crate::api::push_metadata::PushMetadataSpec;

/// The fields of `spec.data[].metadata.spec` this provider uses.
pub(super) const FIELDS: [&str; 5] = [
    "tags",
    "description",
    "kmsKeyId",
    "secretPushFormat",
    "replicationLocations",
];
/// Most tags on one secret (Secrets Manager's limit), the mark included.
const MAX_AWS_TAGS: usize = 50;
/// Longest tag key, in characters (Secrets Manager's limit).
const MAX_TAG_KEY: usize = 128;
/// Longest tag value, in characters (Secrets Manager's limit).
const MAX_TAG_VALUE: usize = 256;
/// The key AWS encrypts a secret with when none is named; DescribeSecret then shows none.
pub(super) const DEFAULT_KMS_KEY: &str = "alias/aws/secretsmanager";

/// Longest region name, in characters (the longest AWS has is 14).
const MAX_REGION: usize = 32;

/// The tags to set and to remove to bring `described` in line: the mark on an adopted secret
/// and, when `tags` is set, exactly those tags; only what differs, so nothing when all holds.
pub(super) fn tag_changes(
    described: &DescribeSecretOutput,
    metadata: &PushMetadataSpec,
) -> (Vec<Tag>, Vec<String>) {
    let current: BTreeMap<&str, &str> = described
        .tags()
        .iter()
        .filter_map(|t| Some((t.key()?, t.value().unwrap_or_default())))
        .collect();
    let mut wanted: BTreeMap<&str, &str> = metadata
        .tags
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    wanted.insert(MARK_KEY, MARK_VALUE);
    let set = wanted
        .iter()
        .filter(|(k, v)| current.get(*k) != Some(*v))
        .filter(|(k, _)| !metadata.tags.is_empty() || **k == MARK_KEY)
        .map(|(k, v)| Tag::builder().key(*k).value(*v).build())
        .collect();
    // Without `tags`, the others' tags stay (ESO's semantics): only the mark is added.
    // Tags under `aws:` belong to AWS (CloudFormation's, say): no one may remove them.
    let unset = current
        .keys()
        .filter(|k| !metadata.tags.is_empty() && !wanted.contains_key(*k))
        .filter(|k| !aws_reserved(k))
        .map(|k| k.to_string())
        .collect();
    (set, unset)
}

/// Whether the key the secret is encrypted with (`described`, none for AWS's default) is
/// `wanted`, as an id, alias, or the ARN of either. An alias and the key id it names cannot be
/// told apart without asking KMS: they count as different, which costs no call (the value then
/// goes with `UpdateSecret` instead of `PutSecretValue`).
pub(super) fn same_kms_key(described: Option<&str>, wanted: &str) -> bool {
    let described = described.unwrap_or(DEFAULT_KMS_KEY);
    // An ARN ends in `:alias/<name>` or `:key/<id>`.
    let ends = |long: &str, short: &str| {
        long == short
            || long.starts_with("arn:")
                && long
                    .strip_suffix(short)
                    .is_some_and(|head| head.ends_with(':') || head.ends_with(":key/"))
    };
    ends(described, wanted) || ends(wanted, described)
}

/// Whether a tag key or value holds only what AWS allows: letters, digits, spaces and
/// `_ . : / = + - @`.
fn tag_text(text: &str) -> bool {
    text.chars().all(|c| {
        c.is_alphanumeric() || (c.is_whitespace() && !c.is_control()) || "_.:/=+-@".contains(c)
    })
}

/// Whether a tag key is in AWS's own `aws:` namespace, which no one else may set or remove.
pub(super) fn aws_reserved(key: &str) -> bool {
    key.get(..4).is_some_and(|p| p.eq_ignore_ascii_case("aws:"))
}

/// The values of the fields this provider uses that Secrets Manager would refuse; `primary`
/// is the store's region.
pub(super) fn check(metadata: &PushMetadataSpec, primary: Option<&str>) -> Result<(), PushError> {
    let bad = |field, why: String| Err(PushError::BadMetadata { field, why });
    let tags = &metadata.tags;
    if tags.len() >= MAX_AWS_TAGS {
        return bad(
            "tags",
            format!(
                "{} tags, but Secrets Manager keeps at most {MAX_AWS_TAGS} on a secret, \
                 Latchkey's {MARK_KEY} included",
                tags.len()
            ),
        );
    }
    for (key, value) in tags {
        let shown: String = key.chars().take(64).collect();
        let why = if key.chars().count() > MAX_TAG_KEY {
            format!(
                "tag key {shown:?}... is longer than Secrets Manager's {MAX_TAG_KEY} characters"
            )
        } else if value.chars().count() > MAX_TAG_VALUE {
            format!(
                "the value of tag {shown:?} is longer than Secrets Manager's {MAX_TAG_VALUE} \
                 characters"
            )
        } else if aws_reserved(key) {
            format!("tag key {shown:?}: the prefix aws: is reserved for AWS")
        } else if !tag_text(key) || !tag_text(value) {
            format!(
                "tag {shown:?}: keys and values hold only letters, digits, spaces and \
                 _ . : / = + - @"
            )
        } else {
            continue;
        };
        return bad("tags", why);
    }
    if metadata.kms_key_id.as_deref().is_some_and(str::is_empty) {
        return bad(
            "kmsKeyId",
            "is empty; name a KMS key, or leave it unset".into(),
        );
    }
    let regions = metadata
        .replication_locations
        .as_deref()
        .unwrap_or_default();
    for (i, region) in regions.iter().enumerate() {
        let shown: String = region.chars().take(MAX_REGION).collect();
        let why = if !region_name(region) {
            format!("{shown:?} is not an AWS region name (such as eu-west-1)")
        } else if Some(region.as_str()) == primary {
            format!("{region} is the store's own region; a secret is replicated to others")
        } else if regions[..i].contains(region) {
            format!("{region} is listed twice")
        } else {
            continue;
        };
        return bad("replicationLocations", why);
    }
    Ok(())
}

/// Whether `name` looks like an AWS region name: lowercase letters, digits and inner dashes.
fn region_name(name: &str) -> bool {
    (1..=MAX_REGION).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// The replica regions to add and to remove to bring `described` in line with
/// `replicationLocations` when it is set (exactly those, as ESO does); unset, they are left
/// alone.
pub(super) fn replica_changes(
    described: &DescribeSecretOutput,
    metadata: &PushMetadataSpec,
) -> (Vec<String>, Vec<String>) {
    let Some(wanted) = &metadata.replication_locations else {
        return (Vec::new(), Vec::new());
    };
    let current = replica_regions(described);
    let add = wanted
        .iter()
        .filter(|r| !current.contains(r))
        .cloned()
        .collect();
    let remove = current
        .into_iter()
        .filter(|r| !wanted.contains(r))
        .collect();
    (add, remove)
}

/// The regions `described` is replicated to.
pub(super) fn replica_regions(described: &DescribeSecretOutput) -> Vec<String> {
    described
        .replication_status()
        .iter()
        .filter_map(|r| r.region().map(String::from))
        .collect()
}

/// `regions` as Secrets Manager takes them, each encrypted with `kms_key_id` (an alias names a
/// key in each region; unset: AWS's own key there).
pub(super) fn replicas(regions: &[String], kms_key_id: Option<&str>) -> Vec<ReplicaRegionType> {
    regions
        .iter()
        .map(|r| {
            ReplicaRegionType::builder()
                .region(r)
                .set_kms_key_id(kms_key_id.map(String::from))
                .build()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_the_same_as_its_arn_and_aws_default_as_none() {
        let alias_arn = "arn:aws:kms:us-east-1:123456789012:alias/shop";
        let key_arn = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab";
        assert!(same_kms_key(Some("alias/shop"), "alias/shop"));
        assert!(same_kms_key(Some(alias_arn), "alias/shop"));
        assert!(same_kms_key(Some("alias/shop"), alias_arn));
        assert!(same_kms_key(Some(key_arn), "1234abcd-12ab"));
        assert!(same_kms_key(None, DEFAULT_KMS_KEY));
        assert!(!same_kms_key(None, "alias/shop"));
        assert!(!same_kms_key(Some(alias_arn), "alias/hop"));
        assert!(!same_kms_key(Some("alias/shop"), "shop"));
    }

    #[test]
    fn tag_text_is_what_aws_allows() {
        assert!(tag_text("team a:b/c=d+e-f@g_h.i"));
        assert!(tag_text("équipe 東京 ٣"));
        for bad in ["a;b", "a\tb", "a\nb", "a*", "a,b", "a\"b"] {
            assert!(!tag_text(bad), "{bad:?}");
        }
    }

    #[test]
    fn replication_locations_are_region_names_listed_once_and_not_the_stores_own() {
        let with = |regions: &[&str]| PushMetadataSpec {
            replication_locations: Some(regions.iter().map(|r| r.to_string()).collect()),
            ..Default::default()
        };
        assert!(check(&with(&["eu-west-1", "us-gov-west-1"]), Some("us-east-1")).is_ok());
        for (bad, why) in [
            (&["EU-west-1"][..], "not an AWS region name"),
            (&["eu-west-1-"][..], "not an AWS region name"),
            (&[""][..], "not an AWS region name"),
            (&["us-east-1"][..], "the store's own region"),
            (&["eu-west-1", "eu-west-1"][..], "listed twice"),
        ] {
            let Err(PushError::BadMetadata { field, why: got }) =
                check(&with(bad), Some("us-east-1"))
            else {
                panic!("{bad:?} passed")
            };
            assert_eq!(field, "replicationLocations");
            assert!(got.contains(why), "{bad:?}: {got}");
        }
    }
}
