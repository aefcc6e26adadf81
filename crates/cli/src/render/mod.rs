//! How commands show their results: tables on stdout and plots, one file
//! per command family. Commands parse options, call an engine and hand
//! its result here.

pub mod borrow;
pub mod commit;
pub mod lbs;
pub mod model;
pub mod replay;
pub mod resume;
pub mod server;
pub mod sim;
pub mod sperf;
pub mod store;
pub mod trace;

/// Print `text`, lines each ending in a newline (nothing when empty).
pub fn print_lines(text: &str) {
    if !text.is_empty() {
        outln!("{}", text.strip_suffix('\n').unwrap_or(text));
    }
}
