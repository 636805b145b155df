//! Liberal reading of tool arguments. Models and some clients send numbers and booleans as
//! strings (`"timeout_seconds": "5"`; MCP Inspector's CLI sends every argument as one), maps
//! and lists as JSON text, and names in any case. The schemas stay exact (`"type":
//! "number"`, an enum of lower-case names): these deserializers, named with
//! `#[serde(deserialize_with)]`, only widen what is accepted, and schemars keeps describing
//! the field's own type. A value that still makes no sense is an error naming the field's
//! expected type, as serde words it.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};

/// A scalar as sent: a number, a boolean, a string, or null.
#[derive(Debug, Clone, PartialEq)]
enum Scalar {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Text(String),
}

/// What the text of a stringified scalar means: `"5"` is 5, `"true"` is true, `"null"` and
/// `""` are nothing.
fn from_text(s: &str) -> Scalar {
    let t = s.trim();
    if t.is_empty() || t.eq_ignore_ascii_case("null") {
        return Scalar::Null;
    }
    if let Ok(i) = t.parse::<i64>() {
        return Scalar::Int(i);
    }
    if let Ok(f) = t.parse::<f64>()
        && f.is_finite()
    {
        return Scalar::Float(f);
    }
    match t.to_ascii_lowercase().as_str() {
        "true" | "yes" | "on" => Scalar::Bool(true),
        "false" | "no" | "off" => Scalar::Bool(false),
        _ => Scalar::Text(s.to_owned()),
    }
}

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Scalar;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number, a boolean or a string")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Scalar, E> {
                Ok(Scalar::Null)
            }
            fn visit_none<E: de::Error>(self) -> Result<Scalar, E> {
                Ok(Scalar::Null)
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Scalar, E> {
                Ok(Scalar::Bool(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar::Int(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar, E> {
                Ok(i64::try_from(v).map_or(Scalar::Float(v as f64), Scalar::Int))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Scalar, E> {
                Ok(Scalar::Float(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Scalar, E> {
                Ok(from_text(v))
            }
        }
        d.deserialize_any(V)
    }
}

fn unexpected<E: de::Error>(s: &Scalar, expected: &str) -> E {
    let what = match s {
        Scalar::Null => de::Unexpected::Unit,
        Scalar::Bool(b) => de::Unexpected::Bool(*b),
        Scalar::Int(i) => de::Unexpected::Signed(*i),
        Scalar::Float(f) => de::Unexpected::Float(*f),
        Scalar::Text(t) => de::Unexpected::Str(t),
    };
    E::invalid_value(what, &expected)
}

/// An optional number of seconds (or any fraction): `5`, `2.5`, `"5"`, null.
pub(crate) fn opt_f64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    match Scalar::deserialize(d)? {
        Scalar::Null => Ok(None),
        Scalar::Int(i) => Ok(Some(i as f64)),
        Scalar::Float(f) => Ok(Some(f)),
        other => Err(unexpected(&other, "a number")),
    }
}

/// A required number: `5`, `2.5`, `"5"`.
pub(crate) fn f64<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    opt_f64(d)?.ok_or_else(|| de::Error::invalid_value(de::Unexpected::Unit, &"a number"))
}

/// An optional whole number: `5`, `"5"`, `5.0`, null.
pub(crate) fn opt_i64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    match Scalar::deserialize(d)? {
        Scalar::Null => Ok(None),
        Scalar::Int(i) => Ok(Some(i)),
        Scalar::Float(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Ok(Some(f as i64)),
        other => Err(unexpected(&other, "a whole number")),
    }
}

/// A boolean: `true`, `"true"`, `"False"`, `1`, `"0"`, `"yes"`; null is false.
pub(crate) fn bool<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    match Scalar::deserialize(d)? {
        Scalar::Null => Ok(false),
        Scalar::Bool(b) => Ok(b),
        Scalar::Int(0) => Ok(false),
        Scalar::Int(1) => Ok(true),
        other => Err(unexpected(&other, "true or false")),
    }
}

/// A map of names to strings: an object (numbers and booleans in it taken as their text),
/// the same object as JSON text, or null (empty).
pub(crate) fn string_map<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, String>, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = BTreeMap<String, String>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an object of names to strings")
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(BTreeMap::new())
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(BTreeMap::new())
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            if v.trim().is_empty() {
                return Ok(BTreeMap::new());
            }
            let mut de = serde_json::Deserializer::from_str(v);
            string_map(&mut de).map_err(|_| {
                E::invalid_value(de::Unexpected::Str(v), &"an object of names to strings")
            })
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some((k, v)) = map.next_entry::<String, Scalar>()? {
                let v = match v {
                    Scalar::Text(t) => t,
                    Scalar::Int(i) => i.to_string(),
                    Scalar::Float(f) => f.to_string(),
                    Scalar::Bool(b) => b.to_string(),
                    Scalar::Null => String::new(),
                };
                out.insert(k, v);
            }
            Ok(out)
        }
    }
    d.deserialize_any(V)
}

