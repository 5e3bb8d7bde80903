//! The etcd v3 gRPC messages this store sends and reads, written out by hand.
//!
//! Transcribed from etcd's `api/etcdserverpb/rpc.proto` and `api/mvccpb/kv.proto`
//! (github.com/etcd-io/etcd, Apache-2.0; the copies read were those in the etcd-client 0.21.1
//! crate's `proto/` folder), so the build needs no `protoc`. Only the messages of the calls leaderrun makes, and in them only the fields it
//! sets or reads: protobuf readers skip fields they do not know, so leaving the rest out
//! changes nothing on the wire. Field names and tags are etcd's; a tag must never change.
//! protobuf enums travel as int32: their values are the constants below.

/// `ResponseHeader`: only the store revision is read.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ResponseHeader {
    #[prost(int64, tag = "3")]
    pub revision: i64,
}

/// `mvccpb.KeyValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct KeyValue {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(int64, tag = "2")]
    pub create_revision: i64,
    #[prost(int64, tag = "3")]
    pub mod_revision: i64,
    #[prost(bytes = "vec", tag = "5")]
    pub value: Vec<u8>,
}

/// `mvccpb.Event`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Event {
    /// `EVENT_PUT` or `EVENT_DELETE`.
    #[prost(int32, tag = "1")]
    pub r#type: i32,
    #[prost(message, optional, tag = "2")]
    pub kv: Option<KeyValue>,
}

/// `Event.EventType.PUT` (a key created or rewritten).
pub const EVENT_PUT: i32 = 0;
/// `Event.EventType.DELETE`.
pub const EVENT_DELETE: i32 = 1;

/// `RangeRequest`: one key, or `[key, range_end)`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RangeRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
    #[prost(bool, tag = "9")]
    pub count_only: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RangeResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(message, repeated, tag = "2")]
    pub kvs: Vec<KeyValue>,
    #[prost(int64, tag = "4")]
    pub count: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PutRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
    /// The etcd lease the key is attached to (0: none).
    #[prost(int64, tag = "3")]
    pub lease: i64,
    /// Keep the key's current lease (`lease` must then be 0).
    #[prost(bool, tag = "6")]
    pub ignore_lease: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct DeleteRangeRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
}

/// `RequestOp`: one operation of a transaction (nested transactions are not used).
#[derive(Clone, PartialEq, prost::Message)]
pub struct RequestOp {
    #[prost(oneof = "Request", tags = "1, 2, 3")]
    pub request: Option<Request>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Request {
    #[prost(message, tag = "1")]
    Range(RangeRequest),
    #[prost(message, tag = "2")]
    Put(PutRequest),
    #[prost(message, tag = "3")]
    DeleteRange(DeleteRangeRequest),
}

/// `ResponseOp`: only a range's answer is read; a put's or delete's leaves `response` empty.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ResponseOp {
    #[prost(oneof = "Response", tags = "1")]
    pub response: Option<Response>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Response {
    #[prost(message, tag = "1")]
    Range(RangeResponse),
}

/// `Compare`: a key's create or mod revision against a number.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Compare {
    /// `COMPARE_EQUAL`.
    #[prost(int32, tag = "1")]
    pub result: i32,
    /// `TARGET_CREATE` or `TARGET_MOD`, the same as `target_union`'s.
    #[prost(int32, tag = "2")]
    pub target: i32,
    #[prost(bytes = "vec", tag = "3")]
    pub key: Vec<u8>,
    #[prost(oneof = "CompareWith", tags = "5, 6")]
    pub target_union: Option<CompareWith>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum CompareWith {
    #[prost(int64, tag = "5")]
    CreateRevision(i64),
    #[prost(int64, tag = "6")]
    ModRevision(i64),
}

/// `Compare.CompareResult.EQUAL`.
pub const COMPARE_EQUAL: i32 = 0;
/// `Compare.CompareTarget.CREATE`.
pub const TARGET_CREATE: i32 = 1;
/// `Compare.CompareTarget.MOD`.
pub const TARGET_MOD: i32 = 2;

#[derive(Clone, PartialEq, prost::Message)]
pub struct TxnRequest {
    #[prost(message, repeated, tag = "1")]
    pub compare: Vec<Compare>,
    #[prost(message, repeated, tag = "2")]
    pub success: Vec<RequestOp>,
    #[prost(message, repeated, tag = "3")]
    pub failure: Vec<RequestOp>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TxnResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(bool, tag = "2")]
    pub succeeded: bool,
    #[prost(message, repeated, tag = "3")]
    pub responses: Vec<ResponseOp>,
}

