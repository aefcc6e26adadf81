//! Cache replacement policies behind one trait.
//!
//! A [`Policy`] decides which block keys are resident in a cache of a
//! fixed number of blocks. It holds keys only, never data: the simulator
//! counts hits and misses with it, and a running server's memory cache
//! keeps its buffers in a map beside it, dropping the buffer of whatever
//! key [`Policy::access`] reports as evicted. Every policy here is generic
//! over the key type and its [`KeyIndex`](crate::index::KeyIndex), does
//! O(1) work per access (FBR: amortised, as its paper says), and
//! allocates nothing per access once built.
//!
//! | policy | module | source |
//! |---|---|---|
//! | LRU | [`lru`] | Mattson et al. 1970 |
//! | 2Q | [`twoq`] | Johnson & Shasha, VLDB 1994 |
//! | FBR | [`fbr`] | Robinson & Devarakonda, SIGMETRICS 1990 |
//! | MQ | [`mq`] | Zhou, Philbin & Li, USENIX ATC 2001 |
//! | FMPQ | [`fmpq`] | TransCom seed, section 5.3 |
//! | ARC | [`arc`] | Megiddo & Modha, FAST 2003 |
//! | S3-FIFO | [`s3fifo`] | Yang et al., SOSP 2023 |
//!
//! Policies are named on the command line as `NAME` or
//! `NAME[key=value,...]` (see [`PolicySpec`]).

pub mod arc;
pub mod fbr;
pub mod fmpq;
pub mod lru;
pub mod mq;
pub mod s3fifo;
pub mod twoq;

use std::fmt;

use crate::index::KeyIndex;

/// What one access did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome<K> {
    /// The key was resident.
    Hit,
    /// The key was not resident and now is; `evicted` lost its place to it.
    Miss { evicted: Option<K> },
}

impl<K> Outcome<K> {
    #[inline]
    pub fn is_hit(&self) -> bool {
        matches!(self, Outcome::Hit)
    }
}

/// A replacement policy over keys `K`.
pub trait Policy<K>: Send {
    /// Display name with non-default parameters, e.g. `FMPQ[w=4]`.
    fn name(&self) -> String;
    /// Capacity in blocks.
    fn capacity(&self) -> usize;
    /// Resident blocks.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Whether `key` is resident (ghost entries do not count).
    fn contains(&self, key: &K) -> bool;
    /// Reference `key`: a hit, or a miss after which `key` is resident
    /// (capacity ≥ 1) and at most one other key was evicted.
    fn access(&mut self, key: K) -> Outcome<K>;
    /// Forget `key` (resident or ghost), e.g. when its block is trimmed or
    /// rewritten elsewhere. Returns whether it was resident.
    fn remove(&mut self, key: &K) -> bool;
}

/// The policies this crate implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum PolicyKind {
    Lru,
    TwoQ,
    Fbr,
    Mq,
    Fmpq,
    Arc,
    S3Fifo,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 7] = [
        PolicyKind::Fmpq,
        PolicyKind::TwoQ,
        PolicyKind::Fbr,
        PolicyKind::Lru,
        PolicyKind::Arc,
        PolicyKind::S3Fifo,
        PolicyKind::Mq,
    ];

    /// Canonical display name.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Lru => "LRU",
            PolicyKind::TwoQ => "2Q",
            PolicyKind::Fbr => "FBR",
            PolicyKind::Mq => "MQ",
            PolicyKind::Fmpq => "FMPQ",
            PolicyKind::Arc => "ARC",
            PolicyKind::S3Fifo => "S3-FIFO",
        }
    }

    fn parse(s: &str) -> Option<PolicyKind> {
        Some(match s.to_ascii_lowercase().as_str() {
            "lru" => PolicyKind::Lru,
            "2q" | "twoq" => PolicyKind::TwoQ,
            "fbr" => PolicyKind::Fbr,
            "mq" => PolicyKind::Mq,
            "fmpq" => PolicyKind::Fmpq,
            "arc" => PolicyKind::Arc,
            "s3fifo" | "s3-fifo" => PolicyKind::S3Fifo,
            _ => return None,
        })
    }
}

/// A bad policy specification.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct SpecError(pub String);

/// `key=value` parameters of a policy specification.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Params {
    policy: &'static str,
    pairs: Vec<(String, String)>,
}

