//! Where in the file is `wan.paths[1].dscp`? — a key-path ↔ byte-span index.
//!
//! The typed schema ([`crate::schema`]) is deliberately plain (no `Spanned<T>`
//! on every field): validation works on key *paths*, and this index turns a
//! path back into a position. It also works the other way round: toml's
//! deserialization errors carry only a byte span, and [`SpanIndex::path_at`]
//! names the key that span belongs to.
//!
//! The index is built by deserializing the document a second time into a
//! generic tree while asking toml for spans through the `serde_spanned`
//! protocol (the mechanism behind `toml::Spanned`). We speak that protocol by
//! hand instead of using `toml::Spanned<T>` because toml has values *without*
//! a span (the implicit table `a` in `a.b = 1`, datetimes), and
//! `toml::Spanned<T>` fails on those; our visitor simply records "no span".

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

// The serde_spanned protocol: a deserializer that knows spans answers
// `deserialize_struct(NAME, [START, END, VALUE])` with a three-entry map. These
// are the names `toml::Spanned` itself uses; the `index_records_spans` test
// fails loudly if a toml upgrade ever changes them (we would then merely lose
// positions, never crash: unspanned values are handled below).
const SPANNED_NAME: &str = "$__serde_spanned_private_Spanned";
const SPANNED_START: &str = "$__serde_spanned_private_start";
const SPANNED_END: &str = "$__serde_spanned_private_end";
const SPANNED_VALUE: &str = "$__serde_spanned_private_value";
const SPANNED_FIELDS: &[&str] = &[SPANNED_START, SPANNED_END, SPANNED_VALUE];

/// One key (or array element) of the document.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// Dotted path, e.g. `wan.paths[1].dscp`.
    pub path: String,
    /// Span of the key itself (`dscp` in `dscp = 70`); array elements have none.
    pub key_span: Option<Range<usize>>,
    /// Span of the value (`70`); for a `[table]` or `[[array.of.tables]]` entry
    /// toml reports the header.
    pub value_span: Option<Range<usize>>,
    /// Tables are never shown as `key = value` in messages.
    pub is_table: bool,
}

/// All keys of one document with their spans.
#[derive(Debug, Default)]
pub(crate) struct SpanIndex {
    entries: Vec<Entry>,
    by_path: HashMap<String, usize>,
}

impl SpanIndex {
    /// Indexes `text`; `None` if it is not syntactically valid TOML (the typed
    /// parse reports that error with its own span).
    pub fn build(text: &str) -> Option<SpanIndex> {
        let root: Node = toml::from_str(text).ok()?;
        let mut index = SpanIndex::default();
        if let NodeKind::Table(items) = root.kind {
            index.add_table("", items);
        }
        Some(index)
    }

    fn add_table(&mut self, prefix: &str, items: Vec<(Key, Node)>) {
        for (key, node) in items {
            let path = if prefix.is_empty() {
                quote_key(&key.name)
            } else {
                format!("{prefix}.{}", quote_key(&key.name))
            };
            self.add(path, key.span, node);
        }
    }

    fn add(&mut self, path: String, key_span: Option<Range<usize>>, node: Node) {
        let is_table = matches!(node.kind, NodeKind::Table(_));
        self.by_path.insert(path.clone(), self.entries.len());
        self.entries.push(Entry {
            path: path.clone(),
            key_span,
            value_span: node.span,
            is_table,
        });
        match node.kind {
            NodeKind::Table(items) => self.add_table(&path, items),
            NodeKind::Array(elements) => {
                for (i, element) in elements.into_iter().enumerate() {
                    self.add(format!("{path}[{i}]"), None, element);
                }
            }
            NodeKind::Leaf => {}
        }
    }

    /// Every key and array element, in document order.
    #[cfg(test)]
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    pub fn get(&self, path: &str) -> Option<&Entry> {
        self.by_path.get(path).map(|&i| &self.entries[i])
    }

