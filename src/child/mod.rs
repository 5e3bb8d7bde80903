//! The child: spawned in a process group (and, where the host allows, a cgroup) of its
//! own, signalled as a whole tree, guarded by the watchdog. Knows nothing of stores.

pub mod cgroup;
mod command;
mod environment;
pub mod group;
pub mod signals;
mod spawn;
mod supervisor;
mod terminal;
pub mod tree;
pub mod watchdog;

pub use command::CommandSpec;
pub use supervisor::Supervisor;
