//! DynamoDB store: `--store dynamodb://TABLE`, one item per lock (`item.rs`), with no
//! server-side expiry: the client-timed core judges every lease on this host's clock, and
//! this file only reads and writes items.
//!
//! - read: GetItem with `ConsistentRead` (a strongly consistent read: it sees every write
//!   DynamoDB acknowledged). The version is the item's `recordVersionNumber`, a random UUID
//!   each write replaces; the server's clock is the response's `Date`, the token floor comes
//!   from it (`client_timed/server_clock.rs`).
//! - create: PutItem with `attribute_not_exists(key)` (a failed condition: someone else
//!   created it first). A create that landed in a later second than its read has its token
//!   raised by the core from that second; and the core counts a token from the next second's
//!   floor only once the server's clock has left the second it was written in (`counts`: it
//!   reads until then, at most a second), so that tokens outlive a deleted item; an item that
//!   changed or vanished meanwhile is a lost race.
//! - replace: PutItem with `recordVersionNumber = :previous` (a failed condition: it changed,
//!   or was deleted).
//! - list: a consistent Scan of the table.
//! - waiting: DynamoDB cannot watch (Streams would need another API and permission), so a
//!   standby's core reads the item every 1 to 1.5 s (`client_timed/polls.rs`).
//!
//! Conditional writes on one table in one region are strongly consistent, which is all the
//! core needs. A global table is refused (`table.rs`): its regions replicate each other
//! last-writer-wins. Deleting a lock's item frees the lock at once (its holder sees it at its
//! next renewal and stops its child). An SDK retry of a write whose first answer was lost
//! fails its condition against its own write: DynamoDB then returns the item, and a write
//! that finds its own new version there counts as done.
//!
//! A missing table, a bad key or signature, no permission: refusals (exit 69), in one line
//! naming the table and the operation; messages never carry a credential.

mod client;
mod errors;
mod item;
mod kind;
mod table;
mod target;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
pub use aws_config::ConfigLoader;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};
pub use kind::KIND;
pub use target::Target;

use self::errors::{classify, Failure};
use self::item::{attributes, lock_of, new_version, parse, Attributes, Item, KEY, VERSION};
use crate::store::aws::DateHeader;
use crate::store::client_timed::server_clock::{create_floor, floor, token_counts};
use crate::store::client_timed::{client_timed, Created, Found, Read, Record, Records, Version, Written};
use crate::store::{Access, Result, Store, StoreError};

/// How often a waiting standby reads the item (`Records::poll_every`: 1 to 1.5 × this).
const POLL_EVERY: Duration = Duration::from_secs(1);

/// The DynamoDB store for `target`: the client-timed core over this table's items.
pub async fn open(target: &Target, access: Access) -> Result<Box<dyn Store>> {
    open_with(target, access, |loader| loader).await
}

/// `open`, with `configure` overriding what the AWS SDK's loader finds (for a program that
/// embeds leaderrun with credentials or an endpoint of its own, and for tests).
pub async fn open_with(
    target: &Target,
    access: Access,
    configure: impl FnOnce(ConfigLoader) -> ConfigLoader,
) -> Result<Box<dyn Store>> {
    let records = DynamoRecords::open_with(target, access, configure).await?;
    Ok(client_timed(Arc::new(records)))
}

/// `leaderrun init`: make the table (on-demand billing) unless it exists, then open it.
pub async fn prepare_with(
    target: &Target,
    configure: impl FnOnce(ConfigLoader) -> ConfigLoader,
) -> Result<Box<dyn Store>> {
    let (client, region) = connect(target, configure).await?;
    table::create(&client, &target.table, &region).await?;
    let records = DynamoRecords { client, table: target.table.clone(), region };
    Ok(client_timed(Arc::new(records)))
}

/// The AWS CLI command `prepare` stands for (`leaderrun init --print`).
pub fn create_command(target: &Target) -> String {
    table::create_command(&target.table)
}

async fn connect(
    target: &Target,
    configure: impl FnOnce(ConfigLoader) -> ConfigLoader,
) -> Result<(aws_sdk_dynamodb::Client, String)> {
    let (client, region) = client::client(configure).await;
    let region = region.ok_or_else(|| {
        StoreError::refused(format!(
            "dynamodb://{}: no region is configured: set AWS_REGION (or a profile's region), as for the AWS CLI",
            target.table
        ))
    })?;
    Ok((client, region))
}

/// One table's lock items.
pub struct DynamoRecords {
    client: aws_sdk_dynamodb::Client,
    table: String,
    region: String,
}

fn refused_item(table: &str, lock: &str, why: String) -> StoreError {
    StoreError::refused(format!("dynamodb://{table}: the item of lock {lock:?} is {why}"))
}

