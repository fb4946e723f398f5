//! Lists that results.json holds as one text, their items joined by a
//! separator: a subject's `target_datapath` (`"xdp, packet"`) and
//! `skipped` (reasons joined by `"; "`). The lab keeps them as lists and
//! adds an item once (`add_once`); the file keeps the text it always held,
//! so older files read as before and new ones keep their bytes. An empty
//! list is no text: the field is left out (`skip_serializing_if =
//! "Vec::is_empty"`), as the `None` it replaces was.
//!
//! An item that holds its list's separator reads back as two items; the
//! text written is the same either way.

use serde::{Deserialize, Deserializer, Serializer};

/// Add `item` unless the list has it already.
pub fn add_once(list: &mut Vec<String>, item: &str) {
    if !list.iter().any(|x| x == item) {
        list.push(item.to_string());
    }
}

fn write<S: Serializer>(items: &[String], sep: &str, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&items.join(sep))
}

fn read<'de, D: Deserializer<'de>>(d: D, sep: &str) -> Result<Vec<String>, D::Error> {
    Ok(match Option::<String>::deserialize(d)? {
        Some(text) if !text.is_empty() => text.split(sep).map(str::to_string).collect(),
        _ => vec![],
    })
}

/// A module for `#[serde(with = "joined::NAME")]`: items joined by `$sep`.
macro_rules! joined_by {
    ($name:ident, $sep:literal) => {
        #[doc = concat!("Items joined by `\"", $sep, "\"` (`#[serde(with = \"joined::", stringify!($name), "\")]`).")]
        pub mod $name {
            pub fn serialize<S: serde::Serializer>(items: &[String], s: S) -> Result<S::Ok, S::Error> {
                super::write(items, $sep, s)
            }

            pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
                super::read(d, $sep)
            }
        }
    };
}

joined_by!(comma, ", ");
joined_by!(semicolon, "; ");
