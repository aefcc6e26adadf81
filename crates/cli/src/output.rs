//! Printing command results.

/// `println!` that keeps quiet when stdout is closed early (`| head`):
/// the command's results are cut off, nothing else happens.
macro_rules! outln {
    () => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock());
    }};
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($t)*);
    }};
}
