//! End-to-end tests of the `leaderrun` binary against a real etcd server (one per test): the
//! shared suite (tests/e2e/). Fencing tokens are etcd revisions: they increase, but do not
//! start at 1.

mod common;
mod e2e;
mod servers;

use e2e::Tokens;
use servers::etcd::Etcd;

e2e_suite!(Etcd, tokens: Tokens::Rising, except {
    a_wrong_secret_exits_69_in_one_line_without_showing_it:
        "the test etcd runs without authentication; conformance_etcd checks its passwords",
    verbose_output_never_shows_the_secret: "the test etcd runs without authentication: no secret to hide",
});
