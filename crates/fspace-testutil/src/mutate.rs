//! Systematic mutations of saved JSON, for the loaders' mutation tests.
//!
//! [`json_mutants`] walks a JSON document and lists every single edit of these kinds, so a field
//! added to a saved type is covered without being named:
//!
//! | edit | where |
//! |---|---|
//! | one entry shorter / one longer | every array (an empty one gains a `0`) |
//! | two dimensions swapped | every nalgebra matrix `[data, rows, cols]`, every array of ≥ 2 unsigned integers (first two), every pair of unsigned-integer fields of one object |
//! | set to `null` (NaN's JSON form), −1, 0, 1, 1e308, 10¹² | every number |
//! | flipped | every boolean |
//! | removed | every object field |
//! | changed to each other variant | every enum tag: a string or the key of a one-field object whose bogus replacement the parser refuses with "expected one of …" (the variants are read from that message); fields the new variant misses are filled with `5`, or `true` where a boolean is expected |
//!
//! A [`Mutant`] is a list of [`Edit`]s, so several can be applied one after another
//! ([`apply`]); an edit whose path no longer exists is skipped.

use serde_json::{Map, Value};

/// One step of a path into a JSON document.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// An object field.
    Key(String),
    /// An array entry.
    Index(usize),
}

/// A change at one place of a document.
#[derive(Debug, Clone, PartialEq)]
pub enum Edit {
    /// Replace the value at the path.
    Replace(Vec<Step>, Value),
    /// Remove the object field at the path (its last step is a key).
    Remove(Vec<Step>),
}

/// A named list of edits.
#[derive(Debug, Clone, PartialEq)]
pub struct Mutant {
    /// What was changed where (for failure messages).
    pub description: String,
    /// The edits, applied in order.
    pub edits: Vec<Edit>,
}

fn show(path: &[Step]) -> String {
    let mut s = String::from("$");
    for step in path {
        match step {
            Step::Key(k) => {
                s.push('.');
                s.push_str(k);
            }
            Step::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    s
}

fn get_mut<'a>(root: &'a mut Value, path: &[Step]) -> Option<&'a mut Value> {
    let mut v = root;
    for step in path {
        v = match (step, v) {
            (Step::Key(k), Value::Object(m)) => m.get_mut(k)?,
            (Step::Index(i), Value::Array(a)) => a.get_mut(*i)?,
            _ => return None,
        };
    }
    Some(v)
}

/// Applies `mutant`'s edits to `doc` in order, skipping edits whose path is gone.
pub fn apply(doc: &mut Value, mutant: &Mutant) {
    for edit in &mutant.edits {
        match edit {
            Edit::Replace(path, value) => {
                if let Some(slot) = get_mut(doc, path) {
                    *slot = value.clone();
                }
            }
            Edit::Remove(path) => {
                if let Some((Step::Key(k), parent)) = path.split_last() {
                    if let Some(Value::Object(m)) = get_mut(doc, parent) {
                        m.remove(k);
                    }
                }
            }
        }
    }
}

/// The text of `doc` after `mutant`.
pub fn mutated_text(doc: &Value, mutant: &Mutant) -> String {
    let mut d = doc.clone();
    apply(&mut d, mutant);
    serde_json::to_string(&d).expect("a JSON value serialises")
}

fn replace(path: &[Step], value: Value, what: &str) -> Mutant {
    Mutant { description: format!("{} {what}", show(path)), edits: vec![Edit::Replace(path.to_vec(), value)] }
}

fn is_uint(v: &Value) -> bool {
    v.as_u64().is_some()
}

/// The values every number is set to: `null` stands for NaN (JSON has no NaN; serde_json
/// writes a non-finite float as `null`).
fn bad_numbers() -> Vec<(Value, &'static str)> {
    vec![
        (Value::Null, "set to null (NaN)"),
        (Value::from(-1), "set to -1"),
        (Value::from(0), "set to 0"),
        (Value::from(1), "set to 1"),
        (Value::from(1e308), "set to 1e308"),
        (Value::from(1_000_000_000_000u64), "set to 1e12"),
    ]
}

