//! Stack specifications: the command-line string form and the TOML form,
//! and the factory that turns either into a stack of layers.
//!
//! String form (documented in `docs/layers/README.md`):
//!
//! ```text
//! SPEC   := KIND [ "[" OPT ("," OPT)* "]" ] ":" ARG (":" ARG)* [ ":" SPEC ]
//! OPT    := NAME "=" VALUE
//! ```
//!
//! Each layer kind declares its positional arguments; a layer that wraps
//! another takes the rest of the string as the inner SPEC. In arguments,
//! `\:` stands for a literal colon and `\\` for a backslash. The last
//! argument of a bottom layer (`raw:PATH`) takes the rest of the string
//! verbatim, so paths there need no escaping. A string (or inner SPEC)
//! starting with a URI scheme a layer registered ([`Registry::add_scheme`],
//! e.g. `nbd+unix://`) is that layer's whole argument.
//!
//! TOML form: a table with `kind`, the layer's arguments and options by
//! name, and a `next` table for the inner layer.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use crate::dev::{Access, BlockDev};
use crate::error::{Error, ErrorKind, Op, Result};

/// A parsed, not yet opened, layer of a stack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerSpec {
    pub kind: String,
    /// Arguments and options by name.
    pub params: BTreeMap<String, String>,
    pub next: Option<Box<LayerSpec>>,
}

/// What the factory passes to a layer's constructor.
pub struct OpenCtx<'a> {
    /// This layer must not be modified (it is the base of a cow, or the
    /// export is read-only).
    pub read_only: bool,
    /// Parameters of this layer.
    pub params: &'a BTreeMap<String, String>,
    /// The registry, for layers that open further stacks.
    pub registry: &'a Registry,
}

impl OpenCtx<'_> {
    /// A required parameter.
    pub fn get(&self, kind: &str, name: &str) -> Result<&str> {
        self.params.get(name).map(String::as_str).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidArgument,
                Op::Open,
                kind.to_string(),
                format!("missing parameter '{name}'"),
            )
        })
    }
    /// An optional parameter.
    pub fn opt(&self, name: &str) -> Option<&str> {
        self.params.get(name).map(String::as_str)
    }
    /// An optional on/off parameter ([`parse_on_off`]); a value that is
    /// neither is an error naming the layer and the option.
    pub fn flag(&self, kind: &str, name: &str) -> Result<Option<bool>> {
        self.opt(name)
            .map(|v| {
                parse_on_off(v).ok_or_else(|| {
                    Error::new(
                        ErrorKind::InvalidArgument,
                        Op::Open,
                        kind.to_string(),
                        format!("{name} must be on or off, not '{v}'"),
                    )
                })
            })
            .transpose()
    }
    /// The inner stack of a wrapping layer ([`LayerKind::WRAPPING`]), which
    /// the registry opens before the layer: only a spec built by hand
    /// lacks one (parsing refuses it, with the layer's usage).
    pub fn inner(&self, kind: &str, next: Option<Arc<dyn BlockDev>>) -> Result<Arc<dyn BlockDev>> {
        next.ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidArgument,
                Op::Open,
                kind.to_string(),
                "needs an inner stack",
            )
        })
    }
    /// A path parameter.
    pub fn path(&self, kind: &str, name: &str) -> Result<PathBuf> {
        Ok(PathBuf::from(self.get(kind, name)?))
    }
    /// An optional size parameter (`64K`, `1G`, ...).
    pub fn size_opt(&self, kind: &str, name: &str) -> Result<Option<u64>> {
        self.unit_opt(kind, name, crate::units::parse_size)
    }
    /// An optional duration parameter with its unit (`8ms`, `3.4ms`).
    pub fn duration_opt(&self, kind: &str, name: &str) -> Result<Option<std::time::Duration>> {
        self.unit_opt(kind, name, |v| {
            crate::units::parse_duration(v, crate::units::Bare::Refuse)
        })
    }
    /// An optional rate parameter in bytes per second (`1Mbit`, `100M`).
    pub fn rate_opt(&self, kind: &str, name: &str) -> Result<Option<u64>> {
        self.unit_opt(kind, name, |v| {
            crate::units::parse_rate(v).map(|r| r.round().max((r > 0.0) as u8 as f64) as u64)
        })
    }
    fn unit_opt<T>(
        &self,
        kind: &str,
        name: &str,
        parse: impl Fn(&str) -> std::result::Result<T, crate::units::UnitError>,
    ) -> Result<Option<T>> {
        self.opt(name)
            .map(|v| {
                parse(v).map_err(|m| {
                    Error::new(
                        ErrorKind::InvalidArgument,
                        Op::Open,
                        kind.to_string(),
                        format!("{name}: {m}"),
                    )
                })
            })
            .transpose()
    }
}

