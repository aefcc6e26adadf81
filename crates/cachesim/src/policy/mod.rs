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
//! LRU, 2Q, ARC and S3-FIFO are a few tagged lists each: `tagged.rs`
//! keeps their shared state and does their [`Policy`] bookkeeping once;
//! each of them adds its rule.
//!
//! Policies are named on the command line as `NAME` or
//! `NAME[key=value,...]` (see [`PolicySpec`]).

pub mod arc;
mod base;
pub mod fbr;
pub mod fmpq;
pub mod lru;
pub mod mq;
pub mod s3fifo;
mod tagged;
pub mod twoq;

use crate::index::KeyIndex;

pub use base::{Amount, Outcome, Params, Policy, SpecError};

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
