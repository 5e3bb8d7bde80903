//! The failover suite (tests/failover) against MariaDB replicated: a primary and a replica
//! behind a moving endpoint, asynchronous (every scenario, the lost writes included) and
//! semi-synchronous (a lease the replica had survives). Each test starts its own servers.

mod failover;
mod servers;

use servers::mariadb_replicated::MariadbReplicated;

mod asynchronous {
    use super::*;

    failover_suite!(asynchronous: MariadbReplicated::start());
}

mod semi_synchronous {
    use super::*;

    failover_suite!(synchronous: MariadbReplicated::start_semi_sync());
}
