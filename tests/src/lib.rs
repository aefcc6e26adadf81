//! Shared helpers for the black-box tests live in tests/tests/common.
