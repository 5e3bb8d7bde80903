//! The List Blobs answer (XML), read for what `list` needs: each blob's name, lease state
//! and metadata, and the marker of the next page.

use std::collections::BTreeMap;

use xmlparser::{ElementEnd, Token, Tokenizer};

/// One blob of a listing.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Listed {
    pub name: String,
    pub lease_state: String,
    pub metadata: BTreeMap<String, String>,
}

/// A page of a listing: its blobs and the next page's marker (`None`: the last page).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Page {
    pub blobs: Vec<Listed>,
    pub next_marker: Option<String>,
}

/// Parse a List Blobs answer; `Err` says why it could not be read.
pub fn parse(xml: &str) -> Result<Page, String> {
    let mut page = Page::default();
    let mut path: Vec<String> = Vec::new();
    let mut blob: Option<Listed> = None;
    let mut text = String::new();
    for token in Tokenizer::from(xml) {
        match token.map_err(|e| e.to_string())? {
            Token::ElementStart { local, .. } => {
                path.push(local.as_str().to_string());
                text.clear();
                if local.as_str() == "Blob" && path.len() == 3 {
                    blob = Some(Listed::default());
                }
            }
            Token::Text { text: t } | Token::Cdata { text: t, .. } => text.push_str(&unescape(t.as_str())),
            Token::ElementEnd { end: ElementEnd::Open, .. } => text.clear(),
            Token::ElementEnd { end: ElementEnd::Close(..) | ElementEnd::Empty, .. } => {
                let value = std::mem::take(&mut text);
                let depth = path.len();
                let Some(name) = path.pop() else { continue };
                let parent = path.last().map(String::as_str);
                match (name.as_str(), parent, blob.as_mut()) {
                    ("Blob", _, Some(_)) if depth == 3 => page.blobs.extend(blob.take()),
                    ("Name", Some("Blob"), Some(b)) => b.name = value,
                    ("LeaseState", Some("Properties"), Some(b)) => b.lease_state = value,
                    (key, Some("Metadata"), Some(b)) => {
                        b.metadata.insert(key.to_ascii_lowercase(), value);
                    }
                    ("NextMarker", Some("EnumerationResults"), _) if !value.is_empty() => {
                        page.next_marker = Some(value)
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }
    Ok(page)
}

/// XML's five entities and character references.
fn unescape(text: &str) -> String {
    if !text.contains('&') {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        let Some(end) = rest.find(';') else { break };
        let entity = &rest[1..end];
        let decoded = match entity {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            _ => entity
                .strip_prefix("#x")
                .map(|hex| u32::from_str_radix(hex, 16).ok())
                .or_else(|| entity.strip_prefix('#').map(|dec| dec.parse().ok()))
                .flatten()
                .and_then(char::from_u32),
        };
        match decoded {
            Some(c) => {
                out.push(c);
                rest = &rest[end + 1..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page() {
        let xml = r#"<?xml version="1.0" encoding="utf-8"?><EnumerationResults ServiceEndpoint="http://x/" ContainerName="locks"><Prefix>leaderrun/</Prefix><Blobs><Blob><Name>leaderrun/a &amp; b</Name><Properties><Creation-Time>x</Creation-Time><LeaseStatus>locked</LeaseStatus><LeaseState>leased</LeaseState><LeaseDuration>fixed</LeaseDuration></Properties><Metadata><leaderrun_token>5</leaderrun_token><leaderrun_holder>h%C3%B4st</leaderrun_holder></Metadata></Blob><Blob><Name>leaderrun/b</Name><Properties><LeaseState>available</LeaseState></Properties><Metadata /></Blob></Blobs><NextMarker>m2</NextMarker></EnumerationResults>"#;
        let page = parse(xml).unwrap();
        assert_eq!(page.blobs.len(), 2);
        assert_eq!(page.blobs[0].name, "leaderrun/a & b");
        assert_eq!(page.blobs[0].lease_state, "leased");
        assert_eq!(page.blobs[0].metadata.get("leaderrun_token").map(String::as_str), Some("5"));
        assert_eq!((page.blobs[1].name.as_str(), page.blobs[1].lease_state.as_str()), ("leaderrun/b", "available"));
        assert_eq!(page.next_marker.as_deref(), Some("m2"));
        let last = parse("<EnumerationResults><Blobs /><NextMarker /></EnumerationResults>").unwrap();
        assert_eq!(last, Page::default());
        assert_eq!(unescape("a&#x41;&#66;&bogus;"), "aAB&bogus;");
    }
}
