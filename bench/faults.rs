//! The fault run's faults: what each is, whether it may cost the holder its lease, and how
//! it is applied to the current holder (or to the store, a node of the cluster, the holder's
//! network) and healed.

use std::process::{Command, Stdio};
use std::thread;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rand::Rng;

use crate::checker::Applied;
use crate::contenders::probe_of;
use crate::proxy::Mode;
use crate::{note, now_ns, sibling, Run, LOCK};

/// The faults, each applied to the current holder and then healed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    KillWrapper,
    KillChild,
    StopWrapperShort,
    StopWrapperAboutTtl,
    StopWrapperLong,
    TermWrapper,
    Release,
    KillServer,
    FreezeServer,
    CutHolderNetwork,
    ResetHolderConnections,
    SlowHolderNetwork,
    KillLeaderNode,
    FreezeLeaderNode,
    KillHolderNode,
    FreezeHolderNode,
    FailOverLosing,
    FailOver,
    FailOverHolderKilled,
}

impl Fault {
    pub const ALL: [Fault; 19] = [
        Fault::KillWrapper,
        Fault::KillChild,
        Fault::StopWrapperShort,
        Fault::StopWrapperAboutTtl,
        Fault::StopWrapperLong,
        Fault::TermWrapper,
        Fault::Release,
        Fault::KillServer,
        Fault::FreezeServer,
        Fault::CutHolderNetwork,
        Fault::ResetHolderConnections,
        Fault::SlowHolderNetwork,
        Fault::KillLeaderNode,
        Fault::FreezeLeaderNode,
        Fault::KillHolderNode,
        Fault::FreezeHolderNode,
        Fault::FailOverLosing,
        Fault::FailOver,
        Fault::FailOverHolderKilled,
    ];

    /// A fault of one node of a cluster (`--cluster`): never two nodes down at once, so a
    /// quorum always stands.
    pub fn needs_cluster(self) -> bool {
        matches!(
            self,
            Fault::KillLeaderNode | Fault::FreezeLeaderNode | Fault::KillHolderNode | Fault::FreezeHolderNode
        )
    }

    /// A failover of a replicated store (`--replicated`): the only faults of such a run.
    pub fn needs_replicas(self) -> bool {
        matches!(self, Fault::FailOverLosing | Fault::FailOver | Fault::FailOverHolderKilled)
    }

    pub fn needs_server(self) -> bool {
        matches!(
            self,
            Fault::KillServer
                | Fault::FreezeServer
                | Fault::CutHolderNetwork
                | Fault::ResetHolderConnections
                | Fault::SlowHolderNetwork
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            Fault::KillWrapper => "SIGKILL wrapper",
            Fault::KillChild => "SIGKILL child",
            Fault::StopWrapperShort => "SIGSTOP wrapper 0.3 ttl",
            Fault::StopWrapperAboutTtl => "SIGSTOP wrapper 1.0 ttl",
            Fault::StopWrapperLong => "SIGSTOP wrapper 2.0 ttl",
            Fault::TermWrapper => "SIGTERM wrapper",
            Fault::Release => "leaderrun release",
            Fault::KillServer => "SIGKILL server, down 0.2-1.5 ttl",
            Fault::FreezeServer => "SIGSTOP server 1.5 ttl",
            Fault::CutHolderNetwork => "blackhole holder's network 1.5 ttl",
            Fault::ResetHolderConnections => "reset holder's connections",
            Fault::SlowHolderNetwork => "holder's network +100 ms, 2 ttl",
            Fault::KillLeaderNode => "SIGKILL leader node, down 0.2-1.5 ttl",
            Fault::FreezeLeaderNode => "SIGSTOP leader node 1.5 ttl",
            Fault::KillHolderNode => "SIGKILL holder's node, down 0.2-1.5 ttl",
            Fault::FreezeHolderNode => "SIGSTOP holder's node 1.5 ttl",
            Fault::FailOverLosing => "failover losing the holder's acquire",
            Fault::FailOver => "failover, replica caught up",
            Fault::FailOverHolderKilled => "holder's wrapper SIGKILLed, then failover",
        }
    }

    /// Whether the holder is expected to lose its lease (and exit 75) under this fault. A node
    /// of a cluster is not: with a quorum standing, its loss must cost no lease whose ttl
    /// exceeds the engine's failover time and two renewal attempts (a loss is a false one).
    pub fn may_lose_lease(self) -> bool {
        matches!(
            self,
            Fault::StopWrapperAboutTtl
                | Fault::StopWrapperLong
                | Fault::Release
                | Fault::KillServer
                | Fault::FreezeServer
                | Fault::CutHolderNetwork
                | Fault::FailOverLosing
                | Fault::FailOverHolderKilled
        )
    }

    /// Whether the fault hits the store itself, and so every holder at once: with --slots, the
    /// holders of the other slots may lose their leases to it too.
    pub fn hits_every_holder(self) -> bool {
        matches!(self, Fault::Release | Fault::KillServer | Fault::FreezeServer | Fault::FailOverLosing)
    }
}