impl Params {
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&String, &String)> {
        self.pairs.iter().map(|(k, v)| (k, v))
    }

    pub(crate) fn bad(&self, k: &str, v: &str, want: &str) -> SpecError {
        SpecError(format!(
            "{}: {k}={v} is not valid: expected {want}",
            self.policy
        ))
    }

    pub(crate) fn unknown(&self, k: &str, known: &str) -> SpecError {
        SpecError(format!(
            "{} has no parameter '{k}' (its parameters: {known})",
            self.policy
        ))
    }

    /// A number in [0, 1].
    pub(crate) fn fraction(&self, k: &str, v: &str) -> Result<f64, SpecError> {
        match v.parse::<f64>() {
            Ok(f) if (0.0..=1.0).contains(&f) => Ok(f),
            _ => Err(self.bad(k, v, "a fraction between 0 and 1")),
        }
    }

    /// A non-negative number.
    pub(crate) fn ratio(&self, k: &str, v: &str) -> Result<f64, SpecError> {
        match v.parse::<f64>() {
            Ok(f) if f >= 0.0 && f.is_finite() => Ok(f),
            _ => Err(self.bad(k, v, "a non-negative number")),
        }
    }

    /// A positive integer.
    pub(crate) fn count(&self, k: &str, v: &str) -> Result<u64, SpecError> {
        match v.parse::<u64>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(self.bad(k, v, "a positive integer")),
        }
    }

    /// A block count, absolute (`65536`) or relative to the cache's
    /// capacity (`4x` = four times the capacity).
    pub(crate) fn amount(&self, k: &str, v: &str) -> Result<Amount, SpecError> {
        if let Some(m) = v.strip_suffix('x') {
            match m.parse::<f64>() {
                Ok(f) if f >= 0.0 && f.is_finite() => Ok(Amount::Times(f)),
                _ => Err(self.bad(
                    k,
                    v,
                    "a count such as 65536 or a multiple of the capacity such as 4x",
                )),
            }
        } else {
            v.parse::<u64>().map(Amount::Blocks).map_err(|_| {
                self.bad(
                    k,
                    v,
                    "a count such as 65536 or a multiple of the capacity such as 4x",
                )
            })
        }
    }
}

/// A count given absolutely or as a multiple of the cache's capacity.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Amount {
    Blocks(u64),
    Times(f64),
}

impl Amount {
    pub fn resolve(self, capacity: usize) -> u64 {
        match self {
            Amount::Blocks(n) => n,
            Amount::Times(f) => (f * capacity as f64).round() as u64,
        }
    }
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Amount::Blocks(n) => write!(f, "{n}"),
            Amount::Times(x) => write!(f, "{x}x"),
        }
    }
}

/// A parsed policy specification: `lru`, `2q[kin=0.3]`,
/// `fmpq[w=8,qoff=4x,duration=2x]`, ...
#[derive(Clone, Debug, PartialEq)]
pub struct PolicySpec {
    pub kind: PolicyKind,
    /// The text it was parsed from (used as its label).
    pub text: String,
    config: Config,
}

#[derive(Clone, Debug, PartialEq)]
enum Config {
    Lru,
    TwoQ(twoq::TwoQConfig),
    Fbr(fbr::FbrConfig),
    Mq(mq::MqConfig),
    Fmpq(fmpq::FmpqConfig),
    Arc,
    S3Fifo(s3fifo::S3FifoConfig),
}

impl PolicySpec {
    /// Parse one specification.
    pub fn parse(s: &str) -> Result<PolicySpec, SpecError> {
        let t = s.trim();
        let (name, rest) = match t.find('[') {
            Some(i) => {
                let body = t[i + 1..]
                    .strip_suffix(']')
                    .ok_or_else(|| SpecError(format!("'{t}': parameters must end with ']'")))?;
                (&t[..i], Some(body))
            }
            None => (t, None),
        };
        let kind = PolicyKind::parse(name).ok_or_else(|| {
            SpecError(format!(
                "unknown policy '{name}': choose from lru, 2q, fbr, mq, fmpq, arc, s3fifo"
            ))
        })?;
        let mut params = Params {
            policy: kind.name(),
            pairs: Vec::new(),
        };
        for kv in rest
            .unwrap_or("")
            .split(',')
            .filter(|x| !x.trim().is_empty())
        {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| SpecError(format!("'{t}': parameter '{kv}' must be key=value")))?;
            params
                .pairs
                .push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
        let config = match kind {
            PolicyKind::Lru | PolicyKind::Arc => {
                if let Some((k, _)) = params.pairs.first() {
                    return Err(params.unknown(k, "none"));
                }
                if kind == PolicyKind::Lru {
                    Config::Lru
                } else {
                    Config::Arc
                }
            }
            PolicyKind::TwoQ => Config::TwoQ(twoq::TwoQConfig::from_params(&params)?),
            PolicyKind::Fbr => Config::Fbr(fbr::FbrConfig::from_params(&params)?),
            PolicyKind::Mq => Config::Mq(mq::MqConfig::from_params(&params)?),
            PolicyKind::Fmpq => Config::Fmpq(fmpq::FmpqConfig::from_params(&params)?),
            PolicyKind::S3Fifo => Config::S3Fifo(s3fifo::S3FifoConfig::from_params(&params)?),
        };
        Ok(PolicySpec {
            kind,
            text: t.to_string(),
            config,
        })
    }

