//! The failover suite (tests/failover/mod.rs) against PostgreSQL 15 replicated by streaming:
//! a primary and an asynchronous standby whose link `hold_back` cuts, so that a failover loses
//! the last leases; and a primary with a synchronous standby, which loses nothing it
//! acknowledged. Each test starts its own set-up (tests/servers/postgres_replicated.rs).

mod failover;
mod servers;

mod asynchronous {
    // The suite's tests name the scenarios as `failover::NAME`.
    use crate::servers::postgres_replicated::PostgresReplicated;
    use crate::{failover, failover_suite};

    failover_suite!(asynchronous: PostgresReplicated::start(false));
}

mod synchronous {
    use crate::servers::postgres_replicated::PostgresReplicated;
    use crate::{failover, failover_suite};

    failover_suite!(synchronous: PostgresReplicated::start(true));
}