/// `WatchRequest`: only creating a watch is used (it ends with its stream).
#[derive(Clone, PartialEq, prost::Message)]
pub struct WatchRequest {
    #[prost(oneof = "WatchRequestUnion", tags = "1")]
    pub request_union: Option<WatchRequestUnion>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum WatchRequestUnion {
    #[prost(message, tag = "1")]
    CreateRequest(WatchCreateRequest),
}

/// `WatchCreateRequest`: one key, or `[key, range_end)`, from a revision on. No filters: both
/// puts and deletes are wanted.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WatchCreateRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
    #[prost(int64, tag = "3")]
    pub start_revision: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct WatchResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(int64, tag = "2")]
    pub watch_id: i64,
    #[prost(bool, tag = "3")]
    pub created: bool,
    #[prost(bool, tag = "4")]
    pub canceled: bool,
    #[prost(int64, tag = "5")]
    pub compact_revision: i64,
    #[prost(string, tag = "6")]
    pub cancel_reason: String,
    #[prost(message, repeated, tag = "11")]
    pub events: Vec<Event>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseGrantRequest {
    /// Seconds.
    #[prost(int64, tag = "1")]
    pub ttl: i64,
    /// 0: etcd picks the id.
    #[prost(int64, tag = "2")]
    pub id: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseGrantResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(int64, tag = "2")]
    pub id: i64,
    #[prost(int64, tag = "3")]
    pub ttl: i64,
    #[prost(string, tag = "4")]
    pub error: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseRevokeRequest {
    #[prost(int64, tag = "1")]
    pub id: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseRevokeResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseKeepAliveRequest {
    #[prost(int64, tag = "1")]
    pub id: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseKeepAliveResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(int64, tag = "2")]
    pub id: i64,
    /// The renewed TTL in seconds; 0 or less: the lease does not exist (any more).
    #[prost(int64, tag = "3")]
    pub ttl: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseTimeToLiveRequest {
    #[prost(int64, tag = "1")]
    pub id: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseTimeToLiveResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(int64, tag = "2")]
    pub id: i64,
    /// Seconds left; -1 once the lease has lapsed.
    #[prost(int64, tag = "3")]
    pub ttl: i64,
}

/// `AuthenticateRequest`. Its Debug output hides the password.
#[derive(Clone, PartialEq, prost::Message)]
#[prost(skip_debug)]
pub struct AuthenticateRequest {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub password: String,
}

impl std::fmt::Debug for AuthenticateRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthenticateRequest").field("name", &self.name).field("password", &"***").finish()
    }
}

/// `AuthenticateResponse`. Its Debug output hides the token (it stands for the password).
#[derive(Clone, PartialEq, prost::Message)]
#[prost(skip_debug)]
pub struct AuthenticateResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(string, tag = "2")]
    pub token: String,
}

impl std::fmt::Debug for AuthenticateResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthenticateResponse").field("token", &"***").finish()
    }
}

/// The gRPC method paths (`/package.Service/Method`).
pub mod path {
    pub const RANGE: &str = "/etcdserverpb.KV/Range";
    pub const TXN: &str = "/etcdserverpb.KV/Txn";
    pub const WATCH: &str = "/etcdserverpb.Watch/Watch";
    pub const LEASE_GRANT: &str = "/etcdserverpb.Lease/LeaseGrant";
    pub const LEASE_REVOKE: &str = "/etcdserverpb.Lease/LeaseRevoke";
    pub const LEASE_KEEP_ALIVE: &str = "/etcdserverpb.Lease/LeaseKeepAlive";
    pub const LEASE_TIME_TO_LIVE: &str = "/etcdserverpb.Lease/LeaseTimeToLive";
    pub const AUTHENTICATE: &str = "/etcdserverpb.Auth/Authenticate";
}

// Building transactions.

/// `create_revision(key) == revision` (0: the key does not exist).
pub fn create_revision_is(key: &[u8], revision: i64) -> Compare {
    Compare {
        result: COMPARE_EQUAL,
        target: TARGET_CREATE,
        key: key.to_vec(),
        target_union: Some(CompareWith::CreateRevision(revision)),
    }
}

/// `mod_revision(key) == revision`.
pub fn mod_revision_is(key: &[u8], revision: i64) -> Compare {
    Compare {
        result: COMPARE_EQUAL,
        target: TARGET_MOD,
        key: key.to_vec(),
        target_union: Some(CompareWith::ModRevision(revision)),
    }
}

/// Read one key.
pub fn get(key: &[u8]) -> RequestOp {
    RequestOp { request: Some(Request::Range(RangeRequest { key: key.to_vec(), ..Default::default() })) }
}

/// Read every key that starts with `prefix`.
pub fn get_prefix(prefix: &[u8]) -> RequestOp {
    RequestOp { request: Some(Request::Range(prefix_range(prefix))) }
}

/// Every key that starts with `prefix`: `[prefix, prefix with its last byte + 1)`.
pub fn prefix_range(prefix: &[u8]) -> RangeRequest {
    let mut end = prefix.to_vec();
    // Bytes 0xff cannot be incremented: drop them and increment the one before.
    while end.last() == Some(&0xff) {
        end.pop();
    }
    match end.last_mut() {
        Some(last) => *last += 1,
        // All 0xff (or empty): to the end of the key space.
        None => end = vec![0],
    }
    RangeRequest { key: prefix.to_vec(), range_end: end, ..Default::default() }
}