/// An on/off value: `on`, `yes`, `true`, `1` or `off`, `no`, `false`, `0`.
pub fn parse_on_off(v: &str) -> Option<bool> {
    match v {
        "on" | "yes" | "true" | "1" => Some(true),
        "off" | "no" | "false" | "0" => Some(false),
        _ => None,
    }
}

/// Opens one layer given its parameters and the already opened next layer.
pub type OpenFn = fn(&OpenCtx<'_>, Option<Arc<dyn BlockDev>>) -> Result<Arc<dyn BlockDev>>;

/// A layer kind the factory knows.
pub struct LayerKind {
    pub name: &'static str,
    /// One line for `roamdisk layers`.
    pub summary: &'static str,
    /// Positional arguments, in order.
    pub args: &'static [&'static str],
    /// Named options (`name`, help).
    pub options: &'static [(&'static str, &'static str)],
    /// Whether the layer wraps an inner stack.
    pub wraps: bool,
    /// Whether the inner stack is opened read-only whatever the export is.
    pub inner_read_only: bool,
    /// The first argument may be left out: in the string form, when the
    /// text in its place is not one (`cache:256M:NEXT` is
    /// `cache:lru:256M:NEXT`); in TOML, when its key is absent.
    pub optional_first: Option<OptionalArg>,
    pub open: OpenFn,
}

impl LayerKind {
    /// What most layer kinds are: at the bottom of a stack (no inner
    /// stack), every argument required. A kind gives its name, summary,
    /// arguments, options and `open`, and takes the rest with
    /// `..LayerKind::BOTTOM`; the name and `open` here (empty, refusing)
    /// are placeholders every kind replaces.
    pub const BOTTOM: LayerKind = LayerKind {
        name: "",
        summary: "",
        args: &[],
        options: &[],
        wraps: false,
        inner_read_only: false,
        optional_first: None,
        open: |_, _| {
            Err(Error::new(
                ErrorKind::Unsupported,
                Op::Open,
                "spec",
                "a layer kind without an open function",
            ))
        },
    };

    /// A layer over an inner stack (`:NEXT`), which is opened as the
    /// export is: `..LayerKind::WRAPPING`, as [`LayerKind::BOTTOM`].
    pub const WRAPPING: LayerKind = LayerKind {
        wraps: true,
        ..LayerKind::BOTTOM
    };

    /// `name[OPT=VALUE,...]:ARG:...:NEXT` (the options part when `options`
    /// and the layer has some; an optional first argument in brackets with
    /// its default).
    pub fn usage(&self, options: bool) -> String {
        let mut u = self.name.to_string();
        if options && !self.options.is_empty() {
            u.push_str("[OPT=VALUE,...]");
        }
        for (i, a) in self.args.iter().enumerate() {
            match (&self.optional_first, i) {
                (Some(o), 0) => {
                    u.push_str(&format!(":[{}, default {}]", a.to_uppercase(), o.default))
                }
                _ => u.push_str(&format!(":{}", a.to_uppercase())),
            }
        }
        if self.wraps {
            u.push_str(":NEXT");
        }
        u
    }
}

/// A first argument that may be left out, and its default.
pub struct OptionalArg {
    pub default: &'static str,
    /// Whether the text in the argument's place is one.
    pub is_one: fn(&str) -> bool,
}

/// The set of layer kinds a program can build stacks from.
#[derive(Default, Clone)]
pub struct Registry {
    kinds: Vec<&'static LayerKind>,
    /// URI prefixes (`nbd://`) read as the whole argument of a bottom
    /// layer kind with one argument.
    schemes: Vec<(&'static str, &'static str)>,
    /// Option values a layer gets when its spec does not give them, by
    /// kind: what the program resolved from its environment (a default
    /// store, this host's cache folder), so that layers read none.
    defaults: BTreeMap<String, BTreeMap<String, String>>,
    /// Typed settings the program hands every layer (one of each type):
    /// what is not an option a user writes in a spec ([`Registry::context`]).
    contexts: Vec<std::sync::Arc<dyn std::any::Any + Send + Sync>>,
}