fn structural(doc: &Value, path: &mut Vec<Step>, out: &mut Vec<Mutant>) {
    match doc {
        Value::Number(_) => {
            for (v, what) in bad_numbers() {
                out.push(replace(path, v, what));
            }
        }
        Value::Bool(b) => out.push(replace(path, Value::Bool(!b), "flipped")),
        Value::Array(a) => {
            let mut shorter = a.clone();
            if shorter.pop().is_some() {
                out.push(replace(path, Value::Array(shorter), "one entry shorter"));
            }
            let mut longer = a.clone();
            longer.push(a.last().cloned().unwrap_or(Value::from(0)));
            out.push(replace(path, Value::Array(longer), "one entry longer"));
            // nalgebra's matrices serialise as [data, rows, cols].
            if a.len() == 3 && a[0].is_array() && is_uint(&a[1]) && is_uint(&a[2]) {
                let mut swapped = a.clone();
                swapped.swap(1, 2);
                out.push(replace(path, Value::Array(swapped), "matrix dimensions swapped"));
            } else if a.len() >= 2 && is_uint(&a[0]) && is_uint(&a[1]) && a[0] != a[1] {
                let mut swapped = a.clone();
                swapped.swap(0, 1);
                out.push(replace(path, Value::Array(swapped), "first two entries swapped"));
            }
            for (i, item) in a.iter().enumerate() {
                path.push(Step::Index(i));
                structural(item, path, out);
                path.pop();
            }
        }
        Value::Object(m) => {
            let uints: Vec<(&String, &Value)> = m.iter().filter(|(_, v)| is_uint(v)).collect();
            for (i, (ka, va)) in uints.iter().enumerate() {
                for (kb, vb) in &uints[i + 1..] {
                    if va != vb {
                        let pa = [path.as_slice(), &[Step::Key((*ka).clone())]].concat();
                        let pb = [path.as_slice(), &[Step::Key((*kb).clone())]].concat();
                        out.push(Mutant {
                            description: format!("{} fields {ka} and {kb} swapped", show(path)),
                            edits: vec![Edit::Replace(pa, (*vb).clone()), Edit::Replace(pb, (*va).clone())],
                        });
                    }
                }
            }
            for (k, v) in m {
                path.push(Step::Key(k.clone()));
                out.push(Mutant {
                    description: format!("{} removed", show(path)),
                    edits: vec![Edit::Remove(path.clone())],
                });
                structural(v, path, out);
                path.pop();
            }
        }
        Value::Null | Value::String(_) => {}
    }
}

const BOGUS: &str = "__fspace_bogus_variant__";

/// The names serde lists after "expected" in an unknown-variant error.
fn expected_variants(message: &str) -> Vec<String> {
    let Some(at) = message.find("unknown variant") else { return Vec::new() };
    let Some(exp) = message[at..].find("expected") else { return Vec::new() };
    message[at + exp..].split('`').skip(1).step_by(2).map(str::to_string).collect()
}

fn missing_field(message: &str) -> Option<String> {
    let at = message.find("missing field `")?;
    let rest = &message[at + "missing field `".len()..];
    Some(rest[..rest.find('`')?].to_string())
}

/// Fills the fields a changed variant misses (`5`, or `true` where a boolean is expected) at the
/// object `at` (for an externally tagged variant, `at` is the one field's value).
fn repair(
    doc: &Value,
    at: &[Step],
    mut edits: Vec<Edit>,
    parse: &dyn Fn(&str) -> Result<(), String>,
) -> Vec<Edit> {
    for _ in 0..8 {
        let mut d = doc.clone();
        apply(&mut d, &Mutant { description: String::new(), edits: edits.clone() });
        let text = serde_json::to_string(&d).expect("a JSON value serialises");
        let Err(message) = parse(&text) else { break };
        let Some(field) = missing_field(&message) else {
            // A filled field of the wrong type: a boolean is the one other scalar the
            // variants' fields take.
            if message.contains("expected a boolean") {
                if let Some(Edit::Replace(_, v)) = edits.last_mut() {
                    if v.as_u64() == Some(5) {
                        *v = Value::Bool(true);
                        continue;
                    }
                }
            }
            break;
        };
        if !matches!(get_mut(&mut d, at), Some(Value::Object(_))) {
            break;
        }
        edits.push(Edit::Replace([at, &[Step::Key(field)]].concat(), Value::from(5)));
    }
    edits
}

