//! A throw-away DynamoDB: moto (`servers::moto::Moto`, which serves DynamoDB on the same port
//! as S3) with one table made as `leaderrun init` makes it, stopped when dropped.
//!
//! moto keeps its tables in memory; DynamoDB loses no acknowledged write. So a stop or a kill
//! first closes the gate (no client reaches moto any more, and the connections through it are
//! cut), then saves every table (its key schema and a Scan of its items) through moto's own
//! port, and `start_again` puts them back before the gate opens: every item comes back with the
//! same attributes (its `recordVersionNumber` included). A write still in flight when the gate
//! closed may be kept or lost, as in a crash; its client got no answer either way. The save and
//! the restore take as long as the table is large, however long the run (the replay of every
//! write, as for S3, grew with each restart and stopped a long fault run).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{json, Value};

use super::moto::{Moto, REGION};
use super::server::{TestServer, WrongSecret};

pub const TABLE: &str = "leaderrun-test";

pub struct MotoDynamo {
    pub moto: Moto,
    /// What `save` found while the server was stopped: each table's CreateTable request and
    /// its items, for `start_again`.
    saved: Mutex<Vec<(Value, Vec<Value>)>>,
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
        MotoDynamo { moto: Moto::start(), saved: Mutex::default() }
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
        MotoDynamo { moto, saved: Mutex::default() }
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

    /// Stop the server, its tables saved behind the closed gate.
    pub fn stop(&self) {
        self.moto.close_gate();
        self.save();
        self.moto.stop_process();
    }

    /// SIGKILL the server as a crash would, its tables saved behind the closed gate first.
    pub fn kill(&self) {
        self.moto.close_gate();
        self.save();
        if let Some(pid) = self.moto.pid() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::SIGKILL);
        }
        self.moto.stop_process();
    }

    /// Start the stopped server again on the same port with the tables it had.
    pub fn start_again(&self) {
        self.moto.start_again_with(|moto| {
            let (inner, key) = (moto.inner_port(), moto.key().0);
            for (create, items) in self.saved.lock().unwrap().iter() {
                let (status, reply) = call_on(inner, key, "CreateTable", &create.to_string());
                assert_eq!(status, 200, "create the table again: {reply}");
                for item in items {
                    let put = json!({ "TableName": create["TableName"], "Item": item });
                    let (status, reply) = call_on(inner, key, "PutItem", &put.to_string());
                    assert_eq!(status, 200, "put an item back: {reply}");
                }
            }
        })
    }

    /// Every table's key schema and items, read through moto's own port (the gate is closed).
    fn save(&self) {
        let (inner, key) = (self.moto.inner_port(), self.key().0);
        let answer = |operation: &str, body: Value| -> Value {
            let (status, reply) = call_on(inner, key, operation, &body.to_string());
            assert_eq!(status, 200, "{operation} while saving the tables: {reply}");
            serde_json::from_str(&reply).unwrap_or_else(|e| panic!("{operation}: {e}: {reply}"))
        };
        let mut saved = Vec::new();
        let listed = answer("ListTables", json!({}));
        for name in listed["TableNames"].as_array().expect("TableNames") {
            let table = &answer("DescribeTable", json!({ "TableName": name }))["Table"];
            let create = json!({
                "TableName": name,
                "KeySchema": table["KeySchema"],
                "AttributeDefinitions": table["AttributeDefinitions"],
                "BillingMode": "PAY_PER_REQUEST",
            });
            let (mut items, mut from) = (Vec::new(), Value::Null);
            loop {
                let mut scan = json!({ "TableName": name });
                if !from.is_null() {
                    scan["ExclusiveStartKey"] = from;
                }
                let page = answer("Scan", scan);
                items.extend(page["Items"].as_array().expect("Items").iter().cloned());
                from = page["LastEvaluatedKey"].clone();
                if from.is_null() {
                    break;
                }
            }
            saved.push((create, items));
        }
        *self.saved.lock().unwrap() = saved;
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

    /// One DynamoDB request through the public port, as any client sends it: the status and body.
    pub fn call(&self, operation: &str, body: &str) -> (u16, String) {
        call_on(self.port(), self.key().0, operation, body)
    }
}

/// One DynamoDB request to `port` (moto without IAM checks takes any signature): the status
/// and body.
fn call_on(port: u16, key_id: &str, operation: &str, body: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to moto");
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let head = format!(
        "POST / HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nX-Amz-Target: DynamoDB_20120810.{operation}\r\n\
         Content-Type: application/x-amz-json-1.0\r\nAuthorization: AWS4-HMAC-SHA256 \
         Credential={key_id}/20200101/{REGION}/dynamodb/aws4_request, SignedHeaders=host, Signature=00\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body.as_bytes()).unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").expect("an HTTP answer");
    (head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0), body.to_string())
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
        MotoDynamo::stop(self)
    }

    fn kill(&self) {
        MotoDynamo::kill(self)
    }

    fn start_again(&self) {
        MotoDynamo::start_again(self)
    }
}

/// `text` as a JSON string.
fn json_string(text: &str) -> String {
    serde_json::to_string(text).unwrap()
}