impl Registry {
    /// Give every layer of `kind` the option `name = value` unless its
    /// spec sets it.
    pub fn set_default(&mut self, kind: &str, name: &str, value: impl Into<String>) {
        self.defaults
            .entry(kind.to_string())
            .or_default()
            .insert(name.to_string(), value.into());
    }

    /// Hand every layer `value` (it replaces one of the same type).
    pub fn set_context<T: std::any::Any + Send + Sync>(&mut self, value: T) {
        self.contexts.retain(|c| !c.is::<T>());
        self.contexts.push(std::sync::Arc::new(value));
    }

    /// The setting of type `T` the program handed the layers, if any.
    pub fn context<T: std::any::Any + Send + Sync>(&self) -> Option<&T> {
        self.contexts.iter().find_map(|c| c.downcast_ref::<T>())
    }

    /// A spec's parameters with the defaults of its kind filled in.
    pub fn params_of(&self, spec: &LayerSpec) -> BTreeMap<String, String> {
        let mut p = spec.params.clone();
        if let Some(d) = self.defaults.get(&spec.kind) {
            for (k, v) in d {
                p.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        p
    }

    /// Add a layer kind (later crates register theirs).
    pub fn add(&mut self, kind: &'static LayerKind) {
        self.kinds.retain(|k| k.name != kind.name);
        self.kinds.push(kind);
    }

    /// Read a spec (or an inner spec) starting with `prefix` (a URI
    /// scheme such as `nbd://`) as `KIND:` followed by the whole string:
    /// `cow:o.img:nbd+unix:///?socket=/s` is `cow:o.img:nbd:nbd+unix:///?socket=/s`.
    /// `kind` must be a registered bottom layer with one argument.
    pub fn add_scheme(&mut self, prefix: &'static str, kind: &'static str) {
        self.schemes.retain(|(p, _)| *p != prefix);
        self.schemes.push((prefix, kind));
    }

    /// The layer kind a URI-like spec string belongs to, if any.
    pub fn scheme_of(&self, s: &str) -> Option<&'static str> {
        self.schemes
            .iter()
            .find(|(p, _)| s.starts_with(p))
            .map(|(_, k)| *k)
    }

    pub fn get(&self, name: &str) -> Option<&'static LayerKind> {
        self.kinds.iter().copied().find(|k| k.name == name)
    }

    pub fn kinds(&self) -> impl Iterator<Item = &'static LayerKind> + '_ {
        self.kinds.iter().copied()
    }

