//! The users file of `roamdisk store serve --users FILE`: `Users::parse`
//! on arbitrary text (non-UTF-8 input is skipped: `Users::load` refuses it
//! before parsing), then the rules the server decides requests by.
//!
//! Checks: an error is `corrupt`; what parses has valid user names and, per
//! user, at most `MAX_GRANTS` valid grants, sorted, unique and in one list
//! only; it round-trips through `to_toml`; every user reads and writes
//! their own catalogs, reads and writes what a write grant covers, reads
//! what a read grant covers; admins read everything; the fixed token of
//! [`roamdisk_fuzz::corpus::users_token`] is let in exactly when its hash
//! is the user's and the user is not revoked, and no token never is.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roamdisk_blockdev::ErrorKind;
use roamdisk_chunkserver::users::{check_grant, Users, MAX_GRANTS};
use roamdisk_chunkstore::store::is_name_part;
use roamdisk_fuzz::corpus::users_token;
use roamdisk_fuzz::parse_text;

/// A catalog a grant covers.
fn covered(grant: &str) -> String {
    match grant.strip_suffix("/*") {
        Some(owner) => format!("{owner}/any-image"),
        None => grant.to_string(),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some(u) = parse_text(data, ErrorKind::Corrupt, Users::parse) else {
        return;
    };
    let t = u.to_toml();
    assert_eq!(Users::parse(&t).expect("to_toml output parses"), u, "{t}");
    assert!(u.authenticate(None).is_err());
    for (name, user) in &u.users {
        assert!(is_name_part(name), "{name}");
        assert!(user.read.len() + user.write.len() <= MAX_GRANTS);
        for list in [&user.read, &user.write] {
            assert!(list.windows(2).all(|w| w[0] < w[1]), "{list:?}");
            for g in list {
                check_grant(g).expect("grants are checked");
            }
        }
        assert!(user.read.iter().all(|g| !user.write.contains(g)));
        let own = format!("{name}/vm");
        assert!(u.may_read(name, &own) && u.may_write(name, &own));
        for g in &user.write {
            assert!(u.may_write(name, &covered(g)) && u.may_read(name, &covered(g)));
        }
        for g in &user.read {
            assert!(u.may_read(name, &covered(g)));
        }
        if user.admin {
            assert!(u.may_read(name, "someone-else/vm"));
        }
        let token = users_token(name);
        let admitted = u.authenticate(Some(token.as_str()));
        assert_eq!(
            admitted.is_ok(),
            user.token == token.hash() && !user.revoked,
            "{name}: {admitted:?}"
        );
    }
});
