//! The users file of `roamdisk store serve --users FILE`: who may use the
//! chunk server (each user's token hash, admin flag, revoked flag) and
//! which of other users' catalogs each may read or write; and the rules
//! that decide a request from it. Format (TOML, parsed defensively: size
//! limit, magic, version, no unknown fields, every name checked):
//! `docs/formats/cas-http.md`, "The users file". Parsing is pure (a fuzz
//! target); [`edit`] is how `roamdisk store user ...` changes the file.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use roamdisk_blockdev::{Op, Result};
use roamdisk_chunkstore::error::{bad_arg, corrupt, io, not_found};
use roamdisk_chunkstore::store::{check_ref_name, is_name_part};
use roamdisk_chunkstore::token::{bad_name, Token, TokenHash};

pub const FORMAT: &str = "roamdisk-store-users";
pub const VERSION: u32 = 1;
/// Largest users file read, in bytes.
pub const MAX_FILE: usize = 4 << 20;
/// Most grants (read and write together) of one user.
pub const MAX_GRANTS: usize = 4096;

/// Every user of a chunk server, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Users {
    pub users: BTreeMap<String, User>,
}

/// One user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// The hash of the user's token.
    pub token: TokenHash,
    /// May list and remove objects, list leases, recover (gc), and read
    /// every catalog.
    pub admin: bool,
    /// The token is refused (the user stays listed).
    pub revoked: bool,
    /// Other users' catalogs this user may read: `OWNER/IMAGE` or
    /// `OWNER/*`. Sorted, unique, none also in `write`.
    pub read: Vec<String>,
    /// Other users' catalogs this user may read and write.
    pub write: Vec<String>,
}

/// A request an authenticated user may not make: who, and what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Forbidden(pub String);