    fn known(&self) -> String {
        self.kinds
            .iter()
            .map(|k| k.name)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Parse a stack from its string form. A string that names no known
    /// layer but is an existing path is read as `raw:PATH`; one ending in
    /// `.toml` (or starting with `@`) is read as a TOML stack file.
    pub fn parse(&self, s: &str) -> Result<LayerSpec> {
        if let Some(file) = s.strip_prefix('@') {
            return self.parse_toml_file(std::path::Path::new(file));
        }
        if s.ends_with(".toml") && std::path::Path::new(s).is_file() {
            return self.parse_toml_file(std::path::Path::new(s));
        }
        self.parse_str(s, s)
    }

    fn parse_str(&self, s: &str, whole: &str) -> Result<LayerSpec> {
        let bad = |m: String| {
            Error::new(
                ErrorKind::InvalidArgument,
                Op::Open,
                "spec",
                format!("in '{whole}': {m}"),
            )
        };
        if let Some(k) = self.scheme_of(s).and_then(|k| self.get(k)) {
            if let ([arg], false) = (k.args, k.wraps) {
                let mut params = BTreeMap::new();
                params.insert(arg.to_string(), s.to_string());
                return Ok(LayerSpec {
                    kind: k.name.into(),
                    params,
                    next: None,
                });
            }
        }
        let head_end = s.find([':', '[']).unwrap_or(s.len());
        let name = &s[..head_end];
        let Some(kind) = self.get(name) else {
            if std::path::Path::new(s).exists() {
                let mut params = BTreeMap::new();
                params.insert("path".to_string(), s.to_string());
                return Ok(LayerSpec {
                    kind: "raw".into(),
                    params,
                    next: None,
                });
            }
            return Err(bad(format!(
                "unknown layer '{name}' (known: {}); a plain path must exist to be used as raw",
                self.known()
            )));
        };
        let mut params = BTreeMap::new();
        let mut rest = &s[head_end..];
        if let Some(r) = rest.strip_prefix('[') {
            let close = r
                .find(']')
                .ok_or_else(|| bad(format!("'{name}[' has no closing ']'")))?;
            for opt in r[..close].split(',').filter(|o| !o.trim().is_empty()) {
                let (k, v) = opt
                    .split_once('=')
                    .ok_or_else(|| bad(format!("option '{opt}' is not NAME=VALUE")))?;
                let k = k.trim();
                if !kind.options.iter().any(|(n, _)| *n == k) {
                    let known: Vec<_> = kind.options.iter().map(|(n, _)| *n).collect();
                    return Err(bad(format!(
                        "layer '{name}' has no option '{k}' (options: {})",
                        known.join(", ")
                    )));
                }
                params.insert(k.to_string(), v.trim().to_string());
            }
            rest = &r[close + 1..];
        }
        let usage = || kind.usage(false);
        if kind.args.is_empty() && !kind.wraps {
            if !rest.is_empty() {
                return Err(bad(format!("layer '{name}' takes no arguments")));
            }
            return Ok(LayerSpec {
                kind: name.into(),
                params,
                next: None,
            });
        }
        rest = rest
            .strip_prefix(':')
            .ok_or_else(|| bad(format!("expected ':' after '{name}' (usage: {})", usage())))?;
        for (i, arg) in kind.args.iter().enumerate() {
            if let (0, Some(o)) = (i, &kind.optional_first) {
                if !(o.is_one)(&split_escaped(rest).0) {
                    params.insert(arg.to_string(), o.default.to_string());
                    continue;
                }
            }
            let last_verbatim = !kind.wraps && i + 1 == kind.args.len();
            if last_verbatim {
                if rest.is_empty() {
                    return Err(bad(format!(
                        "missing {} (usage: {})",
                        arg.to_uppercase(),
                        usage()
                    )));
                }
                params.insert(arg.to_string(), rest.to_string());
                rest = "";
            } else {
                let (val, after) = split_escaped(rest);
                if val.is_empty() {
                    return Err(bad(format!(
                        "missing {} (usage: {})",
                        arg.to_uppercase(),
                        usage()
                    )));
                }
                params.insert(arg.to_string(), val);
                rest = after.unwrap_or("");
                if after.is_none() && (i + 1 < kind.args.len() || kind.wraps) {
                    return Err(bad(format!("too few arguments (usage: {})", usage())));
                }
            }
        }
        let next = if kind.wraps {
            if rest.is_empty() {
                return Err(bad(format!(
                    "layer '{name}' needs an inner stack (usage: {})",
                    usage()
                )));
            }
            Some(Box::new(self.parse_str(rest, whole)?))
        } else {
            None
        };
        Ok(LayerSpec {
            kind: name.into(),
            params,
            next,
        })
    }

    fn parse_toml_file(&self, path: &std::path::Path) -> Result<LayerSpec> {
        let text =
            std::fs::read_to_string(path).map_err(|e| Error::io(Op::Open, "spec", e).path(path))?;
        let v: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            Error::new(
                ErrorKind::InvalidArgument,
                Op::Open,
                "spec",
                format!("bad TOML: {}", e.message()),
            )
            .path(path)
        })?;
        self.from_toml(&v).map_err(|e| e.path(path))
    }

    /// Build a spec from a TOML table (`kind = ...`, parameters, `[next]`),
    /// or from a table with a `stack = "STRING"` key.
    pub fn from_toml(&self, t: &toml::Table) -> Result<LayerSpec> {
        let bad = |m: String| Error::new(ErrorKind::InvalidArgument, Op::Open, "spec", m);
        if let Some(s) = t.get("stack") {
            let s = s
                .as_str()
                .ok_or_else(|| bad("'stack' must be a string".into()))?;
            return self.parse_str(s, s);
        }
        let kind_name = t.get("kind").and_then(|k| k.as_str()).ok_or_else(|| {
            bad("a layer table needs kind = \"...\" (or stack = \"SPEC\")".into())
        })?;
        let kind = self.get(kind_name).ok_or_else(|| {
            bad(format!(
                "unknown layer '{kind_name}' (known: {})",
                self.known()
            ))
        })?;
        let mut params = BTreeMap::new();
        let mut next = None;
        for (k, v) in t {
            match k.as_str() {
                "kind" => {}
                "next" => {
                    let nt = v
                        .as_table()
                        .ok_or_else(|| bad("'next' must be a table".into()))?;
                    next = Some(Box::new(self.from_toml(nt)?));
                }
                _ => {
                    let known =
                        kind.args.contains(&k.as_str()) || kind.options.iter().any(|(n, _)| n == k);
                    if !known {
                        return Err(bad(format!("layer '{kind_name}' has no parameter '{k}'")));
                    }
                    let val = match v {
                        toml::Value::String(s) => s.clone(),
                        toml::Value::Integer(i) => i.to_string(),
                        toml::Value::Boolean(b) => b.to_string(),
                        _ => {
                            return Err(bad(format!(
                                "parameter '{k}' must be a string, integer or boolean"
                            )))
                        }
                    };
                    params.insert(k.clone(), val);
                }
            }
        }
        if let (Some(o), Some(first)) = (&kind.optional_first, kind.args.first()) {
            if !params.contains_key(*first) {
                params.insert(first.to_string(), o.default.to_string());
            }
        }
        for a in kind.args {
            if !params.contains_key(*a) {
                return Err(bad(format!("layer '{kind_name}' needs '{a}'")));
            }
        }
        if kind.wraps != next.is_some() {
            return Err(bad(if kind.wraps {
                format!("layer '{kind_name}' needs a [next] table")
            } else {
                format!("layer '{kind_name}' does not wrap another layer")
            }));
        }
        Ok(LayerSpec {
            kind: kind_name.into(),
            params,
            next,
        })
    }

    /// Open a parsed stack, bottom layer first, without the validation
    /// layer (for callers that wrap it further; most want
    /// [`Registry::build_spec`]).
    pub fn open(&self, spec: &LayerSpec, access: Access) -> Result<Arc<dyn BlockDev>> {
        self.open_layer(spec, access.is_read_only())
    }

    /// Parse layers that wrap a device given later ([`Registry::open_over`]):
    /// the string form without a bottom layer, `hdd[head=srv]` or
    /// `throttle[rate=1G]:hdd`. Every layer must wrap another.
    pub fn parse_over(&self, s: &str) -> Result<LayerSpec> {
        let bad = |m: String| Error::new(ErrorKind::InvalidArgument, Op::Open, "spec", m);
        // The grammar wants a bottom layer: parse over a stand-in one,
        // then cut it off.
        let mut spec = self.parse(&format!("{s}:mem:1"))?;
        let mut l = &mut spec;
        loop {
            let wraps = self.get(&l.kind).is_some_and(|k| k.wraps);
            let inner = l.next.as_deref();
            let stand_in = inner.is_some_and(|n| {
                n.next.is_none()
                    && n.kind == "mem"
                    && n.params.get("size").map(String::as_str) == Some("1")
            });
            if !wraps || inner.is_none() {
                return Err(bad(format!(
                    "layer '{}' does not wrap another: only wrapping layers go over a device",
                    l.kind
                )));
            }
            if stand_in {
                l.next = None;
                return Ok(spec);
            }
            l = l.next.as_deref_mut().expect("checked above");
        }
    }

    /// Open a stack of wrapping layers whose innermost layer names no
    /// next layer over `bottom`, an open device: `hdd[head=srv]` over a
    /// client's view. Errors if the innermost layer does not wrap, or
    /// names a next layer of its own.
    pub fn open_over(
        &self,
        spec: &LayerSpec,
        access: Access,
        bottom: Arc<dyn BlockDev>,
    ) -> Result<Arc<dyn BlockDev>> {
        let bad = |m: String| Error::new(ErrorKind::InvalidArgument, Op::Open, "spec", m);
        let kind = self
            .get(&spec.kind)
            .ok_or_else(|| bad(format!("unknown layer '{}'", spec.kind)))?;
        if !kind.wraps {
            return Err(bad(format!(
                "layer '{}' does not wrap another: it cannot go over a device",
                spec.kind
            )));
        }
        let next = match &spec.next {
            Some(n) => self.open_over(n, access, bottom)?,
            None => bottom,
        };
        let params = self.params_of(spec);
        let ctx = OpenCtx {
            read_only: access.is_read_only(),
            params: &params,
            registry: self,
        };
        (kind.open)(&ctx, Some(next))
    }

    fn open_layer(&self, spec: &LayerSpec, read_only: bool) -> Result<Arc<dyn BlockDev>> {
        let kind = self.get(&spec.kind).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidArgument,
                Op::Open,
                "spec",
                format!("unknown layer '{}'", spec.kind),
            )
        })?;
        let next = match &spec.next {
            Some(n) => Some(self.open_layer(n, read_only || kind.inner_read_only)?),
            None => None,
        };
        let params = self.params_of(spec);
        let ctx = OpenCtx {
            read_only,
            params: &params,
            registry: self,
        };
        (kind.open)(&ctx, next)
    }

    /// Parse and open a stack, with the validation layer on top.
    pub fn build(&self, s: &str, access: Access) -> Result<Arc<crate::Checked>> {
        self.build_spec(&self.parse(s)?, access)
    }

    /// Open a parsed stack (a spec string or a TOML table), with the
    /// validation layer on top.
    pub fn build_spec(&self, spec: &LayerSpec, access: Access) -> Result<Arc<crate::Checked>> {
        let dev = self.open(spec, access)?;
        Ok(Arc::new(crate::Checked::new(dev, access)))
    }
}

