//! Real servers for the tests, started on loopback, on free ports, in temporary
//! directories, and stopped when the handle is dropped.

#![allow(dead_code)]

pub mod azure_sas;
pub mod azurite;
pub mod cluster;
pub mod datastore_emulator;
pub mod etcd;
pub mod etcd_cluster;
pub mod fake_gcs;
pub mod gate;
pub mod kubernetes;
pub mod mariadb;
pub mod mariadb_replicated;
pub mod moto;
pub mod moto_dynamodb;
pub mod nats;
pub mod nats_cluster;
pub mod postgres;
pub mod postgres_replicated;
pub mod process;
pub mod redis;
pub mod redis_sentinel;
pub mod replicated;
pub mod server;
pub mod tls;
pub mod zookeeper;
pub mod zookeeper_cluster;

pub use server::{TestServer, TlsServer, WrongSecret};

/// A free TCP port on 127.0.0.1 (bound, then released for the server to take).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0").local_addr().unwrap().port()
}