/// What a request needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need<'a> {
    /// Any user with a valid token (chunks, have, sync, leases, settings).
    User,
    /// Read catalog `USER/IMAGE`.
    Read(&'a str),
    /// Replace or remove catalog `USER/IMAGE`.
    Write(&'a str),
    /// An admin; the text says what for ("list objects").
    Admin(&'a str),
}

/// A refused token: `reason` is logged, `answer` is told the client
/// (which learns nothing about which users exist).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied {
    pub reason: String,
    pub answer: String,
}

/// Whether `grant` (`OWNER/IMAGE` or `OWNER/*`) covers `catalog`.
fn covers(grant: &str, catalog: &str) -> bool {
    match grant.strip_suffix("/*") {
        Some(owner) => catalog.split_once('/').is_some_and(|(o, _)| o == owner),
        None => grant == catalog,
    }
}

/// Check a grant: `OWNER/IMAGE` or `OWNER/*`.
pub fn check_grant(grant: &str) -> Result<()> {
    match grant.strip_suffix("/*") {
        Some(owner) if is_name_part(owner) => Ok(()),
        Some(_) => Err(bad_arg(format!("'{grant}' is not USER/IMAGE or USER/*"))),
        None => check_ref_name(grant),
    }
}

fn owner_of(catalog: &str) -> &str {
    catalog.split_once('/').map(|(o, _)| o).unwrap_or(catalog)
}

impl User {
    fn new(token: TokenHash, admin: bool) -> User {
        User {
            token,
            admin,
            revoked: false,
            read: Vec::new(),
            write: Vec::new(),
        }
    }
}

impl Users {
    /// The user a bearer token (the `Authorization` header's value after
    /// `Bearer `) belongs to, if it is valid and not revoked.
    pub fn authenticate(&self, bearer: Option<&str>) -> std::result::Result<&str, Denied> {
        let deny = |reason: String, answer: &str| Denied {
            reason,
            answer: answer.to_string(),
        };
        let invalid = "the token is not valid: check --token-file";
        let Some(text) = bearer else {
            return Err(deny(
                "no token".into(),
                "this store needs a token (Authorization: Bearer USER.SECRET): give --token-file",
            ));
        };
        let Ok(token) = Token::parse(text) else {
            return Err(deny("malformed token".into(), invalid));
        };
        let Some((name, user)) = self.users.get_key_value(token.user()) else {
            return Err(deny(
                format!("token for unknown user '{}'", token.user()),
                invalid,
            ));
        };
        if user.token != token.hash() {
            return Err(deny(format!("wrong token for user {name}"), invalid));
        }
        if user.revoked {
            return Err(deny(
                format!("revoked token of user {name}"),
                &format!("the token of user {name} is revoked"),
            ));
        }
        Ok(name)
    }

    /// Whether authenticated `user` may do what `need` says; the refusal
    /// names the user and the catalog.
    pub fn authorize(&self, user: &str, need: Need<'_>) -> std::result::Result<(), Forbidden> {
        let ok = match need {
            Need::User => true,
            Need::Read(c) => self.may_read(user, c),
            Need::Write(c) => self.may_write(user, c),
            Need::Admin(_) => self.users.get(user).is_some_and(|u| u.admin),
        };
        if ok {
            return Ok(());
        }
        Err(Forbidden(match need {
            Need::Read(c) => format!("user {user} may not read catalog {c}"),
            Need::Write(c) => format!("user {user} may not write catalog {c}"),
            Need::Admin(what) => format!("user {user} may not {what}: that needs an admin"),
            Need::User => unreachable!("every user may"),
        }))
    }

    /// Own catalogs, catalogs shared with the user, and (admins) all.
    pub fn may_read(&self, user: &str, catalog: &str) -> bool {
        let Some(u) = self.users.get(user) else {
            return false;
        };
        u.admin
            || owner_of(catalog) == user
            || u.read.iter().chain(&u.write).any(|g| covers(g, catalog))
    }

    /// Own catalogs and catalogs shared with the user for writing.
    pub fn may_write(&self, user: &str, catalog: &str) -> bool {
        let Some(u) = self.users.get(user) else {
            return false;
        };
        owner_of(catalog) == user || u.write.iter().any(|g| covers(g, catalog))
    }

    fn get_mut(&mut self, name: &str) -> Result<&mut User> {
        self.users
            .get_mut(name)
            .ok_or_else(|| not_found(format!("no user {name} in the users file")))
    }

    /// A new user with this token hash.
    pub fn add(&mut self, name: &str, token: TokenHash, admin: bool) -> Result<()> {
        if !is_name_part(name) {
            return Err(bad_name(name));
        }
        if self.users.contains_key(name) {
            return Err(bad_arg(format!(
                "user {name} exists; `roamdisk store user token {name}` gives them a new token"
            )));
        }
        self.users.insert(name.to_string(), User::new(token, admin));
        Ok(())
    }

    /// Replace a user's token (a revoked user is let in again).
    pub fn set_token(&mut self, name: &str, token: TokenHash) -> Result<()> {
        let u = self.get_mut(name)?;
        u.token = token;
        u.revoked = false;
        Ok(())
    }

    /// Refuse a user's token from now on.
    pub fn revoke(&mut self, name: &str) -> Result<()> {
        self.get_mut(name)?.revoked = true;
        Ok(())
    }

    /// Let `with` read (or read and write) the catalogs `grant` covers.
    pub fn share(&mut self, grant: &str, with: &str, write: bool) -> Result<()> {
        check_grant(grant)?;
        let u = self.get_mut(with)?;
        u.read.retain(|g| g != grant);
        u.write.retain(|g| g != grant);
        let list = if write { &mut u.write } else { &mut u.read };
        list.push(grant.to_string());
        list.sort();
        if u.read.len() + u.write.len() > MAX_GRANTS {
            return Err(bad_arg(format!(
                "user {with} has {MAX_GRANTS} grants already"
            )));
        }
        Ok(())
    }

    /// Take back a grant; false if `with` did not have it.
    pub fn unshare(&mut self, grant: &str, with: &str) -> Result<bool> {
        let u = self.get_mut(with)?;
        let n = u.read.len() + u.write.len();
        u.read.retain(|g| g != grant);
        u.write.retain(|g| g != grant);
        Ok(u.read.len() + u.write.len() != n)
    }

    pub fn to_toml(&self) -> String {
        let f = File {
            format: FORMAT.into(),
            version: VERSION,
            user: self
                .users
                .iter()
                .map(|(n, u)| {
                    (
                        n.clone(),
                        FileUser {
                            token: u.token.to_text(),
                            admin: u.admin,
                            revoked: u.revoked,
                            read: u.read.clone(),
                            write: u.write.clone(),
                        },
                    )
                })
                .collect(),
        };
        format!(
            "# roamdisk store users: docs/formats/cas-http.md (edit with `roamdisk store user`)\n{}",
            toml::to_string(&f).expect("serialisable")
        )
    }

    /// Parse a users file's text.
    pub fn parse(text: &str) -> Result<Users> {
        if text.len() > MAX_FILE {
            return Err(corrupt(format!(
                "the users file is {} bytes, more than {MAX_FILE}",
                text.len()
            )));
        }
        let table: toml::Table = toml::from_str(text)
            .map_err(|e| corrupt(format!("the users file is not valid TOML: {}", e.message())))?;
        match table.get("format").and_then(|v| v.as_str()) {
            Some(FORMAT) => {}
            other => {
                return Err(corrupt(format!(
                    "not a users file: format is {other:?}, not \"{FORMAT}\""
                )))
            }
        }
        match table.get("version").and_then(|v| v.as_integer()) {
            Some(v) if v == i64::from(VERSION) => {}
            other => {
                return Err(corrupt(format!(
                    "users file version {other:?} (this build reads {VERSION})"
                )))
            }
        }
        let f: File = toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| corrupt(format!("the users file: {}", e.message())))?;
        let mut users = Users::default();
        for (name, fu) in f.user {
            if !is_name_part(&name) {
                return Err(corrupt(format!("the users file: {}", bad_name(&name))));
            }
            let token = TokenHash::parse(&fu.token).ok_or_else(|| {
                corrupt(format!(
                    "the users file: user {name}'s token is not blake3:HEX (64 hex digits)"
                ))
            })?;
            if fu.read.len() + fu.write.len() > MAX_GRANTS {
                return Err(corrupt(format!(
                    "the users file: user {name} has more than {MAX_GRANTS} grants"
                )));
            }
            let mut u = User::new(token, fu.admin);
            u.revoked = fu.revoked;
            for (list, write) in [(&fu.write, true), (&fu.read, false)] {
                for g in list {
                    check_grant(g).map_err(|e| {
                        corrupt(format!("the users file: user {name}: {}", e.message()))
                    })?;
                    if write || !u.write.contains(g) {
                        let l = if write { &mut u.write } else { &mut u.read };
                        l.push(g.clone());
                    }
                }
            }
            for l in [&mut u.read, &mut u.write] {
                l.sort();
                l.dedup();
            }
            users.users.insert(name, u);
        }
        Ok(users)
    }

    /// Read and parse a users file.
    pub fn load(path: &Path) -> Result<Users> {
        let text = std::fs::read(path).map_err(|e| io(Op::Open, e, path))?;
        let text = String::from_utf8(text)
            .map_err(|_| corrupt("the users file is not UTF-8").path(path))?;
        Users::parse(&text).map_err(|e| e.path(path))
    }
}

