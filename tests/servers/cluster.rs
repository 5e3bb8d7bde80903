//! What the cluster tests and the fault run's cluster mode need of a 3-node cluster of any
//! engine (etcd, ZooKeeper, NATS), whatever starts it: its URL in a chosen order, which node
//! leads, and a node killed, started again, frozen or thawed by its index. Every method
//! blocks until the cluster has done what was asked (a node started again answers).

pub trait Cluster: Send + Sync {
    /// How many nodes (3).
    fn len(&self) -> usize;

    /// The store URL listing every node, node `first` first (a client's preferred node is
    /// the first it can reach), with whatever credentials and path the cluster needs.
    fn url_from(&self, first: usize) -> String;

    /// The store URL listing every node in index order.
    fn url(&self) -> String {
        self.url_from(0)
    }

    /// The node that leads now (etcd's Raft leader, ZooKeeper's leader, NATS's JetStream meta
    /// leader), if one is known.
    fn leader(&self) -> Option<usize>;

    /// The pid of node `i`'s server process, if it runs.
    fn pid(&self, i: usize) -> Option<u32>;

    /// SIGKILL node `i` and wait until it is gone.
    fn kill(&self, i: usize);

    /// Start node `i` again (same ports, same data) and wait until it answers.
    fn restart(&self, i: usize);

    /// SIGSTOP node `i`: its connections stay open, requests to it hang.
    fn freeze(&self, i: usize) {
        if let Some(pid) = self.pid(i) {
            unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
        }
    }

    /// SIGCONT node `i`.
    fn thaw(&self, i: usize) {
        if let Some(pid) = self.pid(i) {
            unsafe { libc::kill(pid as i32, libc::SIGCONT) };
        }
    }

    /// Wait until a quorum has a leader again (after a kill or a restart), at most `within`.
    fn wait_for_leader(&self, within: std::time::Duration) -> Option<usize> {
        let started = std::time::Instant::now();
        loop {
            if let Some(leader) = self.leader() {
                return Some(leader);
            }
            if started.elapsed() >= within {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// A node that does not lead now (the lowest such index).
    fn follower(&self) -> usize {
        let leader = self.leader();
        (0..self.len()).find(|i| Some(*i) != leader).expect("a cluster of more than one node")
    }
}