/// Write a key, attached to an etcd lease (0: to none).
pub fn put(key: &[u8], value: Vec<u8>, lease: i64) -> RequestOp {
    RequestOp { request: Some(Request::Put(PutRequest { key: key.to_vec(), value, lease, ignore_lease: false })) }
}

/// Rewrite a key's value, keeping the lease it is attached to.
pub fn put_keeping_lease(key: &[u8], value: Vec<u8>) -> RequestOp {
    RequestOp { request: Some(Request::Put(PutRequest { key: key.to_vec(), value, lease: 0, ignore_lease: true })) }
}

pub fn delete(key: &[u8]) -> RequestOp {
    RequestOp { request: Some(Request::DeleteRange(DeleteRangeRequest { key: key.to_vec() })) }
}

impl TxnResponse {
    /// The keys a range operation of the transaction returned (none for other operations).
    pub fn range(&self, index: usize) -> &[KeyValue] {
        match self.responses.get(index).and_then(|op| op.response.as_ref()) {
            Some(Response::Range(range)) => &range.kvs,
            None => &[],
        }
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    /// A few messages against bytes worked out by hand from the .proto tags, so that a mistyped
    /// tag shows here and not only against a server.
    #[test]
    fn encodings_match_the_proto_tags() {
        let range = RangeRequest { key: b"k".to_vec(), range_end: b"l".to_vec(), count_only: true };
        assert_eq!(range.encode_to_vec(), [0x0a, 1, b'k', 0x12, 1, b'l', 0x48, 1]);
        // Compare: result 1 (0, not sent), target 2 = MOD, key 3, mod_revision 6 = 5.
        assert_eq!(mod_revision_is(b"k", 5).encode_to_vec(), [0x10, 2, 0x1a, 1, b'k', 0x30, 5]);
        // A oneof member is sent even when it is 0: "the key does not exist" must reach etcd.
        assert_eq!(create_revision_is(b"k", 0).encode_to_vec(), [0x10, 1, 0x1a, 1, b'k', 0x28, 0]);
        // A put with a lease inside RequestOp field 2.
        let put = put(b"k", b"v".to_vec(), 7);
        assert_eq!(put.encode_to_vec(), [0x12, 8, 0x0a, 1, b'k', 0x12, 1, b'v', 0x18, 7]);
        let keep = put_keeping_lease(b"k", Vec::new());
        assert_eq!(keep.encode_to_vec(), [0x12, 5, 0x0a, 1, b'k', 0x30, 1]);
        // A watch of the range [k, l) from revision 9.
        let create = WatchCreateRequest { key: b"k".to_vec(), range_end: b"l".to_vec(), start_revision: 9 };
        let watch = WatchRequest { request_union: Some(WatchRequestUnion::CreateRequest(create)) };
        assert_eq!(watch.encode_to_vec(), [0x0a, 8, 0x0a, 1, b'k', 0x12, 1, b'l', 0x18, 9]);
    }

    #[test]
    fn prefix_ranges() {
        assert_eq!(prefix_range(b"/a/").range_end, b"/a0");
        assert_eq!(prefix_range(b"a\xff").range_end, b"b");
        assert_eq!(prefix_range(b"\xff").range_end, [0]);
    }

    #[test]
    fn debug_output_hides_the_password_and_the_token() {
        let request = AuthenticateRequest { name: "app".into(), password: "hunter2".into() };
        assert!(!format!("{request:?}").contains("hunter2"));
        let response = AuthenticateResponse { header: None, token: "secret-token.1".into() };
        assert!(!format!("{response:?}").contains("secret-token"));
    }

    /// A response with fields this file leaves out (a put's answer, a key's version and
    /// lease) still decodes: unknown fields are skipped.
    #[test]
    fn unknown_fields_are_skipped() {
        let kv = [0x0a, 1, b'k', 0x10, 4, 0x18, 6, 0x20, 1, 0x2a, 1, b'v', 0x30, 3];
        let mut range = vec![0x12, kv.len() as u8];
        range.extend_from_slice(&kv);
        let mut txn = vec![0x10, 1, 0x1a, 2, 0x12, 0]; // succeeded, then a put's (empty) answer
        txn.extend_from_slice(&[0x1a, range.len() as u8 + 2, 0x0a, range.len() as u8]);
        txn.extend_from_slice(&range);
        let decoded = TxnResponse::decode(txn.as_slice()).expect("decodes");
        assert!(decoded.succeeded && decoded.range(0).is_empty());
        let kv = &decoded.range(1)[0];
        assert_eq!(
            (kv.key.as_slice(), kv.create_revision, kv.mod_revision, kv.value.as_slice()),
            (&b"k"[..], 4, 6, &b"v"[..])
        );
    }
}