/// Change the users file at `path` with `f`, under an exclusive lock
/// (`PATH.lock`) so concurrent edits do not lose each other; the file is
/// replaced atomically and keeps its mode (0600 when new). With `create`,
/// a missing file starts empty.
pub fn edit<T>(path: &Path, create: bool, f: impl FnOnce(&mut Users) -> Result<T>) -> Result<T> {
    let lock_path = roamdisk_blockdev::durable::with_suffix(path, ".lock");
    let _lock = roamdisk_chunkstore::error::lock_exclusive(&lock_path)?;
    let (mut users, mode) = match std::fs::metadata(path) {
        Ok(m) => (Users::load(path)?, m.permissions().mode() & 0o7777),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => (Users::default(), 0o600),
        Err(e) => {
            return Err(io(Op::Open, e, path)
                .msg("no users file (`roamdisk store user add USER --users FILE` creates one)"))
        }
    };
    let out = f(&mut users)?;
    roamdisk_blockdev::durable::write_atomically(path, users.to_toml().as_bytes())
        .and_then(|_| std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)))
        .map_err(|e| io(Op::Write, e, path))?;
    Ok(out)
}

/// The file as written (and read): `[user.NAME]` tables.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    format: String,
    version: u32,
    #[serde(default)]
    user: BTreeMap<String, FileUser>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileUser {
    token: String,
    #[serde(default)]
    admin: bool,
    #[serde(default)]
    revoked: bool,
    #[serde(default)]
    read: Vec<String>,
    #[serde(default)]
    write: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two() -> (Users, Token, Token) {
        let mut u = Users::default();
        let (a, b) = (
            Token::generate("alice").unwrap(),
            Token::generate("bob").unwrap(),
        );
        u.add("alice", a.hash(), false).unwrap();
        u.add("bob", b.hash(), true).unwrap();
        (u, a, b)
    }

    #[test]
    fn tokens_and_rules() {
        let (mut u, a, b) = two();
        assert_eq!(u.authenticate(Some(a.as_str())), Ok("alice"));
        assert!(u.authenticate(None).is_err());
        let forged = format!("alice.{}", &b.as_str()[4..]);
        assert!(u.authenticate(Some(&forged)).is_err());
        assert!(u.may_read("alice", "alice/vm") && u.may_write("alice", "alice/vm"));
        assert!(!u.may_read("alice", "bob/vm"));
        assert!(u.may_read("bob", "alice/vm"), "admins read every catalog");
        assert!(!u.may_write("bob", "alice/vm"), "but write only their own");
        assert!(u.authorize("alice", Need::Admin("list objects")).is_err());
        u.share("bob/*", "alice", false).unwrap();
        assert!(u.may_read("alice", "bob/vm") && !u.may_write("alice", "bob/vm"));
        assert!(!u.may_read("alice", "bobby/vm"));
        u.share("bob/vm", "alice", true).unwrap();
        assert!(u.may_write("alice", "bob/vm") && !u.may_write("alice", "bob/other"));
        assert_eq!(
            u.authorize("alice", Need::Write("bob/other")),
            Err(Forbidden(
                "user alice may not write catalog bob/other".into()
            ))
        );
        u.revoke("alice").unwrap();
        let d = u.authenticate(Some(a.as_str())).unwrap_err();
        assert!(d.answer.contains("revoked"), "{d:?}");
        assert!(u.add("alice", a.hash(), false).is_err());
        assert!(u.share("bob/x/y", "alice", false).is_err());
        assert!(u.unshare("bob/*", "alice").unwrap());
        assert!(!u.unshare("bob/*", "alice").unwrap());
    }

    #[test]
    fn file_round_trips_and_rejects() {
        let (mut u, _, _) = two();
        u.share("bob/*", "alice", false).unwrap();
        u.share("carol/vm", "alice", true).unwrap();
        u.revoke("bob").unwrap();
        let t = u.to_toml();
        assert_eq!(Users::parse(&t).unwrap(), u, "{t}");
        let e = Users::parse(&t.replace("version = 1", "version = 2")).unwrap_err();
        assert!(e.to_string().contains("version Some(2)"), "{e}");
        for bad in [
            "",
            "format = \"roamdisk-store-users\"\nversion = 1\n[user.alice]\ntoken = \"x\"\n",
            "format = \"roamdisk-chunk-store\"\nversion = 1\n",
            "format = \"roamdisk-store-users\"\nversion = 1\nextra = 1\n",
            "format = \"roamdisk-store-users\"\nversion = 1\n[user.\"a/b\"]\ntoken = \"blake3:0000000000000000000000000000000000000000000000000000000000000000\"\n",
        ] {
            assert!(Users::parse(bad).is_err(), "{bad}");
        }
        let both = t.replace("read = [\"bob/*\"]", "read = [\"bob/*\", \"carol/vm\"]");
        assert_eq!(Users::parse(&both).unwrap(), u, "write wins over read");
    }
}