    /// Parse a comma-separated list (commas inside `[...]` belong to the
    /// parameters): `lru,fmpq[w=8,qoff=4x],2q`.
    pub fn parse_list(s: &str) -> Result<Vec<PolicySpec>, SpecError> {
        let mut out = Vec::new();
        let mut depth = 0i32;
        let mut start = 0;
        for (i, c) in s.char_indices() {
            match c {
                '[' => depth += 1,
                ']' => depth -= 1,
                ',' if depth == 0 => {
                    out.push(PolicySpec::parse(&s[start..i])?);
                    start = i + 1;
                }
                _ => {}
            }
        }
        if depth != 0 {
            return Err(SpecError(format!("'{s}': unbalanced '[' and ']'")));
        }
        out.push(PolicySpec::parse(&s[start..])?);
        Ok(out)
    }

    /// The label used in reports: the canonical name, plus the parameters
    /// if any were given.
    pub fn label(&self) -> String {
        match self.text.find('[') {
            Some(i) => format!("{}{}", self.kind.name(), &self.text[i..]),
            None => self.kind.name().to_string(),
        }
    }

    /// Build the policy for a cache of `capacity` blocks.
    pub fn build<K, I>(&self, capacity: usize) -> Box<dyn Policy<K>>
    where
        K: Copy + Send + 'static,
        I: KeyIndex<K> + 'static,
    {
        match &self.config {
            Config::Lru => Box::new(lru::Lru::<K, I>::with_index(capacity)),
            Config::TwoQ(c) => Box::new(twoq::TwoQ::<K, I>::with_index(capacity, c)),
            Config::Fbr(c) => Box::new(fbr::Fbr::<K, I>::with_index(capacity, c)),
            Config::Mq(c) => Box::new(mq::MultiQueue::<K, I>::mq_with_index(capacity, c)),
            Config::Fmpq(c) => Box::new(mq::MultiQueue::<K, I>::fmpq_with_index(capacity, c)),
            Config::Arc => Box::new(arc::Arc::<K, I>::with_index(capacity)),
            Config::S3Fifo(c) => Box::new(s3fifo::S3Fifo::<K, I>::with_index(capacity, c)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::HashIndex;

    #[test]
    fn specs_parse_and_build() {
        let v =
            PolicySpec::parse_list("lru, fmpq[w=4,qoff=2x,duration=1000],2Q,s3-fifo,ARC").unwrap();
        let names: Vec<String> = v.iter().map(|s| s.label()).collect();
        assert_eq!(
            names,
            [
                "LRU",
                "FMPQ[w=4,qoff=2x,duration=1000]",
                "2Q",
                "S3-FIFO",
                "ARC"
            ]
        );
        for s in &v {
            let mut p = s.build::<u64, HashIndex<u64>>(8);
            assert!(!p.access(1).is_hit());
            assert!(p.access(1).is_hit());
        }
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        let e = PolicySpec::parse("lfu").unwrap_err().0;
        assert!(
            e.contains("unknown policy 'lfu'") && e.contains("fmpq"),
            "{e}"
        );
        let e = PolicySpec::parse("fmpq[x=1]").unwrap_err().0;
        assert!(
            e.contains("no parameter 'x'") && e.contains("duration"),
            "{e}"
        );
        let e = PolicySpec::parse("2q[kin=2]").unwrap_err().0;
        assert!(e.contains("kin=2") && e.contains("fraction"), "{e}");
        let e = PolicySpec::parse_list("fmpq[w=4").unwrap_err().0;
        assert!(e.contains("unbalanced") || e.contains("']'"), "{e}");
    }
}
