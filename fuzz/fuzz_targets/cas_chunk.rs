//! The stored form of a chunk: `Envelope::parse`, `ChunkCodec::open` (with
//! a fixed convergent key) and `ChunkCodec::verify` on arbitrary objects.
//!
//! Byte 0 is the mode: bit 0 rewrites the envelope's length fields
//! (`fixup::cas_chunk`); bit 1 picks the hash (BLAKE3 / SHA-256) of the
//! codec; bit 2 names the object by its content the way a store would
//! (the hash of the payload for plain chunks, of the domain-separated
//! ciphertext for encrypted ones) instead of by a fixed id, so the checks
//! after the name check are reached. The fixed key is the convergent key
//! of [`roamdisk_fuzz::corpus::CHUNK_PLAINTEXT`], so seeds sealed from it
//! open.
//!
//! Checks: `parse` accepts exactly the documented header (fields read
//! back from their offsets); whatever `open` returns hashes or derives to
//! the name and has the header's original length; an object that opens
//! also verifies, and sealing what it opened gives back an object that
//! opens to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roamdisk_chunkstore::chunk::{
    ChunkCodec, Envelope, FLAG_ENCRYPTED, FLAG_ZSTD, HEADER_SIZE, MAX_OBJECT,
};
use roamdisk_chunkstore::{ChunkId, HashKind};
use roamdisk_fuzz::corpus::{chunk_key, encrypted_chunk_id, CHUNK_PLAINTEXT};
use roamdisk_fuzz::fixup::{self, FIXUP};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut obj = rest.to_vec();
    if mode & FIXUP != 0 {
        fixup::cas_chunk(&mut obj);
    }
    let hash = if mode & 2 == 0 {
        HashKind::Blake3
    } else {
        HashKind::Sha256
    };
    let codec = ChunkCodec {
        hash,
        zstd_level: Some(1),
    };
    let key = chunk_key(hash);
    let env = Envelope::parse(&obj);
    if let Ok(e) = &env {
        assert!(obj.len() >= HEADER_SIZE);
        assert_eq!(&obj[..4], b"RDCK");
        assert_eq!(obj[4], 1);
        assert_eq!(e.flags, obj[5]);
        assert_eq!(e.flags & !(FLAG_ZSTD | FLAG_ENCRYPTED), 0);
        assert_eq!(e.hash as u8, obj[6]);
        assert_eq!(obj[7], 0);
        assert_eq!(e.payload_len, obj.len() - HEADER_SIZE);
        assert_eq!(
            e.payload_len as u32,
            u32::from_le_bytes(obj[8..12].try_into().unwrap())
        );
        assert_eq!(
            e.original_len as u32,
            u32::from_le_bytes(obj[12..16].try_into().unwrap())
        );
        assert!(e.original_len <= MAX_OBJECT);
        if e.flags & FLAG_ZSTD == 0 {
            assert_eq!(e.original_len, e.payload_len);
        }
    }
    let id = if mode & 4 == 0 || env.is_err() {
        ChunkId([0x5a; 32])
    } else {
        let e = env.as_ref().unwrap();
        let payload = &obj[HEADER_SIZE..];
        if e.flags & FLAG_ENCRYPTED != 0 {
            encrypted_chunk_id(hash, payload)
        } else if e.flags & FLAG_ZSTD == 0 {
            hash.hash(payload)
        } else {
            // The name of a compressed plain chunk is the hash of its
            // plaintext: only a successful open can tell it; use the
            // plaintext of the seeds.
            hash.hash(CHUNK_PLAINTEXT)
        }
    };
    let opened = codec.open(&id, Some(&key), &obj);
    let verified = codec.verify(&id, &obj);
    match opened {
        Err(e) => {
            let _ = e.to_string();
            assert!(env.is_ok() || verified.is_err());
        }
        Ok(plain) => {
            let e = env.expect("open parsed the envelope");
            assert_eq!(e.hash, hash);
            assert_eq!(plain.len(), e.original_len);
            if e.flags & FLAG_ENCRYPTED == 0 {
                assert_eq!(hash.hash(&plain), id);
            } else {
                assert_eq!(codec.convergent_key(&plain), key);
            }
            let v = verified.expect("an object that opens also verifies");
            assert_eq!(v, e);
            let sealed = codec.seal(&plain, e.flags & FLAG_ENCRYPTED != 0);
            let back = codec
                .open(&sealed.id, sealed.key.as_ref(), &sealed.object)
                .expect("a freshly sealed chunk opens");
            assert_eq!(back, plain);
            if e.flags & FLAG_ENCRYPTED == 0 {
                assert_eq!(sealed.id, id, "same plaintext, same name");
            }
        }
    }
});