    /// The entry that best explains a byte offset reported by toml: a key
    /// whose own span contains it (unknown-key errors point at the key), else
    /// the innermost value containing it. The flag says whether it was a key.
    pub fn path_at(&self, offset: usize) -> Option<(&Entry, bool)> {
        let contains = |r: &Option<Range<usize>>| {
            r.as_ref()
                .is_some_and(|r| r.start <= offset && (offset < r.end || r.is_empty()))
        };
        if let Some(e) = self.entries.iter().find(|e| contains(&e.key_span)) {
            return Some((e, true));
        }
        self.entries
            .iter()
            .filter(|e| contains(&e.value_span))
            .min_by_key(|e| e.value_span.as_ref().map_or(usize::MAX, |r| r.len()))
            .map(|e| (e, false))
    }

    /// The span to point at for a problem with `path`: the value if present,
    /// else the nearest enclosing table that exists (a missing key is reported
    /// at its section header). Returns the entry found and whether it is
    /// `path` itself.
    pub fn nearest(&self, path: &str) -> Option<(&Entry, bool)> {
        let mut p = path;
        let mut exact = true;
        loop {
            if let Some(e) = self.get(p) {
                if e.value_span.is_some() || e.key_span.is_some() {
                    return Some((e, exact));
                }
            }
            p = parent(p)?;
            exact = false;
        }
    }
}

/// `a.b[2].c` → `a.b[2]` → `a.b` → `a` → none. Paths produced by the
/// validator only contain bare keys, so no quote handling is needed here.
fn parent(path: &str) -> Option<&str> {
    let cut = path.rfind(['.', '['])?;
    Some(&path[..cut])
}

/// Renders a key the way TOML would need it written: bare if possible.
fn quote_key(key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if bare {
        key.to_string()
    } else {
        format!("{key:?}")
    }
}

/// Generic document tree with optional spans.
struct Node {
    span: Option<Range<usize>>,
    kind: NodeKind,
}

enum NodeKind {
    Table(Vec<(Key, Node)>),
    Array(Vec<Node>),
    Leaf,
}

struct Key {
    span: Option<Range<usize>>,
    name: String,
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_struct(SPANNED_NAME, SPANNED_FIELDS, NodeVisitor)
    }
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_struct(SPANNED_NAME, SPANNED_FIELDS, KeyVisitor)
    }
}

/// Reads the rest of a spanned wrapper whose first key (`START`) was already
/// consumed: `START: usize, END: usize, VALUE: T`.
fn finish_spanned<'de, A, T>(map: &mut A) -> Result<(Range<usize>, T), A::Error>
where
    A: MapAccess<'de>,
    T: Deserialize<'de>,
{
    let start: usize = map.next_value()?;
    let mut end = None;
    let mut value = None;
    while let Some(k) = map.next_key::<String>()? {
        match k.as_str() {
            SPANNED_END => end = Some(map.next_value::<usize>()?),
            SPANNED_VALUE => value = Some(map.next_value::<T>()?),
            _ => return Err(de::Error::custom("unexpected key in spanned value")),
        }
    }
    match (end, value) {
        (Some(end), Some(value)) => Ok((start..end.max(start), value)),
        _ => Err(de::Error::custom("incomplete spanned value")),
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = Key;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
        Ok(Key {
            span: None,
            name: v.to_string(),
        })
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Key, A::Error> {
        match map.next_key::<String>()?.as_deref() {
            Some(SPANNED_START) => {
                let (span, name) = finish_spanned::<A, String>(&mut map)?;
                Ok(Key {
                    span: Some(span),
                    name,
                })
            }
            _ => Err(de::Error::custom("a key cannot be a table")),
        }
    }
}

/// The value inside a spanned wrapper. It must be read with
/// `deserialize_any`: asking for a span again would recurse forever.
struct Bare(Node);

impl<'de> Deserialize<'de> for Bare {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NodeVisitor).map(Bare)
    }
}

/// A value that is not a table or array; we only need its span.
struct Leaf;

impl<'de> Deserialize<'de> for Leaf {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_ignored_any(de::IgnoredAny).map(|_| Leaf)
    }
}

struct NodeVisitor;

