//! The root part of a privilege-separated mount, and the seam between it and
//! the unprivileged worker (walled by [`crate::privsep`]).
//!
//! A mount daemon is two processes. The root part does what needs root and never
//! reads a byte from the network: before the worker exists it claims the
//! mount's record, mounts FUSE, binds the metrics port and the control socket,
//! and builds the walls; then it forks the worker, which puts the walls up
//! (`crate::privsep`) before it starts any thread and then does everything that
//! talks to the storage service. From then on the root part only answers the
//! worker's requests ([`Request`]), a fixed set carrying no paths: the root part
//! knows the mountpoint, the FUSE directory and the loop device itself, and acts
//! only on those.
//!
//! Where each part lives:
//! - `channel.rs`: the requests and answers, one JSON line each, every line
//!   bounded ([`LINE_MAX`]), and the root part's [`answer_one`];
//! - `client.rs`: the worker's end, [`RootClient`];
//! - `start.rs`: the root part's work before the fork, and the fork;
//! - `server.rs`: what the root part does for each request, and what it does
//!   when the worker stops (or dies);
//! - `drive.rs`: the requests about FUSE, the loop device and the filesystem;
//! - `errand.rs`: the calls that wait on the worker's files, each on a thread
//!   of its own so that the root part never waits on the worker;
//! - `watch.rs`: what the root part does whatever it waits for (signals, the
//!   worker's log, a thaw owed);
//! - `log.rs`: the worker's log, copied bounded and escaped.
//!
//! The worker's code (`mount::daemon`) reaches root operations only through a
//! [`RootClient`]; `mount::system` is the root part's room.

mod channel;
mod client;
mod drive;
mod errand;
mod log;
mod server;
mod start;
mod watch;

pub use channel::{answer_one, Answer, ChannelError, Ops, Request, LINE_MAX};
pub use client::RootClient;
pub use start::{split, Split, WorkerStart};
