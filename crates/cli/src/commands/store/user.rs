//! `roamdisk store user`: the users file of a chunk server (`roamdisk
//! store serve --users FILE`): add a user with a new token, give one a new
//! token, revoke, share catalogs, list.

use std::path::{Path, PathBuf};

use clap::{Args as ClapArgs, Parser, Subcommand};
use roamdisk_chunkserver::users::{self, Users};
use roamdisk_chunkstore::token::Token;

/// Users of a chunk server: who may connect (each with a token), who is
/// an admin (gc, store info), which catalogs are shared with whom. A user
/// reads and writes their own catalogs (USER/...) and those shared with
/// them; chunks are shared by all. The file keeps only token hashes; a new
/// token is shown once (or written to --token-file, mode 0600). The server
/// reads the file again when it changes: a revoked token is refused from
/// the next request on.
///
/// Examples:
///   roamdisk store user add alice --users /srv/users.toml --token-file alice.token
///   roamdisk store user add root --admin --users /srv/users.toml
///   roamdisk store user share bob/golden --with alice --users /srv/users.toml
///   roamdisk store user share bob/* --with carol --write --users /srv/users.toml
///   roamdisk store user revoke alice --users /srv/users.toml
///   roamdisk store user token alice --users /srv/users.toml --token-file alice2.token
///   roamdisk store user list --users /srv/users.toml
#[derive(Subcommand)]
#[command(verbatim_doc_comment)]
pub enum Cmd {
    Add(AddArgs),
    Token(TokenArgs),
    Revoke(RevokeArgs),
    Share(ShareArgs),
    Unshare(UnshareArgs),
    List(ListArgs),
}

/// The users file.
#[derive(ClapArgs)]
pub struct UsersFile {
    /// The users file the server reads (`store serve --users FILE`).
    #[arg(long, value_name = "FILE")]
    users: PathBuf,
}

/// Where a new token goes.
#[derive(ClapArgs)]
pub struct TokenOut {
    /// Write the token to this new file (mode 0600) instead of stdout.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
}

/// Add a user with a new token (creates the users file if needed).
#[derive(Parser)]
pub struct AddArgs {
    user: String,
    /// May list and remove objects (gc), list leases, read every catalog.
    #[arg(long)]
    admin: bool,
    #[command(flatten)]
    file: UsersFile,
    #[command(flatten)]
    out: TokenOut,
}

/// Give a user a new token: the old one stops working (a revoked user is
/// let in again with the new one).
#[derive(Parser)]
pub struct TokenArgs {
    user: String,
    #[command(flatten)]
    file: UsersFile,
    #[command(flatten)]
    out: TokenOut,
}

/// Refuse a user's token from the next request on.
#[derive(Parser)]
pub struct RevokeArgs {
    user: String,
    #[command(flatten)]
    file: UsersFile,
}

/// Share catalogs with a user: OWNER/IMAGE or OWNER/* (all of OWNER's),
/// read-only unless --write.
#[derive(Parser)]
pub struct ShareArgs {
    /// OWNER/IMAGE or OWNER/*.
    catalogs: String,
    /// The user who may read them.
    #[arg(long, value_name = "USER")]
    with: String,
    /// May also write them (commit, tag, rm).
    #[arg(long)]
    write: bool,
    #[command(flatten)]
    file: UsersFile,
}

/// Take back a share.
#[derive(Parser)]
pub struct UnshareArgs {
    /// OWNER/IMAGE or OWNER/*, as shared.
    catalogs: String,
    #[arg(long, value_name = "USER")]
    with: String,
    #[command(flatten)]
    file: UsersFile,
}

/// List the users, their roles and shares (never tokens).
#[derive(Parser)]
pub struct ListArgs {
    #[command(flatten)]
    file: UsersFile,
    /// As JSON.
    #[arg(long)]
    json: bool,
}

/// Hand a new token over: to a new 0600 file, or once on stdout.
fn hand_over(token: &Token, out: &TokenOut, quiet: bool) -> roamdisk_blockdev::Result<()> {
    match &out.token_file {
        Some(p) => {
            token.create_file(p)?;
            if !quiet {
                eprintln!(
                    "wrote the token of {} to {} (mode 0600; the users file keeps only its hash)",
                    token.user(),
                    p.display()
                );
            }
        }
        None => {
            outln!("{}", token.as_str());
            if !quiet {
                eprintln!(
                    "the token of {} is shown once (the users file keeps only its hash): keep it in a 0600 file for --token-file",
                    token.user()
                );
            }
        }
    }
    Ok(())
}

fn say(quiet: bool, path: &Path, what: String) {
    if !quiet {
        outln!("{what} ({})", path.display());
    }
}

pub fn run(cmd: Cmd, quiet: bool) -> anyhow::Result<()> {
    match cmd {
        Cmd::Add(a) => users::edit(&a.file.users, true, |u| {
            let token = Token::generate(&a.user)?;
            u.add(&a.user, token.hash(), a.admin)?;
            hand_over(&token, &a.out, quiet)
        })?,
        Cmd::Token(a) => users::edit(&a.file.users, false, |u| {
            let token = Token::generate(&a.user)?;
            u.set_token(&a.user, token.hash())?;
            hand_over(&token, &a.out, quiet)
        })?,
        Cmd::Revoke(a) => {
            users::edit(&a.file.users, false, |u| u.revoke(&a.user))?;
            say(
                quiet,
                &a.file.users,
                format!("revoked the token of {}", a.user),
            );
        }
        Cmd::Share(a) => {
            users::edit(&a.file.users, false, |u| {
                u.share(&a.catalogs, &a.with, a.write)
            })?;
            let how = if a.write { "read and write" } else { "read" };
            say(
                quiet,
                &a.file.users,
                format!("{} may now {how} {}", a.with, a.catalogs),
            );
        }
        Cmd::Unshare(a) => {
            if !users::edit(&a.file.users, false, |u| u.unshare(&a.catalogs, &a.with))? {
                anyhow::bail!("{} was not shared with {}", a.catalogs, a.with);
            }
            say(
                quiet,
                &a.file.users,
                format!("{} no longer shared with {}", a.catalogs, a.with),
            );
        }
        Cmd::List(a) => list(&Users::load(&a.file.users)?, a.json)?,
    }
    Ok(())
}

fn list(u: &Users, json: bool) -> anyhow::Result<()> {
    if json {
        let v: Vec<serde_json::Value> = u
            .users
            .iter()
            .map(|(n, x)| {
                serde_json::json!({"user": n, "admin": x.admin, "revoked": x.revoked,
                    "read": x.read, "write": x.write})
            })
            .collect();
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    outln!(
        "{:<16} {:<6} {:<8} SHARED WITH THEM",
        "USER",
        "ADMIN",
        "REVOKED"
    );
    for (n, x) in &u.users {
        let shared: Vec<String> = x
            .read
            .iter()
            .map(|g| format!("{g} (read)"))
            .chain(x.write.iter().map(|g| format!("{g} (write)")))
            .collect();
        outln!(
            "{n:<16} {:<6} {:<8} {}",
            if x.admin { "yes" } else { "no" },
            if x.revoked { "yes" } else { "no" },
            shared.join(", ")
        );
    }
    Ok(())
}
