//! What every policy shares: the [`Policy`] trait and its [`Outcome`],
//! and the `key=value` parameters of a policy specification with the
//! [`Amount`]s they give. The policy modules build on this one; `mod.rs`
//! builds the policies from a [`PolicySpec`](super::PolicySpec).

use std::fmt;

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

/// A bad policy specification.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct SpecError(pub String);

/// `key=value` parameters of a policy specification.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Params {
    pub(super) policy: &'static str,
    pub(super) pairs: Vec<(String, String)>,
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