impl Run {
    pub fn apply(&self, fault: Fault, holder: &str, wrapper: Pid) {
        let ttl = self.config.ttl;
        // Contender slot of the holder: identities read `c{slot}-g{generation}`.
        let slot = holder.strip_prefix('c').and_then(|r| r.split('-').next()).and_then(|n| n.parse().ok());
        match fault {
            Fault::KillServer => {
                let down = rand::rng().random_range(0.2..1.5);
                self.backend.kill_server(ttl.mul_f64(down));
                if self.backend.floor_restarts_with_server() {
                    note(&self.log, &format!("EPOCH {}", now_ns()));
                }
            }
            Fault::FreezeServer => self.backend.freeze_server(ttl.mul_f64(1.5)),
            Fault::CutHolderNetwork => self.backend.network(slot.unwrap_or(0), Mode::Blackhole, ttl.mul_f64(1.5)),
            Fault::ResetHolderConnections => {
                self.backend.network(slot.unwrap_or(0), Mode::Reset, Duration::from_millis(100))
            }
            Fault::SlowHolderNetwork => {
                self.backend.network(slot.unwrap_or(0), Mode::Delay(Duration::from_millis(100)), ttl * 2)
            }
            Fault::KillLeaderNode | Fault::KillHolderNode => {
                let down = ttl.mul_f64(rand::rng().random_range(0.2..1.5));
                let node = self.node_for(fault, slot);
                note(&self.log, &format!("NODE {node} killed for {} ms", down.as_millis()));
                self.backend.kill_node(node, down);
            }
            Fault::FreezeLeaderNode | Fault::FreezeHolderNode => {
                let node = self.node_for(fault, slot);
                note(&self.log, &format!("NODE {node} frozen"));
                self.backend.freeze_node(node, ttl.mul_f64(1.5));
            }
            Fault::KillWrapper => {
                let _ = kill(wrapper, Signal::SIGKILL);
            }
            Fault::KillChild => {
                if let Some(child) = probe_of(wrapper) {
                    let _ = kill(child, Signal::SIGKILL);
                }
            }
            Fault::StopWrapperShort | Fault::StopWrapperAboutTtl | Fault::StopWrapperLong => {
                let factor = match fault {
                    Fault::StopWrapperShort => 0.3,
                    Fault::StopWrapperAboutTtl => 1.0,
                    _ => 2.0,
                };
                let _ = kill(wrapper, Signal::SIGSTOP);
                thread::sleep(ttl.mul_f64(factor));
                let _ = kill(wrapper, Signal::SIGCONT);
            }
            Fault::TermWrapper => {
                let _ = kill(wrapper, Signal::SIGTERM);
            }
            Fault::Release => self.release_holder(),
            // The holder's acquire was kept off the replica (`lose_next_lease`): the new primary
            // never saw it.
            Fault::FailOverLosing => {
                self.backend.fail_over();
                self.backend.add_replica();
            }
            Fault::FailOver => {
                self.backend.catch_up();
                self.backend.fail_over();
                self.backend.add_replica();
            }
            // The holder gone with the primary: the next holder waits out both its lease and the
            // new primary's grace (the cost of the grace, measured).
            Fault::FailOverHolderKilled => {
                let _ = kill(wrapper, Signal::SIGKILL);
                self.backend.fail_over();
                self.backend.add_replica();
            }
        }
    }

    fn release_holder(&self) {
        let _ = Command::new(sibling("leaderrun"))
            .env_clear()
            .envs(self.backend.env(None))
            .args(["release", "--store", &self.backend.url(), "--lock", LOCK])
            .stdout(Stdio::null())
            .status();
    }

    /// Before a failover that loses the holder's lease: keep writes off the replica, make the
    /// holder stand down (`leaderrun release`), and wait for another contender to take the lock,
    /// a grant the replica never sees. The standing down is recorded as a `Release` applied to
    /// the old holder; the new holder is returned, for the failover to be applied to.
    pub fn lose_next_lease(&self, holder: &str, within: Duration) -> Option<(Applied, (String, Pid))> {
        self.backend.hold_back();
        let at = now_ns();
        note(&self.log, &format!("FAULT {holder} {:?} {at}", Fault::Release));
        self.release_holder();
        let released = Applied { fault: Fault::Release, holder: holder.to_string(), at, first_step: true };
        let started = std::time::Instant::now();
        while started.elapsed() < within {
            if let Some((next, pid)) = self.current_holder(within.saturating_sub(started.elapsed())) {
                if next != holder {
                    return Some((released, (next, pid)));
                }
            }
            thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// The node a cluster fault hits: the leader, or the node the holder's URL lists first
    /// (the one its client prefers).
    fn node_for(&self, fault: Fault, slot: Option<usize>) -> usize {
        match fault {
            Fault::KillLeaderNode | Fault::FreezeLeaderNode => self.backend.leader_node().unwrap_or(0),
            _ => self.backend.preferred_node(slot.unwrap_or(0)),
        }
    }
}
