//! SCAFFOLD: replaced by the throw-away ZooKeeper server.
