//! SCAFFOLD: replaced by the throw-away NATS server.
