//! End-to-end tests of the `leaderrun` binary against the test Kubernetes API server.

mod common;
mod servers;
