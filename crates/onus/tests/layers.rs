//! The layers of `crates/onus/src` point one way. Each module's imports are read from its source
//! (`crate::x`, `super::x` and `use crate::{x, ...}` outside comment lines) and checked:
//!
//! - `sql` (the SQL engine layer) imports nothing of the crate but `clock`;
//! - `store` imports nothing of `runtime`;
//! - the modules import each other without a loop, apart from the loops still listed in
//!   [`LOOPS_LEFT`], which may only shrink: a new loop fails, and so does a listed one that is gone
//!   (take it off the list).
//!
//! Modules are the crate's top-level ones, with `runtime`'s files counted one by one
//! (`runtime::worker`, ...), since the runtime is where loops grow.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Loops between modules not untangled yet, each as its sorted members.
const LOOPS_LEFT: &[&[&str]] = &[];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read src") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module a file belongs to: `sql`, `store`, `runtime::worker`, `job`, ...
fn module_of(rel: &Path) -> String {
    let parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    match parts.as_slice() {
        [top] => top.clone(),
        [runtime, file, ..] if runtime == "runtime" => {
            if file == "mod" {
                "runtime".into()
            } else {
                format!("runtime::{file}")
            }
        }
        [top, ..] => top.clone(),
        [] => unreachable!(),
    }
}

/// The code of a file without its comment lines (doc comments and their examples included).
fn code(text: &str) -> String {
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident_after(s: &str) -> Option<String> {
    let id: String = s
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    (!id.is_empty()).then_some(id)
}

/// The modules `module` names in `code`.
fn imports(module: &str, code: &str, tops: &BTreeSet<String>) -> BTreeSet<String> {
    let runtime_file = |name: &str| {
        let m = format!("runtime::{name}");
        tops.contains(&m).then_some(m)
    };
    let resolve = |first: &str, rest: &str| -> Option<String> {
        if first == "runtime" {
            let next = rest.strip_prefix("::").and_then(ident_after);
            return Some(
                next.and_then(|n| runtime_file(&n))
                    .unwrap_or("runtime".into()),
            );
        }
        tops.contains(first).then(|| first.to_string())
    };
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let after = &code[i + "crate::".len()..];
        if let Some(rest) = after.strip_prefix('{') {
            // `use crate::{a, b::c, ...}`: the first segment of each item.
            let mut items = vec![String::new()];
            let mut depth = 0;
            for c in rest.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => items.push(String::new()),
                    _ => {}
                }
                if let Some(last) = items.last_mut() {
                    last.push(c);
                }
            }
            for item in &items {
                let item = item.trim_start_matches(',').trim();
                if let Some(first) = ident_after(item) {
                    out.extend(resolve(&first, &item[first.len()..]));
                }
            }
        } else if let Some(first) = ident_after(after) {
            out.extend(resolve(&first, &after[first.len()..]));
        }
    }
    if let Some(file) = module.strip_prefix("runtime::") {
        // A runtime file's `super::x` names a sibling (or the runtime's mod.rs).
        for (i, _) in code.match_indices("super::") {
            let after = &code[i + "super::".len()..];
            match ident_after(after) {
                Some(n) if n != file => out.insert(runtime_file(&n).unwrap_or("runtime".into())),
                _ => out.insert("runtime".into()),
            };
        }
    }
    out.remove(module);
    out
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let root = src();
    let mut all = Vec::new();
    files(&root, &mut all);
    let rel: Vec<(PathBuf, String)> = all
        .iter()
        .map(|p| {
            let r = p.strip_prefix(&root).expect("under src").to_path_buf();
            let m = module_of(&r);
            (p.clone(), m)
        })
        .filter(|(_, m)| m != "lib")
        .collect();
    let tops: BTreeSet<String> = rel.iter().map(|(_, m)| m.clone()).collect();
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (path, m) in &rel {
        let text = std::fs::read_to_string(path).expect("read file");
        let names = imports(m, &code(&text), &tops);
        g.entry(m.clone()).or_default().extend(names);
    }
    g
}

/// The strongly connected components with more than one member (Tarjan).
fn loops(g: &BTreeMap<String, BTreeSet<String>>) -> BTreeSet<Vec<String>> {
    struct State<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        next: usize,
        out: BTreeSet<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on.insert(v);
        let g = s.g;
        for w in g.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !g.contains_key(w) {
                continue;
            }
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.insert(comp);
            }
        }
    }
    let mut s = State {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: BTreeSet::new(),
    };
    for v in g.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

#[test]
fn the_sql_layer_imports_nothing_above_it() {
    let g = graph();
    let sql = &g["sql"];
    let above: Vec<&String> = sql.iter().filter(|m| *m != "clock").collect();
    assert!(
        above.is_empty(),
        "crates/onus/src/sql imports {above:?}: the SQL engine layer may use only `clock`; move what it needs down into it, or the code that needs it up into the store"
    );
}

#[test]
fn the_store_imports_nothing_of_the_runtime() {
    let g = graph();
    let up: Vec<&String> = g["store"]
        .iter()
        .filter(|m| m.starts_with("runtime"))
        .collect();
    assert!(
        up.is_empty(),
        "crates/onus/src/store imports {up:?}: the store sits below the runtime"
    );
}

#[test]
fn modules_import_each_other_without_a_loop() {
    let found = loops(&graph());
    let left: BTreeSet<Vec<String>> = LOOPS_LEFT
        .iter()
        .map(|l| l.iter().map(|m| m.to_string()).collect())
        .collect();
    let new: Vec<&Vec<String>> = found.difference(&left).collect();
    let gone: Vec<&Vec<String>> = left.difference(&found).collect();
    assert!(
        new.is_empty() && gone.is_empty(),
        "import loops between modules of crates/onus/src: new {new:?} (untangle them), gone {gone:?} (take them off LOOPS_LEFT in this test)"
    );
}

#[test]
fn the_check_sees_a_loop_and_an_upward_import() {
    let tops: BTreeSet<String> = ["sql", "store", "clock", "runtime::worker", "runtime::hub"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let sql = imports(
        "sql",
        &code("/// [`crate::runtime::Client`]\nuse crate::store::Finish;\n// crate::runtime"),
        &tops,
    );
    assert_eq!(sql, BTreeSet::from(["store".to_string()]));
    let mut g = BTreeMap::new();
    g.insert(
        "runtime::worker".to_string(),
        imports("runtime::worker", &code("use super::hub::Hub;"), &tops),
    );
    g.insert(
        "runtime::hub".to_string(),
        imports(
            "runtime::hub",
            &code("use crate::{clock::Timestamp, runtime::worker::Slot};"),
            &tops,
        ),
    );
    assert_eq!(
        loops(&g),
        BTreeSet::from([vec![
            "runtime::hub".to_string(),
            "runtime::worker".to_string()
        ]])
    );
}