fn tags(
    doc: &Value,
    node: &Value,
    path: &mut Vec<Step>,
    parse: &dyn Fn(&str) -> Result<(), String>,
    out: &mut Vec<Mutant>,
) {
    let variants_for = |edit: Edit| -> Vec<String> {
        let mut d = doc.clone();
        apply(&mut d, &Mutant { description: String::new(), edits: vec![edit] });
        match parse(&serde_json::to_string(&d).expect("a JSON value serialises")) {
            Err(message) => expected_variants(&message),
            Ok(()) => Vec::new(),
        }
    };
    match node {
        Value::String(s) => {
            for variant in variants_for(Edit::Replace(path.clone(), Value::from(BOGUS))) {
                if variant != *s {
                    // An internally tagged enum: the tag's object takes the new variant's fields.
                    let at = &path[..path.len() - 1];
                    let edits = repair(
                        doc,
                        at,
                        vec![Edit::Replace(path.clone(), Value::from(variant.clone()))],
                        parse,
                    );
                    out.push(Mutant { description: format!("{} tag {s} → {variant}", show(path)), edits });
                }
            }
        }
        Value::Object(m) => {
            if m.len() == 1 {
                let (key, inner) = m.iter().next().expect("one field");
                let mut renamed = Map::new();
                renamed.insert(BOGUS.to_string(), inner.clone());
                for variant in variants_for(Edit::Replace(path.clone(), Value::Object(renamed))) {
                    if variant != *key {
                        let mut changed = Map::new();
                        changed.insert(variant.clone(), inner.clone());
                        let at = [path.as_slice(), &[Step::Key(variant.clone())]].concat();
                        let edits = repair(
                            doc,
                            &at,
                            vec![Edit::Replace(path.clone(), Value::Object(changed))],
                            parse,
                        );
                        out.push(Mutant {
                            description: format!("{} variant {key} → {variant}", show(path)),
                            edits,
                        });
                    }
                }
            }
            for (k, v) in m {
                path.push(Step::Key(k.clone()));
                tags(doc, v, path, parse, out);
                path.pop();
            }
        }
        Value::Array(a) => {
            // Numeric arrays hold no tags; skip them quickly.
            if a.iter().all(|v| v.is_number()) {
                return;
            }
            for (i, v) in a.iter().enumerate() {
                path.push(Step::Index(i));
                tags(doc, v, path, parse, out);
                path.pop();
            }
        }
        _ => {}
    }
}

/// Every single-edit mutant of `doc` (see the module docs). `parse` tries to load a text and
/// returns its error message; it is used to discover enum variants and the fields they need.
pub fn json_mutants(doc: &Value, parse: &dyn Fn(&str) -> Result<(), String>) -> Vec<Mutant> {
    let mut out = Vec::new();
    structural(doc, &mut Vec::new(), &mut out);
    tags(doc, doc, &mut Vec::new(), parse, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_each_kind_of_edit_and_discovers_variants() {
        let doc: Value = serde_json::json!({"m": [[1.0, 2.0], 2, 1], "on": true, "kind": "a"});
        let parse = |text: &str| -> Result<(), String> {
            let v: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
            match v.get("kind").and_then(Value::as_str) {
                Some("a" | "b") => Ok(()),
                Some(other) => Err(format!("unknown variant `{other}`, expected `a` or `b`")),
                None => Err("missing field `kind`".into()),
            }
        };
        let mutants = json_mutants(&doc, &parse);
        let names: Vec<&str> = mutants.iter().map(|m| m.description.as_str()).collect();
        assert!(names.contains(&"$.m matrix dimensions swapped"), "{names:?}");
        assert!(names.contains(&"$.on flipped"));
        assert!(names.contains(&"$.kind removed"));
        assert!(names.contains(&"$.m[0][1] set to null (NaN)"));
        assert!(names.contains(&"$.kind tag a → b"));
        let swapped = mutants.iter().find(|m| m.description == "$.m matrix dimensions swapped").unwrap();
        let back: Value = serde_json::from_str(&mutated_text(&doc, swapped)).unwrap();
        assert_eq!(back, serde_json::json!({"m": [[1.0, 2.0], 1, 2], "on": true, "kind": "a"}));
    }
}
