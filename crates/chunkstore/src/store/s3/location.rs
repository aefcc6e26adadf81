//! `s3://BUCKET[/PREFIX][?KEY=VALUE&...]`: where an S3 store is, and how to
//! reach it. Endpoint, region and credentials come from the usual AWS
//! environment variables (`AWS_ENDPOINT_URL`, `AWS_REGION`,
//! `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`...);
//! the query may set the endpoint, region and client settings, never a
//! secret (a location is written into session files and logs).

use std::time::Duration;

use crate::error::bad_arg;
use roamdisk_blockdev::Result;

/// Requests in flight at once, by default.
pub const DEFAULT_PARALLEL: usize = 16;

/// A parsed `s3://` location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Location {
    pub bucket: String,
    /// Folder inside the bucket (no leading or trailing `/`; may be empty).
    pub prefix: String,
    /// `object_store` settings from the query (`endpoint`, `region`,
    /// `timeout`...), in order.
    pub settings: Vec<(String, String)>,
    /// Requests in flight at once (`parallel=`).
    pub parallel: usize,
    /// Attempts per request after the first (`retries=`, default 5).
    pub retries: usize,
    /// Give up retrying a request after this long (`retry-timeout=`).
    pub retry_timeout: Duration,
    /// Allowance for listings that lag writes (`gc-margin=`, default 60 s):
    /// gc removes nothing referenced more recently.
    pub gc_margin: Duration,
    /// Credentials may come from the cloud's instance metadata service
    /// (`credentials=instance`); otherwise, without keys in the
    /// environment, the store is refused rather than the service asked.
    pub instance_credentials: bool,
}

/// Whether a store location is an S3 bucket.
pub fn is_s3(location: &str) -> bool {
    location.starts_with("s3://")
}

/// Query keys that would put a secret into the location.
const SECRETS: &[&str] = &[
    "access_key_id",
    "aws_access_key_id",
    "secret_access_key",
    "aws_secret_access_key",
    "token",
    "session_token",
    "aws_session_token",
    "sse_customer_key_base64",
];

fn parse_secs(key: &str, v: &str) -> Result<Duration> {
    roamdisk_blockdev::units::parse_duration(v, roamdisk_blockdev::units::Bare::Seconds)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| bad_arg(format!("{key}={v}: give a duration, e.g. {key}=30s")))
}

impl S3Location {
    pub fn parse(location: &str) -> Result<S3Location> {
        let rest = location.strip_prefix("s3://").ok_or_else(|| {
            bad_arg(format!(
                "'{location}' is not an s3://BUCKET/PREFIX location"
            ))
        })?;
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (bucket, prefix) = path.split_once('/').unwrap_or((path, ""));
        let bucket_ok = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
            && !bucket.starts_with(['-', '.'])
            && !bucket.ends_with(['-', '.']);
        if !bucket_ok {
            return Err(bad_arg(format!(
                "'{location}': '{bucket}' is not an S3 bucket name (3-63 lowercase letters, digits, '-' or '.')"
            )));
        }
        let prefix = prefix.trim_matches('/').to_string();
        if prefix
            .split('/')
            .any(|p| p == "." || p == ".." || (p.is_empty() && !prefix.is_empty()))
            || prefix.chars().any(|c| c.is_control())
        {
            return Err(bad_arg(format!(
                "'{location}': the prefix '{prefix}' has an empty, '.' or '..' part"
            )));
        }
        let mut loc = S3Location {
            bucket: bucket.to_string(),
            prefix,
            settings: Vec::new(),
            parallel: DEFAULT_PARALLEL,
            retries: 5,
            retry_timeout: Duration::from_secs(120),
            gc_margin: Duration::from_secs(60),
            instance_credentials: false,
        };
        for kv in query.split('&').filter(|s| !s.is_empty()) {
            let (k, v) = kv.split_once('=').ok_or_else(|| {
                bad_arg(format!(
                    "'{location}': '{kv}' in the query is not KEY=VALUE"
                ))
            })?;
            let k = k.replace('-', "_");
            if SECRETS.contains(&k.as_str()) {
                return Err(bad_arg(format!(
                    "'{location}': do not put {k} in a store location (it is written into session files); set it in the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN)"
                )));
            }
            match k.as_str() {
                "parallel" => {
                    loc.parallel = v
                        .parse()
                        .ok()
                        .filter(|n| (1..=256).contains(n))
                        .ok_or_else(|| bad_arg(format!("parallel={v}: give 1 to 256")))?
                }
                "retries" => {
                    loc.retries = v
                        .parse()
                        .ok()
                        .filter(|n| *n <= 100)
                        .ok_or_else(|| bad_arg(format!("retries={v}: give 0 to 100")))?
                }
                "retry_timeout" => loc.retry_timeout = parse_secs("retry-timeout", v)?,
                "gc_margin" => loc.gc_margin = parse_secs("gc-margin", v)?,
                "credentials" => {
                    loc.instance_credentials = match v {
                        "instance" => true,
                        "environment" => false,
                        _ => {
                            return Err(bad_arg(format!(
                                "credentials={v}: give credentials=instance (ask the cloud's instance metadata service) or credentials=environment (the AWS_* variables, the default)"
                            )))
                        }
                    }
                }
                _ => {
                    if k.parse::<object_store::aws::AmazonS3ConfigKey>().is_err() {
                        return Err(bad_arg(format!(
                            "'{location}': unknown setting '{k}' (known: endpoint, region, timeout, connect_timeout, allow_http, parallel, retries, retry-timeout and the other object_store S3 settings)"
                        )));
                    }
                    loc.settings.push((k, v.to_string()));
                }
            }
        }
        Ok(loc)
    }

    /// The key of `rel` (a `/`-separated name inside the store).
    pub fn key(&self, rel: &str) -> String {
        if self.prefix.is_empty() {
            rel.to_string()
        } else {
            format!("{}/{rel}", self.prefix)
        }
    }

    /// `s3://BUCKET/PREFIX` (without the query), for messages.
    pub fn describe(&self) -> String {
        if self.prefix.is_empty() {
            format!("s3://{}", self.bucket)
        } else {
            format!("s3://{}/{}", self.bucket, self.prefix)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_parse_and_refuse_secrets() {
        let l = S3Location::parse("s3://roamdisk/team/a?endpoint=http://127.0.0.1:8080&region=us-east-1&parallel=4&timeout=5s").unwrap();
        assert_eq!(l.bucket, "roamdisk");
        assert_eq!(l.prefix, "team/a");
        assert_eq!(l.parallel, 4);
        assert_eq!(l.key("packs/x"), "team/a/packs/x");
        assert_eq!(l.describe(), "s3://roamdisk/team/a");
        assert_eq!(l.settings.len(), 3);
        let l = S3Location::parse("s3://bucket").unwrap();
        assert_eq!(l.key("store.toml"), "store.toml");
        assert!(!l.instance_credentials);
        assert!(
            S3Location::parse("s3://bucket?credentials=instance")
                .unwrap()
                .instance_credentials
        );
        for bad in [
            "s3://B",
            "s3://ab",
            "s3://bucket/a//b",
            "s3://bucket/../x",
            "s3://bucket?secret_access_key=x",
            "s3://bucket?nonsense=1",
            "s3://bucket?parallel=0",
            "s3://bucket?endpoint",
            "s3://bucket?credentials=imds",
        ] {
            assert!(S3Location::parse(bad).is_err(), "{bad}");
        }
    }
}
