//! How commands show their results: tables and reports, apart from the
//! commands that compute them.

pub mod commit;
pub mod store;