/// A list of strings: an array, the same array as JSON text, one string (a list of one), or
/// null (empty).
pub(crate) fn string_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Vec<String>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list of strings")
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(Vec::new())
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(Vec::new())
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            let t = v.trim();
            if t.is_empty() {
                return Ok(Vec::new());
            }
            if t.starts_with('[')
                && let Ok(list) = serde_json::from_str::<Vec<String>>(t)
            {
                return Ok(list);
            }
            Ok(vec![v.to_owned()])
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(s) = seq.next_element::<String>()? {
                out.push(s);
            }
            Ok(out)
        }
    }
    d.deserialize_any(V)
}

/// A name read in any case, by [`FromStr`] (whose error says what the names are).
pub(crate) fn from_name<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr,
    T::Err: fmt::Display,
{
    let s = String::deserialize(d)?;
    s.parse().map_err(de::Error::custom)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Debug, Deserialize, PartialEq)]
    struct Args {
        #[serde(default, deserialize_with = "opt_f64")]
        t: Option<f64>,
        #[serde(default, deserialize_with = "opt_i64")]
        n: Option<i64>,
        #[serde(default, deserialize_with = "bool")]
        b: bool,
        #[serde(default, deserialize_with = "string_map")]
        m: BTreeMap<String, String>,
        #[serde(default, deserialize_with = "string_list")]
        l: Vec<String>,
    }

    fn args(v: serde_json::Value) -> Result<Args, serde_json::Error> {
        serde_json::from_value(v)
    }

    #[test]
    fn numbers_come_as_numbers_or_as_their_text() {
        let a = args(json!({"t": "5", "n": "12"})).unwrap();
        assert_eq!((a.t, a.n), (Some(5.0), Some(12)));
        let a = args(json!({"t": 2.5, "n": 3.0})).unwrap();
        assert_eq!((a.t, a.n), (Some(2.5), Some(3)));
        let a = args(json!({"t": " 0.25 ", "n": null})).unwrap();
        assert_eq!((a.t, a.n), (Some(0.25), None));
        assert_eq!(args(json!({})).unwrap().t, None);
        for bad in [
            json!({"t": "soon"}),
            json!({"n": "1.5"}),
            json!({"t": true}),
        ] {
            let e = args(bad.clone()).unwrap_err().to_string();
            assert!(e.contains("number"), "{bad}: {e}");
        }
    }

    #[test]
    fn booleans_come_in_any_spelling() {
        for (v, want) in [
            (json!(true), true),
            (json!("true"), true),
            (json!("False"), false),
            (json!(1), true),
            (json!("0"), false),
            (json!("yes"), true),
            (json!(null), false),
        ] {
            assert_eq!(args(json!({ "b": v })).unwrap().b, want, "{v}");
        }
        assert!(args(json!({"b": "maybe"})).is_err());
    }

    #[test]
    fn maps_and_lists_also_come_as_json_text() {
        let a = args(json!({"m": "{\"X\": \"1\", \"N\": 2}", "l": "[\"a\", \"b\"]"})).unwrap();
        assert_eq!(
            a.m,
            BTreeMap::from([("N".into(), "2".into()), ("X".into(), "1".into())])
        );
        assert_eq!(a.l, ["a", "b"]);
        let a = args(json!({"m": {"Y": true}, "l": "requests==2.32"})).unwrap();
        assert_eq!(a.m["Y"], "true");
        assert_eq!(a.l, ["requests==2.32"]);
        assert!(args(json!({"m": "not json"})).is_err());
        assert!(args(json!({"m": ""})).unwrap().m.is_empty());
    }
}
