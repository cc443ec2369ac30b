//! Shared test scaffolding. Each test binary uses only part of it.
#![allow(dead_code)]

pub mod azurite;
pub mod bd;
pub mod entra;
pub mod facts;
pub mod fuseplay;
pub mod luks;
pub mod mount;
pub mod namespace;
pub mod sdk;
pub mod user;
pub mod util;
pub mod worker;

#[allow(unused_imports)]
pub use azurite::{
    create_container, put_container, unique_container, Azurite, DEV_ACCOUNT, DEV_KEY,
};
