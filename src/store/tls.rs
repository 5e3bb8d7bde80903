//! The store clients bring rustls with two crypto backends (ring, and aws-lc-rs through the
//! ZooKeeper client's TLS); rustls then cannot pick one by itself and panics on the first TLS
//! connection. `choose_crypto_provider` picks ring for the whole process, before any store
//! connects. Every store that speaks TLS turns on the `tls` feature.

/// Choose ring as the process's crypto provider (a second call is harmless).
pub fn choose_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
