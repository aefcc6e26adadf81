//! How commands show their results: tables on stdout and plots, one file
//! per command family. Commands parse options, call an engine and hand
//! its result here.

pub mod lbs;
pub mod model;
pub mod replay;
pub mod sim;
pub mod sperf;
pub mod trace;
