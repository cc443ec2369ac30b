//! The crash-state replayer: what a workload did, recorded by the recording
//! proxy (`tests/recorder`) and journalled by the workload itself, replayed into
//! the states a crash at chosen instants can leave, each checked (see
//! `model.rs` for which states those are, and `check.rs` for the checks).

#![allow(dead_code)] // each test binary uses its own part of it

pub mod bytes;
pub mod check;
pub mod detached;
pub mod files;
pub mod fscheck;
pub mod fsload;
pub mod fsx;
pub mod image;
pub mod model;
#[cfg(test)]
mod model_tests;
pub mod rawload;
pub mod report;
pub mod run;
pub mod sealed;
pub mod snapshots;
