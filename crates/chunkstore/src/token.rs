//! Store access tokens (`roamdisk store user add`): the text
//! `USER.SECRET`, a user name and 64 hex digits of 256 random bits. A
//! client sends it as `Authorization: Bearer USER.SECRET`; the server keeps
//! only its [`TokenHash`] in the users file, so a copy of that file lets no
//! one in. The user name in the token lets the server find the one hash to
//! compare and lets the client say whose token was refused.

use std::fmt;
use std::path::Path;

use crate::error::bad_arg;
use crate::hash::ChunkId;
use crate::store::api::is_name_part;
use roamdisk_blockdev::Result;

/// BLAKE3 key-derivation context of token hashes.
const HASH_CONTEXT: &str = "roamdisk store token v1";
/// How a [`TokenHash`] is written in the users file: `blake3:HEX`.
const HASH_PREFIX: &str = "blake3:";

/// An access token. `Debug` does not show the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Token {
    text: String,
}

/// The hash of a token, as the users file keeps it.
#[derive(Debug, Clone, Copy)]
pub struct TokenHash(pub [u8; 32]);

impl PartialEq for TokenHash {
    /// In constant time.
    fn eq(&self, other: &TokenHash) -> bool {
        blake3::Hash::from(self.0) == blake3::Hash::from(other.0)
    }
}

impl Eq for TokenHash {}

impl TokenHash {
    /// `blake3:HEX`.
    pub fn to_text(&self) -> String {
        format!("{HASH_PREFIX}{}", ChunkId(self.0).to_hex())
    }

    pub fn parse(text: &str) -> Option<TokenHash> {
        let hex = text.strip_prefix(HASH_PREFIX)?;
        ChunkId::from_hex(hex).map(|id| TokenHash(id.0))
    }
}

impl Token {
    /// A new random token for `user`.
    pub fn generate(user: &str) -> Result<Token> {
        if !is_name_part(user) {
            return Err(bad_name(user));
        }
        let mut secret = [0u8; 32];
        crate::secret::fill_random(&mut secret, "a token")?;
        Ok(Token {
            text: format!("{user}.{}", ChunkId(secret).to_hex()),
        })
    }

    /// A token as sent or kept in a token file.
    pub fn parse(text: &str) -> Result<Token> {
        let ok = match text.rsplit_once('.') {
            Some((user, secret)) => {
                is_name_part(user)
                    && secret.len() == 64
                    && secret
                        .bytes()
                        .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            }
            None => false,
        };
        if !ok {
            return Err(bad_arg(
                "not a store token (USER.SECRET with 64 lowercase hex digits, made by `roamdisk store user add`)",
            ));
        }
        Ok(Token {
            text: text.to_string(),
        })
    }

    /// The user the token was made for.
    pub fn user(&self) -> &str {
        self.text.rsplit_once('.').map(|(u, _)| u).unwrap_or("")
    }

    /// The whole token (the secret included).
    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub fn hash(&self) -> TokenHash {
        let h = blake3::Hasher::new_derive_key(HASH_CONTEXT)
            .update(self.text.as_bytes())
            .finalize();
        TokenHash(*h.as_bytes())
    }

    /// Read a token file (warning when others may read it).
    pub fn read_file(path: &Path) -> Result<Token> {
        let text = crate::secret::read_file(path, "the token file")?;
        Token::parse(&text).map_err(|e| e.path(path))
    }

    /// Write a new token file (mode 0600; it must not exist).
    pub fn create_file(&self, path: &Path) -> Result<()> {
        crate::secret::create_file(path, &self.text, "the token file")
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({}.…)", self.user())
    }
}

/// The error for a user name that is not one.
pub fn bad_name(user: &str) -> roamdisk_blockdev::Error {
    bad_arg(format!(
        "'{user}' is not a user name (1-64 letters, digits, '.', '_' or '-', not starting with '.')"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_hash() {
        let t = Token::generate("al.ice").unwrap();
        assert_eq!(t.user(), "al.ice");
        let p = Token::parse(t.as_str()).unwrap();
        assert_eq!(p.hash(), t.hash());
        assert_ne!(Token::generate("al.ice").unwrap().hash(), t.hash());
        assert_eq!(TokenHash::parse(&t.hash().to_text()), Some(t.hash()));
        assert!(!format!("{t:?}").contains(&t.as_str()[8..]));
        for bad in [
            "alice",
            "alice.",
            ".0000000000000000000000000000000000000000000000000000000000000000",
            "alice.000000000000000000000000000000000000000000000000000000000000000",
            "alice.000000000000000000000000000000000000000000000000000000000000000G",
            "a/b.0000000000000000000000000000000000000000000000000000000000000000",
        ] {
            assert!(Token::parse(bad).is_err(), "{bad}");
        }
        assert!(Token::generate("../x").is_err());
        assert_eq!(TokenHash::parse("sha256:00"), None);
    }
}
