//! Shared test scaffolding. Each test binary uses only part of it.
#![allow(dead_code)]

pub mod azurite;