/// Split at the first unescaped ':'; unescape `\:` and `\\`.
fn split_escaped(s: &str) -> (String, Option<&str>) {
    let mut out = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some((_, n)) => out.push(n),
                None => out.push('\\'),
            },
            ':' => return (out, Some(&s[i + 1..])),
            _ => out.push(c),
        }
    }
    (out, None)
}

impl Registry {
    /// The string form of a spec; parses back to an equal spec.
    pub fn to_string_form(&self, spec: &LayerSpec) -> String {
        let Some(kind) = self.get(&spec.kind) else {
            return spec.kind.clone();
        };
        let mut s = spec.kind.clone();
        let opts: Vec<String> = spec
            .params
            .iter()
            .filter(|(k, _)| !kind.args.contains(&k.as_str()))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        if !opts.is_empty() {
            s.push('[');
            s.push_str(&opts.join(","));
            s.push(']');
        }
        for (i, a) in kind.args.iter().enumerate() {
            s.push(':');
            let v = spec.params.get(*a).cloned().unwrap_or_default();
            if !kind.wraps && i + 1 == kind.args.len() {
                s.push_str(&v);
            } else {
                s.push_str(&v.replace('\\', "\\\\").replace(':', "\\:"));
            }
        }
        if let Some(n) = &spec.next {
            s.push(':');
            s.push_str(&self.to_string_form(n));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parsing refuses a wrapping layer without its inner stack; a spec
    /// built by hand reaches the layer's `open`, which refuses it too.
    #[test]
    fn a_wrapping_layer_without_its_inner_stack_is_refused() {
        let r = Registry::with_builtin();
        for kind in ["cow", "throttle", "hdd"] {
            let mut params = BTreeMap::new();
            params.insert("overlay".to_string(), "/nonexistent/o".to_string());
            let spec = LayerSpec {
                kind: kind.into(),
                params,
                next: None,
            };
            let Err(e) = r.open(&spec, Access::ReadWrite) else {
                panic!("{kind} opened without an inner stack");
            };
            assert_eq!((e.kind(), e.layer()), (ErrorKind::InvalidArgument, kind));
            assert!(e.to_string().contains("needs an inner stack"), "{e}");
        }
    }

    #[test]
    fn nested_spec_parses() {
        let r = Registry::with_builtin();
        let s = r
            .parse("cow[cluster=128K]:/tmp/o\\:x.img:raw:/tmp/base:with:colons")
            .unwrap();
        assert_eq!(s.kind, "cow");
        assert_eq!(s.params["overlay"], "/tmp/o:x.img");
        assert_eq!(s.params["cluster"], "128K");
        let n = s.next.as_ref().unwrap();
        assert_eq!(n.kind, "raw");
        assert_eq!(n.params["path"], "/tmp/base:with:colons");
        assert_eq!(r.parse(&r.to_string_form(&s)).unwrap(), s);
    }

    #[test]
    fn errors_are_helpful() {
        let r = Registry::with_builtin();
        let e = r.parse("nosuch:x").unwrap_err().to_string();
        assert!(
            e.contains("unknown layer 'nosuch'") && e.contains("raw"),
            "{e}"
        );
        let e = r.parse("cow:/tmp/o").unwrap_err().to_string();
        assert!(e.contains("usage: cow:OVERLAY:NEXT"), "{e}");
        let e = r.parse("cow[bogus=1]:/a:mem:1M").unwrap_err().to_string();
        assert!(e.contains("no option 'bogus'"), "{e}");
    }

    #[test]
    fn uris_are_whole_arguments() {
        fn open(_: &OpenCtx<'_>, _: Option<Arc<dyn BlockDev>>) -> Result<Arc<dyn BlockDev>> {
            unreachable!()
        }
        static URI: LayerKind = LayerKind {
            name: "nbd",
            summary: "",
            args: &["uri"],
            options: &[],
            open,
            ..LayerKind::BOTTOM
        };
        let mut r = Registry::with_builtin();
        r.add(&URI);
        r.add_scheme("nbd+unix://", "nbd");
        r.add_scheme("nbd://", "nbd");
        let unix = "nbd+unix:///?socket=/tmp/s.sock";
        let tcp = "nbd://127.0.0.1:10809/vm1";
        for (s, uri) in [
            (format!("nbd:{unix}"), unix),
            (unix.to_string(), unix),
            (format!("nbd:{tcp}"), tcp),
            (tcp.to_string(), tcp),
        ] {
            let spec = r.parse(&s).unwrap();
            assert_eq!(
                (spec.kind.as_str(), spec.params["uri"].as_str()),
                ("nbd", uri)
            );
            assert!(spec.next.is_none());
            assert_eq!(r.parse(&r.to_string_form(&spec)).unwrap(), spec);
        }
        for s in [
            format!("cow:ov.img:{unix}"),
            format!("cow:ov.img:nbd:{unix}"),
        ] {
            let spec = r.parse(&s).unwrap();
            assert_eq!(spec.kind, "cow");
            assert_eq!(spec.params["overlay"], "ov.img");
            let n = spec.next.as_ref().unwrap();
            assert_eq!((n.kind.as_str(), n.params["uri"].as_str()), ("nbd", unix));
        }
    }

    #[test]
    fn a_built_stack_hands_out_its_layers_by_type() {
        let r = Registry::with_builtin();
        let dev = r.build("mem:1M", Access::ReadWrite).unwrap();
        let mem = crate::find_layer::<crate::layers::mem::MemDev>(dev.as_ref()).unwrap();
        assert_eq!(mem.size(), 1 << 20);
        assert!(crate::find_layer::<crate::layers::raw::RawDev>(dev.as_ref()).is_none());
    }

    #[test]
    fn toml_form_equals_string_form() {
        let r = Registry::with_builtin();
        let t: toml::Table = r#"
            kind = "cow"
            overlay = "/tmp/o.img"
            [next]
            kind = "mem"
            size = "1M"
        "#
        .parse()
        .unwrap();
        assert_eq!(
            r.from_toml(&t).unwrap(),
            r.parse("cow:/tmp/o.img:mem:1M").unwrap()
        );
    }

    #[test]
    fn parse_over_takes_wrapping_layers_without_a_bottom() {
        let r = Registry::with_builtin();
        let spec = r.parse_over("throttle[rate=1G]:hdd[head=x]").unwrap();
        assert_eq!(spec.kind, "throttle");
        let inner = spec.next.as_deref().unwrap();
        assert_eq!((inner.kind.as_str(), inner.next.is_none()), ("hdd", true));
        for (s, want) in [
            ("raw:x.img", "'raw' does not wrap"),
            ("hdd:raw:x.img", "'raw' does not wrap"),
        ] {
            let e = r.parse_over(s).unwrap_err().to_string();
            assert!(e.contains(want), "{s}: {e}");
        }
        let dev = r
            .open_over(
                &spec,
                Access::ReadWrite,
                Arc::new(crate::layers::mem::MemDev::new(4096)),
            )
            .unwrap();
        assert_eq!((dev.layer(), dev.size()), ("throttle", 4096));
    }
}