impl DynamoRecords {
    /// A client of `target`'s table, which is checked first (it exists, has leaderrun's key,
    /// has no replicas), whatever the access.
    pub async fn open_with(
        target: &Target,
        _access: Access,
        configure: impl FnOnce(ConfigLoader) -> ConfigLoader,
    ) -> Result<Self> {
        let (client, region) = connect(target, configure).await?;
        table::open(&client, &target.table, &region).await?;
        Ok(Self { client, table: target.table.clone(), region })
    }

    fn error(&self, operation: &str, lock: &str, failure: Failure) -> StoreError {
        failure.into_error(&self.table, &self.region, &format!("{operation} {lock}"))
    }

    /// GetItem (consistent): the item, if any, and the server's clock.
    async fn get(&self, lock: &str) -> Result<(Option<Item>, Option<SystemTime>)> {
        let date = DateHeader::default();
        let sent = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(KEY, AttributeValue::S(lock.into()))
            .consistent_read(true)
            .customize()
            .interceptor(date.clone())
            .send()
            .await;
        let output = sent.map_err(|err| self.error("GetItem", lock, classify(&self.table, "GetItem", err)))?;
        let found = match output.item {
            Some(attributes) => Some(parse(&attributes).map_err(|why| refused_item(&self.table, lock, why))?),
            None => None,
        };
        Ok((found, date.get()))
    }

    /// PutItem of `record` at a fresh version, if the item is absent (`previous: None`) or
    /// still at `previous`. `Ok(None)`: the condition failed. Also the server's clock.
    async fn put(
        &self,
        lock: &str,
        record: &Record,
        previous: Option<&str>,
    ) -> Result<(Option<String>, Option<SystemTime>)> {
        let version = new_version();
        let date = DateHeader::default();
        let request = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(attributes(lock, record, &version)))
            .expression_attribute_names("#k", KEY)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        let request = match previous {
            None => request.condition_expression("attribute_not_exists(#k)"),
            Some(previous) => request
                .condition_expression("attribute_exists(#k) AND #v = :v")
                .expression_attribute_names("#v", VERSION)
                .expression_attribute_values(":v", AttributeValue::S(previous.into())),
        };
        match request.customize().interceptor(date.clone()).send().await {
            Ok(_) => Ok((Some(version), date.get())),
            Err(err) => {
                // A retry of this very write, whose first answer was lost, fails against it.
                let now: Option<&Attributes> = match err.as_service_error() {
                    Some(PutItemError::ConditionalCheckFailedException(failed)) => failed.item(),
                    _ => None,
                };
                if now.and_then(|item| item.get(VERSION)) == Some(&AttributeValue::S(version.clone())) {
                    return Ok((Some(version), date.get()));
                }
                match classify(&self.table, "PutItem", err) {
                    Failure::Condition => Ok((None, date.get())),
                    other => Err(self.error("PutItem", lock, other)),
                }
            }
        }
    }
}

#[async_trait]
impl Records for DynamoRecords {
    async fn read(&self, lock: &str) -> Result<Read> {
        let (found, server_time) = self.get(lock).await?;
        let floor = floor(server_time, found.is_some());
        let found = found.map(|item| Found { record: item.record, version: Version(item.version) });
        Ok(Read { found, server_time, floor })
    }

    async fn create(&self, lock: &str, record: &Record) -> Result<Created> {
        let (Some(version), written) = self.put(lock, record, None).await? else { return Ok(Created::Moved) };
        Ok(Created::Done { version: Version(version), floor: create_floor(written) })
    }

    async fn replace(&self, lock: &str, record: &Record, previous: &Version) -> Result<Written> {
        Ok(match self.put(lock, record, Some(&previous.0)).await? {
            (Some(version), _) => Written::Done(Version(version)),
            (None, _) => Written::Moved,
        })
    }

    async fn list(&self) -> Result<Vec<(String, Record)>> {
        let mut locks = Vec::new();
        let mut pages =
            self.client.scan().table_name(&self.table).consistent_read(true).into_paginator().items().send();
        while let Some(attributes) = pages.next().await {
            let attributes = attributes
                .map_err(|err| classify(&self.table, "Scan", err).into_error(&self.table, &self.region, "Scan"))?;
            let Some(lock) = lock_of(&attributes) else { continue };
            match parse(&attributes) {
                Ok(item) => locks.push((lock.to_string(), item.record)),
                // Someone else's item in the table: not a lock, and no reason to fail.
                Err(why) => tracing::warn!("{}", refused_item(&self.table, lock, why).message),
            }
        }
        Ok(locks)
    }

    fn poll_every(&self) -> Option<Duration> {
        Some(POLL_EVERY)
    }

    /// The server's clock is the HTTP `Date`, in whole seconds.
    fn server_clock_resolution(&self) -> Duration {
        Duration::from_secs(1)
    }

    /// Tokens follow the server's clock: one counts once no later create can undercut it.
    fn counts(&self, token: u64, read: &Read) -> bool {
        token_counts(token, read.server_time)
    }
}
