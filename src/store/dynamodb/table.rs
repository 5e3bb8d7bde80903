//! The table: checked when the store opens, made by `leaderrun init`.
//!
//! Every open asks DescribeTable once, and refuses, in one line:
//! - a missing table (naming `leaderrun init`, which makes it);
//! - a table whose key is not leaderrun's (a string partition key `key`, no sort key);
//! - a global table (DescribeTable lists replicas): its regions replicate each other
//!   last-writer-wins, so a conditional write in one region does not see a write made in
//!   another, and two hosts in two regions could both take a lock.
//!
//! A table still being made is an outage (the run retries until it is ready).

use std::time::Duration;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType, TableDescription, TableStatus,
};

use super::errors::{classify, no_table, Failure};
use super::item::KEY;
use crate::store::{Result, StoreError};

/// How long `leaderrun init` waits for a new table to become active.
const CREATE_WAIT: Duration = Duration::from_secs(120);

/// Whether a table described as `description` can keep leaderrun's locks.
pub fn check(table: &str, description: &TableDescription) -> Result<()> {
    let replicas: Vec<&str> = description.replicas().iter().filter_map(|r| r.region_name()).collect();
    if !replicas.is_empty() || description.global_table_version().is_some() {
        return Err(StoreError::refused(format!(
            "dynamodb://{table}: table {table:?} is a global table (replicas in {}): its regions replicate each \
             other last-writer-wins, so two hosts in two regions could both take a lock; use a table without \
             replicas",
            if replicas.is_empty() { "other regions".to_string() } else { replicas.join(", ") }
        )));
    }
    let keys = description.key_schema();
    let string_key = description
        .attribute_definitions()
        .iter()
        .any(|a| a.attribute_name() == KEY && *a.attribute_type() == ScalarAttributeType::S);
    let hash_key_only = matches!(keys, [only] if only.attribute_name() == KEY && *only.key_type() == KeyType::Hash);
    if !(hash_key_only && string_key) {
        let shown: Vec<String> = keys.iter().map(|k| format!("{} ({})", k.attribute_name(), k.key_type())).collect();
        return Err(StoreError::refused(format!(
            "dynamodb://{table}: table {table:?} has the key {}; leaderrun needs a string partition key named \
             {KEY:?} and no sort key (`leaderrun init --print` shows such a table)",
            shown.join(", ")
        )));
    }
    match description.table_status() {
        Some(TableStatus::Creating) => {
            Err(StoreError::unavailable(format!("dynamodb://{table}: table {table:?} is still being created")))
        }
        Some(TableStatus::Deleting) => {
            Err(StoreError::refused(format!("dynamodb://{table}: table {table:?} is being deleted")))
        }
        _ => Ok(()),
    }
}

/// DescribeTable, then `check`.
pub async fn open(client: &aws_sdk_dynamodb::Client, table: &str, region: &str) -> Result<()> {
    let description = describe(client, table, region).await?.ok_or_else(|| no_table(table, region))?;
    check(table, &description)
}

/// DescribeTable: the table's description, `None` if there is no such table.
async fn describe(client: &aws_sdk_dynamodb::Client, table: &str, region: &str) -> Result<Option<TableDescription>> {
    match client.describe_table().table_name(table).send().await {
        Ok(output) => Ok(output.table),
        Err(err) => match classify(table, "DescribeTable", err) {
            Failure::NoTable => Ok(None),
            other => Err(other.into_error(table, region, "DescribeTable")),
        },
    }
}

