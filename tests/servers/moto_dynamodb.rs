//! A throw-away DynamoDB: moto (`servers::moto::Moto`, which serves DynamoDB on the same port
//! as S3) with one table made as `leaderrun init` makes it, stopped when dropped. Restarts
//! replay moto's recording as for S3, which rebuilds every item with the same attributes
//! (its `recordVersionNumber` included).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use super::moto::{Moto, REGION};
use super::server::{TestServer, WrongSecret};

pub const TABLE: &str = "leaderrun-test";

pub struct MotoDynamo {
    pub moto: Moto,
}

impl MotoDynamo {
    /// Start a server that takes any credentials, with the table; panics if it cannot.
    pub fn start() -> Self {
        let dynamo = Self::start_empty();
        dynamo.create_table(TABLE);
        dynamo
    }

    /// Start a server with no table.
    pub fn start_empty() -> Self {
        MotoDynamo { moto: Moto::start() }
    }

    /// Start a server that checks signatures against its IAM users (`Moto::start_with_iam`),
    /// with the table made by that user.
    pub fn start_with_iam() -> Self {
        let moto = Moto::start_with_iam();
        let script = r#"
import boto3, sys
boto3.client("dynamodb", endpoint_url=sys.argv[1], region_name=sys.argv[2], aws_access_key_id=sys.argv[3],
    aws_secret_access_key=sys.argv[4]).create_table(TableName=sys.argv[5],
    AttributeDefinitions=[{"AttributeName": "key", "AttributeType": "S"}],
    KeySchema=[{"AttributeName": "key", "KeyType": "HASH"}], BillingMode="PAY_PER_REQUEST")
"#;
        let python = std::env::var_os("HOME")
            .map(|home| PathBuf::from(home).join(".cache/leaderrun-test-tools/venv/bin/python3"))
            .filter(|p| p.is_file())
            .unwrap_or_else(|| PathBuf::from("python3"));
        let (id, secret) = moto.key();
        let out = Command::new(python)
            .args(["-c", script, &moto.endpoint(), REGION, id, secret, TABLE])
            .output()
            .expect("run the venv's python (boto3 comes with moto)");
        assert!(out.status.success(), "create the table: {}", String::from_utf8_lossy(&out.stderr));
        MotoDynamo { moto }
    }

    /// `dynamodb://leaderrun-test` (credentials, region and endpoint come from `env`).
    pub fn url(&self) -> String {
        format!("dynamodb://{TABLE}")
    }

    pub fn endpoint(&self) -> String {
        self.moto.endpoint()
    }

    pub fn key(&self) -> (&str, &str) {
        self.moto.key()
    }

    pub fn port(&self) -> u16 {
        self.moto.port()
    }

    pub fn pid(&self) -> Option<u32> {
        self.moto.pid()
    }

    pub fn stop(&self) {
        self.moto.stop()
    }

    pub fn start_again(&self) {
        self.moto.start_again()
    }

    /// Make a table as `leaderrun init` does (a string partition key `key`, on demand).
    pub fn create_table(&self, table: &str) {
        let body = format!(
            r#"{{"TableName":"{table}","AttributeDefinitions":[{{"AttributeName":"key","AttributeType":"S"}}],"KeySchema":[{{"AttributeName":"key","KeyType":"HASH"}}],"BillingMode":"PAY_PER_REQUEST"}}"#
        );
        let (status, reply) = self.call("CreateTable", &body);
        assert_eq!(status, 200, "create the table: {reply}");
    }

    /// Delete a lock's item, as `aws dynamodb delete-item` would.
    pub fn delete_item(&self, lock: &str) {
        let body = format!(r#"{{"TableName":"{TABLE}","Key":{{"key":{{"S":{}}}}}}}"#, json_string(lock));
        let (status, reply) = self.call("DeleteItem", &body);
        assert_eq!(status, 200, "delete the item: {reply}");
    }

    /// Put an item as another program would (JSON of its attributes, DynamoDB's wire form).
    pub fn put_item(&self, attributes: &str) {
        let (status, reply) = self.call("PutItem", &format!(r#"{{"TableName":"{TABLE}","Item":{attributes}}}"#));
        assert_eq!(status, 200, "put the item: {reply}");
    }

    /// One DynamoDB request, as any client sends it (moto without IAM checks takes any
    /// signature): the status and body.
    pub fn call(&self, operation: &str, body: &str) -> (u16, String) {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port())).expect("connect to moto");
        stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let head = format!(
            "POST / HTTP/1.0\r\nHost: 127.0.0.1:{}\r\nX-Amz-Target: DynamoDB_20120810.{operation}\r\n\
             Content-Type: application/x-amz-json-1.0\r\nAuthorization: AWS4-HMAC-SHA256 \
             Credential={}/20200101/{REGION}/dynamodb/aws4_request, SignedHeaders=host, Signature=00\r\n\
             Content-Length: {}\r\n\r\n",
            self.port(),
            self.key().0,
            body.len()
        );
        stream.write_all(head.as_bytes()).unwrap();
        stream.write_all(body.as_bytes()).unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).unwrap();
        let (head, body) = reply.split_once("\r\n\r\n").expect("an HTTP answer");
        (head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0), body.to_string())
    }
}

/// moto's own, with the table's URL: the endpoint, keys and region are in the environment.
impl TestServer for MotoDynamo {
    fn start() -> Self {
        MotoDynamo::start()
    }

    fn port(&self) -> u16 {
        self.moto.port()
    }

    fn url_via(&self, _port: u16) -> String {
        self.url()
    }

    fn env_via(&self, port: u16) -> Vec<(String, String)> {
        TestServer::env_via(&self.moto, port)
    }

    fn secret(&self) -> Option<String> {
        TestServer::secret(&self.moto)
    }

    /// Only with IAM checks (`start_with_iam`): otherwise moto takes any signature.
    fn wrong_secret(&self) -> Option<WrongSecret> {
        TestServer::wrong_secret(&self.moto).map(|wrong| WrongSecret { url: self.url(), ..wrong })
    }

    fn pids(&self) -> Vec<u32> {
        TestServer::pids(&self.moto)
    }

    fn stop(&self) {
        self.moto.stop()
    }

    fn start_again(&self) {
        self.moto.start_again()
    }
}

/// `text` as a JSON string.
fn json_string(text: &str) -> String {
    serde_json::to_string(text).unwrap()
}