impl NodeVisitor {
    fn leaf<E>() -> Result<Node, E> {
        Ok(Node {
            span: None,
            kind: NodeKind::Leaf,
        })
    }
}

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any TOML value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Node, E> {
        Self::leaf()
    }
    fn visit_i64<E>(self, _: i64) -> Result<Node, E> {
        Self::leaf()
    }
    fn visit_u64<E>(self, _: u64) -> Result<Node, E> {
        Self::leaf()
    }
    fn visit_f64<E>(self, _: f64) -> Result<Node, E> {
        Self::leaf()
    }
    fn visit_str<E>(self, _: &str) -> Result<Node, E> {
        Self::leaf()
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut elements = Vec::new();
        while let Some(e) = seq.next_element::<Node>()? {
            elements.push(e);
        }
        Ok(Node {
            span: None,
            kind: NodeKind::Array(elements),
        })
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        // Either the spanned wrapper around a value, or an unspanned table
        // whose first key we must now treat as an ordinary key.
        let first = match map.next_key::<Key>()? {
            None => {
                return Ok(Node {
                    span: None,
                    kind: NodeKind::Table(Vec::new()),
                })
            }
            Some(k) => k,
        };
        if first.name == SPANNED_START {
            let (span, Bare(inner)) = finish_spanned::<A, Bare>(&mut map)?;
            return Ok(Node {
                span: Some(span),
                kind: inner.kind,
            });
        }
        if first.name.starts_with("$__toml_private") {
            // A datetime, which toml hands out as a one-entry map.
            map.next_value::<Leaf>()?;
            return Self::leaf();
        }
        let mut items = vec![(first, map.next_value::<Node>()?)];
        while let Some(k) = map.next_key::<Key>()? {
            items.push((k, map.next_value::<Node>()?));
        }
        Ok(Node {
            span: None,
            kind: NodeKind::Table(items),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = r#"site = "x"
when = 1979-05-27T07:32:00Z
[wan]
insecure = true
a.b = 3
inl = { x = 1, y = [1, 2] }

[[wan.paths]]
name = "a"

[[wan.paths]]
name = "b"
dscp = 70
"weird key" = 1
"#;

    fn text(r: &Option<Range<usize>>) -> &'static str {
        &DOC[r.clone().unwrap()]
    }

    #[test]
    fn index_records_spans() {
        let idx = SpanIndex::build(DOC).unwrap();
        let dscp = idx.get("wan.paths[1].dscp").unwrap();
        assert_eq!(text(&dscp.value_span), "70");
        assert_eq!(text(&dscp.key_span), "dscp");
        assert_eq!(text(&idx.get("site").unwrap().value_span), "\"x\"");
        assert_eq!(text(&idx.get("wan.inl.y[1]").unwrap().value_span), "2");
        assert_eq!(text(&idx.get("wan.a.b").unwrap().value_span), "3");
        assert!(idx.get("wan.paths[1]").unwrap().is_table);
        assert!(idx.get("wan.paths[1].\"weird key\"").is_some());
        assert!(idx.get("when").is_some());
    }

    #[test]
    fn offsets_map_back_to_paths() {
        let idx = SpanIndex::build(DOC).unwrap();
        let at = DOC.find("70").unwrap();
        let (e, on_key) = idx.path_at(at).unwrap();
        assert_eq!((e.path.as_str(), on_key), ("wan.paths[1].dscp", false));
        let at = DOC.find("dscp").unwrap();
        let (e, on_key) = idx.path_at(at).unwrap();
        assert_eq!((e.path.as_str(), on_key), ("wan.paths[1].dscp", true));
    }

    #[test]
    fn missing_keys_fall_back_to_their_table() {
        let idx = SpanIndex::build(DOC).unwrap();
        let (e, exact) = idx.nearest("wan.paths[0].rate").unwrap();
        assert_eq!((e.path.as_str(), exact), ("wan.paths[0]", false));
        assert!(idx.nearest("buffer.size").is_none());
    }

    #[test]
    fn invalid_toml_has_no_index() {
        assert!(SpanIndex::build("a = [").is_none());
    }
}
