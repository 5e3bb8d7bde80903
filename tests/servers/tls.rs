//! Certificates for servers that speak TLS in the tests: a throw-away certificate
//! authority, a server certificate for 127.0.0.1 and localhost, and a client certificate,
//! made with the `openssl` command in a temporary directory.

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Certs {
    dir: tempfile::TempDir,
}

impl Certs {
    /// Make a CA, a server certificate and a client certificate; panics with the reason if
    /// `openssl` is missing or fails.
    pub fn new() -> Self {
        let dir = tempfile::Builder::new().prefix("leaderrun-tls-").tempdir().expect("create a temp dir");
        let certs = Self { dir };
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
        certs.openssl(&[&["req", "-x509"], &ec[..], &["-keyout", "ca.key", "-out", "ca.crt"]].concat(), "CA");
        certs.sign("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n");
        certs.sign("client", "extendedKeyUsage=clientAuth\n");
        certs
    }

    /// The CA certificate (PEM) that signed both others.
    pub fn ca(&self) -> PathBuf {
        self.path("ca.crt")
    }

    pub fn server_cert(&self) -> PathBuf {
        self.path("server.crt")
    }

    pub fn server_key(&self) -> PathBuf {
        self.path("server.key")
    }

    pub fn client_cert(&self) -> PathBuf {
        self.path("client.crt")
    }

    pub fn client_key(&self) -> PathBuf {
        self.path("client.key")
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A key and a certificate for `name`, signed by the CA, with these v3 extensions.
    fn sign(&self, name: &str, extensions: &str) {
        let ext = self.path(&format!("{name}.ext"));
        std::fs::write(&ext, extensions).expect("write the extensions file");
        let (key, csr, crt) = (format!("{name}.key"), format!("{name}.csr"), format!("{name}.crt"));
        let subject = format!("/CN=leaderrun-test-{name}");
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
        self.openssl(&[&["req"], &ec[..], &["-keyout", &key, "-out", &csr, "-subj", &subject]].concat(), name);
        let ext = ext.to_str().unwrap();
        let sign = ["x509", "-req", "-in", &csr, "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial"];
        self.openssl(&[&sign[..], &["-out", &crt, "-days", "2", "-extfile", ext]].concat(), name);
    }

    fn openssl(&self, args: &[&str], what: &str) {
        let mut cmd = Command::new("openssl");
        cmd.args(args).current_dir(self.dir.path());
        if args[0] == "req" && args.contains(&"-x509") {
            cmd.args(["-days", "2", "-subj", "/CN=leaderrun-test-ca"]);
        }
        let out = cmd.output().expect("run openssl (apt-get install -y openssl)");
        assert!(out.status.success(), "openssl {what}: {}", String::from_utf8_lossy(&out.stderr));
    }
}