/// `leaderrun init`: CreateTable (on-demand billing) unless the table exists, then wait
/// until it is active, and check it as every open does.
pub async fn create(client: &aws_sdk_dynamodb::Client, table: &str, region: &str) -> Result<()> {
    if describe(client, table, region).await?.is_none() {
        let attribute = AttributeDefinition::builder().attribute_name(KEY).attribute_type(ScalarAttributeType::S);
        let hash = KeySchemaElement::builder().attribute_name(KEY).key_type(KeyType::Hash);
        let sent = client
            .create_table()
            .table_name(table)
            .attribute_definitions(attribute.build().expect("every required field is set"))
            .key_schema(hash.build().expect("every required field is set"))
            .billing_mode(BillingMode::PayPerRequest)
            .send()
            .await;
        if let Err(err) = sent {
            let code = err.as_service_error().and_then(|e| aws_sdk_dynamodb::error::ProvideErrorMetadata::code(e));
            // ResourceInUseException: made meanwhile by another.
            if code != Some("ResourceInUseException") {
                return Err(classify(table, "CreateTable", err).into_error(table, region, "CreateTable"));
            }
        }
    }
    let started = tokio::time::Instant::now();
    loop {
        let description = describe(client, table, region).await?.ok_or_else(|| no_table(table, region))?;
        match check(table, &description) {
            Err(err) if err.is_transient() && started.elapsed() < CREATE_WAIT => {
                tokio::time::sleep(Duration::from_secs(1)).await
            }
            done => return done,
        }
    }
}

/// The AWS CLI command that makes the same table as `create`.
pub fn create_command(table: &str) -> String {
    format!(
        "aws dynamodb create-table --table-name {table} \\\n    --attribute-definitions \
         AttributeName={KEY},AttributeType=S \\\n    --key-schema AttributeName={KEY},KeyType=HASH \\\n    \
         --billing-mode PAY_PER_REQUEST"
    )
}

#[cfg(test)]
mod tests {
    use aws_sdk_dynamodb::types::ReplicaDescription;

    use super::*;

    fn table(keys: &[(&str, KeyType)]) -> aws_sdk_dynamodb::types::builders::TableDescriptionBuilder {
        let mut b = TableDescription::builder().table_status(TableStatus::Active);
        for (name, kind) in keys {
            b = b
                .key_schema(KeySchemaElement::builder().attribute_name(*name).key_type(kind.clone()).build().unwrap())
                .attribute_definitions(
                    AttributeDefinition::builder()
                        .attribute_name(*name)
                        .attribute_type(ScalarAttributeType::S)
                        .build()
                        .unwrap(),
                );
        }
        b
    }

    #[test]
    fn a_table_with_leaderruns_key_is_taken() {
        check("locks", &table(&[("key", KeyType::Hash)]).build()).unwrap();
    }

    #[test]
    fn a_global_table_is_refused_naming_its_regions() {
        let global = table(&[("key", KeyType::Hash)])
            .replicas(ReplicaDescription::builder().region_name("us-east-1").build())
            .replicas(ReplicaDescription::builder().region_name("eu-west-1").build())
            .build();
        let err = check("locks", &global).unwrap_err();
        assert!(!err.is_transient());
        assert!(err.message.contains("global table (replicas in us-east-1, eu-west-1)"), "{}", err.message);
        assert!(err.message.contains("last-writer-wins"), "{}", err.message);
        let legacy = table(&[("key", KeyType::Hash)]).global_table_version("2019.11.21").build();
        assert!(check("locks", &legacy).unwrap_err().message.contains("global table"));
    }

    #[test]
    fn another_key_schema_is_refused() {
        for keys in [&[("id", KeyType::Hash)][..], &[("key", KeyType::Hash), ("sk", KeyType::Range)]] {
            let err = check("locks", &table(keys).build()).unwrap_err();
            assert!(err.message.contains("string partition key named \"key\""), "{}", err.message);
        }
    }

    #[test]
    fn a_table_being_made_is_an_outage() {
        let creating = table(&[("key", KeyType::Hash)]).table_status(TableStatus::Creating).build();
        assert!(check("locks", &creating).unwrap_err().is_transient());
    }

    #[test]
    fn the_create_command() {
        let text = create_command("leaderrun-locks");
        assert!(text.starts_with("aws dynamodb create-table --table-name leaderrun-locks \\\n"), "{text}");
        assert!(text.contains("AttributeName=key,AttributeType=S") && text.contains("KeyType=HASH"), "{text}");
        assert!(text.ends_with("--billing-mode PAY_PER_REQUEST"), "{text}");
    }
}
