//! Renders a Helm chart's templates without Helm, for tests/deploy.rs: no Helm binary exists on
//! the developers' machines or in CI, and the Rust ports of Go's text/template are either
//! unmaintained (gtmpl, last release 2021) or need a newer Rust than the workspace's
//! rust-version (gotmpl). The chart is kept to the subset below; anything else is an error, so a
//! template that uses more fails its test instead of rendering wrong.
//!
//! Supported, with Go's semantics:
//! - text and actions `{{ ... }}`; `{{- ` trims all white space (space, tab, CR, LF) before the
//!   action, ` -}}` all white space after it (the dash must be separated from the action by
//!   white space, as in Go);
//! - comments `{{/* ... */}}`, also with trim markers;
//! - `if` / `else if` / `else` / `end`, `with` / `else` / `end`, `range` over a list or over a
//!   map's values in key order, with `else` for an empty one; truth as in Go (false, 0, "", nil,
//!   an empty list or map are false);
//! - pipelines `a | f x | g`: each result is the last argument of the next function;
//! - operands: `.`, `.a.b`, `$`, `$.a.b`, "strings" (escapes `\" \\ \n \t \r`), `raw strings`,
//!   integers, `true`, `false`, `nil`, `( pipeline )`;
//! - functions: `quote`, `default`, `toYaml`, `indent`, `nindent`, `not`, `and`, `or`, `eq`,
//!   `ne`, `empty`, `has` (Sprig's and Go's meanings);
//! - data: `.Values` (values.yaml deep-merged with the overrides, as `--set`/`-f` do),
//!   `.Release.Name`, `.Release.Namespace`, `.Release.Service`, `.Chart.Name`, `.Chart.Version`,
//!   `.Chart.AppVersion`.
//!
//! Stricter than Helm, on purpose: a field missing from the data is an error (Helm prints
//! nothing), so a typo in a template or a value renamed in values.yaml fails; printing a map or a
//! list is an error (Go would print `map[...]`: use toYaml).
//!
//! Not supported: variables other than `$`, `define` / `template` / `include` / `tpl`, `printf`
//! and the rest of Sprig, `break` / `continue`, `range $i, $v := ...`, `_helpers.tpl`, NOTES.txt.

use std::path::Path;

use serde::Deserialize as _;
use serde_json::{Map, Value, json};

/// Parses a YAML text of one or more documents into JSON values, dropping empty documents.
pub fn yaml_documents(text: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text)
        .map(|d| serde_json::to_value(serde_norway::Value::deserialize(d).unwrap()).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

/// A chart on disk: Chart.yaml, values.yaml, templates/ and crds/.
pub struct Chart {
    meta: Value,
    values: Value,
    /// (file name, text) of every template, in name order.
    templates: Vec<(String, String)>,
    /// Text of every file of crds/, in name order.
    crds: Vec<String>,
}

impl Chart {
    pub fn load(dir: &Path) -> Chart {
        let read = |p: &Path| {
            std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        };
        let meta = single(&read(&dir.join("Chart.yaml")));
        let values = single(&read(&dir.join("values.yaml")));
        let mut templates = Vec::new();
        for path in sorted_files(&dir.join("templates")) {
            let name = path.file_name().unwrap().to_str().unwrap().to_string();
            // Anything else in templates/ would be rendered by Helm but not here.
            assert!(
                name.ends_with(".yaml") && !name.starts_with('_'),
                "templates/{name}: only *.yaml templates without helpers are supported"
            );
            templates.push((name, read(&path)));
        }
        let crds = sorted_files(&dir.join("crds"))
            .iter()
            .map(|p| read(p))
            .collect();
        Chart {
            meta,
            values,
            templates,
            crds,
        }
    }

    pub fn values(&self) -> &Value {
        &self.values
    }

    pub fn meta(&self) -> &Value {
        &self.meta
    }

    /// The text of every template, for checks on the templates themselves.
    pub fn template_texts(&self) -> impl Iterator<Item = &str> {
        self.templates.iter().map(|(_, t)| t.as_str())
    }

    /// What `helm template NAME CHART -n NAMESPACE --include-crds -f overrides` prints, parsed:
    /// the CRDs, then every template's documents.
    pub fn render(&self, name: &str, namespace: &str, overrides: &Value) -> Vec<Value> {
        let mut values = self.values.clone();
        merge(&mut values, overrides);
        let field = |k: &str| self.meta.get(k).cloned().unwrap_or(Value::Null);
        let data = json!({
            "Values": values,
            "Release": {"Name": name, "Namespace": namespace, "Service": "Helm"},
            "Chart": {"Name": field("name"), "Version": field("version"),
                      "AppVersion": field("appVersion")},
        });
        let mut docs: Vec<Value> = self.crds.iter().flat_map(|t| yaml_documents(t)).collect();
        for (file, text) in &self.templates {
            let out = render(text, &data).unwrap_or_else(|e| panic!("templates/{file}: {e}"));
            docs.extend(yaml_documents(&out));
        }
        docs
    }
}

fn single(text: &str) -> Value {
    let mut docs = yaml_documents(text);
    assert_eq!(docs.len(), 1, "expected one YAML document");
    docs.pop().unwrap()
}

fn sorted_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

/// Helm's coalescing of user values into the chart's: maps merge key by key, anything else
/// replaces, and null deletes the key.
pub fn merge(base: &mut Value, over: &Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                if v.is_null() {
                    b.remove(k);
                } else if let Some(existing) = b.get_mut(k) {
                    merge(existing, v);
                } else {
                    b.insert(k.clone(), v.clone());
                }
            }
        }
        (b, o) => *b = o.clone(),
    }
}

/// Renders one template over `data`.
pub fn render(template: &str, data: &Value) -> Result<String, String> {
    let items = lex(template)?;
    let mut pos = 0;
    let (nodes, stop) = parse_list(&items, &mut pos)?;
    if let Some(stop) = stop {
        return Err(format!("unexpected {{{{{stop}}}}}"));
    }
    let mut out = String::new();
    exec(
        &nodes,
        &Scope {
            root: data,
            dot: data,
        },
        &mut out,
    )?;
    Ok(out)
}

// ---- lexing: text and actions, with trim markers applied ----

enum Item {
    Text(String),
    /// The words of an action (comments are dropped at lexing).
    Action(Vec<Tok>),
}

fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n')
}

fn lex(src: &str) -> Result<Vec<Item>, String> {
    let mut items = Vec::new();
    let mut rest = src;
    let mut trim_next = false;
    loop {
        let Some(open) = rest.find("{{") else {
            push_text(&mut items, rest, trim_next, false);
            break;
        };
        let after = &rest[open + 2..];
        // "{{- " trims; "{{-3}}" is the number -3.
        let trim_left = after.starts_with('-') && after[1..].starts_with(is_space);
        push_text(&mut items, &rest[..open], trim_next, trim_left);
        let body_start = if trim_left { &after[2..] } else { after };
        let (body, close_len) = action_body(body_start)?;
        let mut inner = body;
        let trim_right = inner.ends_with('-') && inner[..inner.len() - 1].ends_with(is_space);
        if trim_right {
            inner = &inner[..inner.len() - 1];
        }
        let trimmed = inner.trim_matches(is_space);
        if let Some(comment) = trimmed.strip_prefix("/*") {
            if !comment.ends_with("*/") {
                return Err(format!("unclosed comment: {{{{{body}}}}}"));
            }
        } else {
            items.push(Item::Action(tokenize(inner)?));
        }
        trim_next = trim_right;
        rest = &body_start[close_len..];
    }
    Ok(items)
}

fn push_text(items: &mut Vec<Item>, text: &str, trim_start: bool, trim_end: bool) {
    let mut t = text;
    if trim_start {
        t = t.trim_start_matches(is_space);
    }
    if trim_end {
        t = t.trim_end_matches(is_space);
    }
    if !t.is_empty() {
        items.push(Item::Text(t.to_string()));
    }
}

/// The text of an action up to its closing "}}" (not one inside a string), and the length
/// consumed including the "}}".
fn action_body(s: &str) -> Result<(&str, usize), String> {
    let bytes = s.as_bytes();
    let mut i = 0;
    let mut quote: Option<u8> = None;
    while i < bytes.len() {
        let c = bytes[i];
        match quote {
            Some(q) => {
                if c == b'\\' && q == b'"' {
                    i += 1;
                } else if c == q {
                    quote = None;
                }
            }
            None => {
                if c == b'"' || c == b'`' {
                    quote = Some(c);
                } else if s[i..].starts_with("}}") {
                    return Ok((&s[..i], i + 2));
                }
            }
        }
        i += 1;
    }
    Err(format!(
        "unclosed action: {{{{{}",
        s.lines().next().unwrap_or("")
    ))
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    /// `.a.b` (empty: `.`).
    Dot(Vec<String>),
    /// `$.a.b` (empty: `$`).
    Root(Vec<String>),
    Str(String),
    Num(i64),
    Ident(String),
    Pipe,
    Open,
    Close,
}

fn tokenize(s: &str) -> Result<Vec<Tok>, String> {
    let chars: Vec<char> = s.chars().collect();
    let mut toks = Vec::new();
    let mut i = 0;
    let ident_char = |c: char| c.is_alphanumeric() || c == '_';
    let path = |i: &mut usize| -> Vec<String> {
        let mut parts = Vec::new();
        while *i < chars.len() && chars[*i] == '.' {
            *i += 1;
            let start = *i;
            while *i < chars.len() && ident_char(chars[*i]) {
                *i += 1;
            }
            if *i > start {
                parts.push(chars[start..*i].iter().collect());
            }
        }
        parts
    };
    while i < chars.len() {
        let c = chars[i];
        match c {
            _ if is_space(c) => i += 1,
            '|' => {
                toks.push(Tok::Pipe);
                i += 1;
            }
            '(' => {
                toks.push(Tok::Open);
                i += 1;
            }
            ')' => {
                toks.push(Tok::Close);
                i += 1;
            }
            '.' => toks.push(Tok::Dot(path(&mut i))),
            '$' => {
                i += 1;
                if i < chars.len() && ident_char(chars[i]) {
                    return Err(format!("variables other than $ are not supported: {s}"));
                }
                toks.push(Tok::Root(path(&mut i)));
            }
            '"' => {
                let mut out = String::new();
                i += 1;
                loop {
                    let Some(&c) = chars.get(i) else {
                        return Err(format!("unterminated string: {s}"));
                    };
                    i += 1;
                    match c {
                        '"' => break,
                        '\\' => {
                            let e = chars.get(i).copied().unwrap_or(' ');
                            i += 1;
                            out.push(match e {
                                'n' => '\n',
                                't' => '\t',
                                'r' => '\r',
                                '"' | '\\' => e,
                                _ => return Err(format!("unsupported escape \\{e}: {s}")),
                            });
                        }
                        _ => out.push(c),
                    }
                }
                toks.push(Tok::Str(out));
            }
            '`' => {
                let start = i + 1;
                let Some(len) = chars[start..].iter().position(|&c| c == '`') else {
                    return Err(format!("unterminated raw string: {s}"));
                };
                toks.push(Tok::Str(chars[start..start + len].iter().collect()));
                i = start + len + 1;
            }
            _ if c.is_ascii_digit()
                || (c == '-' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) =>
            {
                let start = i;
                i += 1;
                while i < chars.len() && chars[i].is_ascii_digit() {
                    i += 1;
                }
                let text: String = chars[start..i].iter().collect();
                if (i < chars.len() && ident_char(chars[i])) || chars.get(i) == Some(&'.') {
                    return Err(format!("only decimal integers are supported: {s}"));
                }
                toks.push(Tok::Num(text.parse().map_err(|e| format!("{text}: {e}"))?));
            }
            _ if ident_char(c) => {
                let start = i;
                while i < chars.len() && ident_char(chars[i]) {
                    i += 1;
                }
                toks.push(Tok::Ident(chars[start..i].iter().collect()));
            }
            _ => return Err(format!("unexpected {c:?} in action: {s}")),
        }
    }
    Ok(toks)
}

// ---- parsing ----

#[derive(Debug)]
enum Arg {
    Field { from_root: bool, path: Vec<String> },
    Lit(Value),
    Func(String),
    Paren(Pipeline),
}

type Command = Vec<Arg>;
type Pipeline = Vec<Command>;

#[derive(Debug)]
enum Node {
    Text(String),
    Print(Pipeline),
    /// `if`: every (condition, body) branch, then the else body.
    If(Vec<(Pipeline, Vec<Node>)>, Vec<Node>),
    With(Pipeline, Vec<Node>, Vec<Node>),
    Range(Pipeline, Vec<Node>, Vec<Node>),
}

/// What ended a list of nodes: `end`, `else`, or `else if ...`.
#[derive(Debug)]
enum Stop {
    End,
    Else,
    ElseIf(Pipeline),
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stop::End => f.write_str("end"),
            Stop::Else | Stop::ElseIf(_) => f.write_str("else"),
        }
    }
}

fn parse_list(items: &[Item], pos: &mut usize) -> Result<(Vec<Node>, Option<Stop>), String> {
    let mut nodes = Vec::new();
    while *pos < items.len() {
        let item = &items[*pos];
        *pos += 1;
        let toks = match item {
            Item::Text(t) => {
                nodes.push(Node::Text(t.clone()));
                continue;
            }
            Item::Action(toks) => toks,
        };
        let keyword = match toks.first() {
            Some(Tok::Ident(k)) => k.as_str(),
            _ => "",
        };
        match keyword {
            "end" if toks.len() == 1 => return Ok((nodes, Some(Stop::End))),
            "else" if toks.len() == 1 => return Ok((nodes, Some(Stop::Else))),
            "else" if toks.get(1) == Some(&Tok::Ident("if".into())) => {
                return Ok((nodes, Some(Stop::ElseIf(parse_pipeline(&toks[2..])?))));
            }
            "if" => {
                let mut branches = Vec::new();
                let mut cond = parse_pipeline(&toks[1..])?;
                let otherwise = loop {
                    let (body, stop) = parse_list(items, pos)?;
                    branches.push((cond, body));
                    match stop {
                        Some(Stop::End) => break Vec::new(),
                        Some(Stop::ElseIf(next)) => cond = next,
                        Some(Stop::Else) => break parse_end(items, pos)?,
                        None => return Err("if without end".into()),
                    }
                };
                nodes.push(Node::If(branches, otherwise));
            }
            "with" | "range" => {
                let pipe = parse_pipeline(&toks[1..])?;
                let (body, stop) = parse_list(items, pos)?;
                let otherwise = match stop {
                    Some(Stop::End) => Vec::new(),
                    Some(Stop::Else) => parse_end(items, pos)?,
                    _ => return Err(format!("{keyword} without end")),
                };
                nodes.push(if keyword == "with" {
                    Node::With(pipe, body, otherwise)
                } else {
                    Node::Range(pipe, body, otherwise)
                });
            }
            "define" | "template" | "block" | "break" | "continue" | "else" | "end" => {
                return Err(format!("unsupported action: {keyword} {toks:?}"));
            }
            _ => nodes.push(Node::Print(parse_pipeline(toks)?)),
        }
    }
    Ok((nodes, None))
}

/// The body of an `else`, which must close with `end`.
fn parse_end(items: &[Item], pos: &mut usize) -> Result<Vec<Node>, String> {
    match parse_list(items, pos)? {
        (body, Some(Stop::End)) => Ok(body),
        (_, stop) => Err(format!("else closed by {stop:?}, not end")),
    }
}

fn parse_pipeline(toks: &[Tok]) -> Result<Pipeline, String> {
    if toks.is_empty() {
        return Err("missing value".into());
    }
    let mut pipeline = Vec::new();
    let mut command = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            Tok::Pipe => {
                if command.is_empty() {
                    return Err(format!("empty command in {toks:?}"));
                }
                pipeline.push(std::mem::take(&mut command));
            }
            Tok::Open => {
                let mut depth = 1;
                let start = i + 1;
                while depth > 0 {
                    i += 1;
                    match toks.get(i) {
                        Some(Tok::Open) => depth += 1,
                        Some(Tok::Close) => depth -= 1,
                        Some(_) => {}
                        None => return Err(format!("unclosed ( in {toks:?}")),
                    }
                }
                command.push(Arg::Paren(parse_pipeline(&toks[start..i])?));
            }
            Tok::Close => return Err(format!("unexpected ) in {toks:?}")),
            Tok::Dot(path) => command.push(Arg::Field {
                from_root: false,
                path: path.clone(),
            }),
            Tok::Root(path) => command.push(Arg::Field {
                from_root: true,
                path: path.clone(),
            }),
            Tok::Str(s) => command.push(Arg::Lit(Value::String(s.clone()))),
            Tok::Num(n) => command.push(Arg::Lit(json!(n))),
            Tok::Ident(id) => command.push(match id.as_str() {
                "true" => Arg::Lit(Value::Bool(true)),
                "false" => Arg::Lit(Value::Bool(false)),
                "nil" => Arg::Lit(Value::Null),
                _ => Arg::Func(id.clone()),
            }),
        }
        i += 1;
    }
    if command.is_empty() {
        return Err(format!("empty command in {toks:?}"));
    }
    pipeline.push(command);
    Ok(pipeline)
}

// ---- execution ----

struct Scope<'a> {
    root: &'a Value,
    dot: &'a Value,
}

fn exec(nodes: &[Node], scope: &Scope<'_>, out: &mut String) -> Result<(), String> {
    for node in nodes {
        match node {
            Node::Text(t) => out.push_str(t),
            Node::Print(p) => out.push_str(&print(&eval_pipeline(p, scope)?)?),
            Node::If(branches, otherwise) => {
                let mut taken = false;
                for (cond, body) in branches {
                    if truth(&eval_pipeline(cond, scope)?) {
                        exec(body, scope, out)?;
                        taken = true;
                        break;
                    }
                }
                if !taken {
                    exec(otherwise, scope, out)?;
                }
            }
            Node::With(p, body, otherwise) => {
                let v = eval_pipeline(p, scope)?;
                if truth(&v) {
                    exec(
                        body,
                        &Scope {
                            root: scope.root,
                            dot: &v,
                        },
                        out,
                    )?;
                } else {
                    exec(otherwise, scope, out)?;
                }
            }
            Node::Range(p, body, otherwise) => {
                let v = eval_pipeline(p, scope)?;
                let elems: Vec<Value> = match &v {
                    Value::Array(a) => a.clone(),
                    // serde_json's map is ordered by key unless preserve_order is on somewhere
                    // in the build; Go ranges over a map in key order.
                    Value::Object(m) => {
                        let mut keys: Vec<&String> = m.keys().collect();
                        keys.sort();
                        keys.into_iter().map(|k| m[k].clone()).collect()
                    }
                    Value::Null => Vec::new(),
                    other => return Err(format!("range over {other}")),
                };
                if elems.is_empty() {
                    exec(otherwise, scope, out)?;
                }
                for e in &elems {
                    exec(
                        body,
                        &Scope {
                            root: scope.root,
                            dot: e,
                        },
                        out,
                    )?;
                }
            }
        }
    }
    Ok(())
}

fn eval_pipeline(p: &Pipeline, scope: &Scope<'_>) -> Result<Value, String> {
    let mut piped: Option<Value> = None;
    for command in p {
        piped = Some(eval_command(command, piped, scope)?);
    }
    Ok(piped.unwrap_or(Value::Null))
}

fn eval_command(c: &Command, piped: Option<Value>, scope: &Scope<'_>) -> Result<Value, String> {
    match c.as_slice() {
        [Arg::Func(name), args @ ..] => {
            let mut values = args
                .iter()
                .map(|a| eval_arg(a, scope))
                .collect::<Result<Vec<_>, _>>()?;
            values.extend(piped);
            call(name, values)
        }
        [single] if piped.is_none() => eval_arg(single, scope),
        _ => Err(format!("not a function call: {c:?}")),
    }
}

fn eval_arg(a: &Arg, scope: &Scope<'_>) -> Result<Value, String> {
    match a {
        Arg::Field { from_root, path } => {
            let mut v = if *from_root { scope.root } else { scope.dot };
            for (i, key) in path.iter().enumerate() {
                v = v.get(key).ok_or_else(|| {
                    let at = if *from_root { "$" } else { "" };
                    format!("no field {at}.{} in the data", path[..=i].join("."))
                })?;
            }
            Ok(v.clone())
        }
        Arg::Lit(v) => Ok(v.clone()),
        Arg::Func(name) => call(name, Vec::new()),
        Arg::Paren(p) => eval_pipeline(p, scope),
    }
}

/// Go's truth: false, 0, "", nil and empty collections are false.
fn truth(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// How `{{ x }}` prints x: Go's %v for scalars, nothing for nil (Helm's "<no value>" removal).
fn print(v: &Value) -> Result<String, String> {
    Ok(match v {
        Value::Null => String::new(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        Value::Array(_) | Value::Object(_) => {
            return Err(format!("printing a list or map ({v}): use toYaml"));
        }
    })
}

fn call(name: &str, mut args: Vec<Value>) -> Result<Value, String> {
    let arity = |n: usize, args: &[Value]| {
        if args.len() == n {
            Ok(())
        } else {
            Err(format!("{name} takes {n} arguments, got {}", args.len()))
        }
    };
    let int = |v: &Value| {
        v.as_u64()
            .map(|n| n as usize)
            .ok_or_else(|| format!("{name}: not a count: {v}"))
    };
    Ok(match name {
        // Sprig: %q of each non-nil argument, joined by spaces.
        "quote" => Value::String(
            args.iter()
                .filter(|v| !v.is_null())
                .map(|v| print(v).map(|s| go_quote(&s)))
                .collect::<Result<Vec<_>, _>>()?
                .join(" "),
        ),
        "default" => {
            arity(2, &args)?;
            let given = args.pop().unwrap();
            let fallback = args.pop().unwrap();
            if truth(&given) { given } else { fallback }
        }
        // Sprig: whether the list (the last argument) holds the needle.
        "has" => {
            arity(2, &args)?;
            let list = args[1]
                .as_array()
                .ok_or_else(|| format!("has: not a list: {}", args[1]))?;
            Value::Bool(list.contains(&args[0]))
        }
        "empty" => {
            arity(1, &args)?;
            Value::Bool(!truth(&args[0]))
        }
        "not" => {
            arity(1, &args)?;
            Value::Bool(!truth(&args[0]))
        }
        // Go: the first false argument, or the last one.
        "and" | "or" => {
            if args.len() < 2 {
                return Err(format!("{name} takes at least 2 arguments"));
            }
            let stop_on = name == "or";
            let last = args.len() - 1;
            let i = args
                .iter()
                .position(|a| truth(a) == stop_on)
                .unwrap_or(last);
            args.swap_remove(i)
        }
        "eq" | "ne" => {
            arity(2, &args)?;
            let same = match (&args[0], &args[1]) {
                (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
                (Value::Array(_) | Value::Object(_), _)
                | (_, Value::Array(_) | Value::Object(_)) => {
                    return Err(format!("{name}: cannot compare lists or maps"));
                }
                (a, b) => a == b,
            };
            Value::Bool(same == (name == "eq"))
        }
        // Helm: YAML without the final newline.
        "toYaml" => {
            arity(1, &args)?;
            let text = serde_norway::to_string(&args[0]).map_err(|e| e.to_string())?;
            Value::String(text.trim_end_matches('\n').to_string())
        }
        "indent" | "nindent" => {
            arity(2, &args)?;
            let pad = " ".repeat(int(&args[0])?);
            let text = print(&args[1])?;
            let indented = format!("{pad}{}", text.replace('\n', &format!("\n{pad}")));
            Value::String(if name == "nindent" {
                format!("\n{indented}")
            } else {
                indented
            })
        }
        _ => return Err(format!("unsupported function {name}")),
    })
}

/// Go's strconv.Quote for the characters YAML and Go escape alike.
fn go_quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The leaves of a values tree as dotted paths: scalars, lists and empty maps.
pub fn leaf_paths(v: &Value) -> Vec<String> {
    fn walk(v: &Value, prefix: &str, out: &mut Vec<String>) {
        match v {
            Value::Object(m) if !m.is_empty() => {
                for (k, child) in m {
                    let p = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(child, &p, out);
                }
            }
            _ => out.push(prefix.to_string()),
        }
    }
    let mut out = Vec::new();
    walk(v, "", &mut out);
    out
}

/// An empty JSON object, for renders with the chart's values only.
pub fn no_overrides() -> Value {
    Value::Object(Map::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(t: &str, data: Value) -> String {
        render(t, &data).unwrap()
    }

    #[test]
    fn trims_like_go() {
        // Go's documentation: "{{23 -}} < {{- 45}}" gives "23<45".
        assert_eq!(r("{{23 -}} < {{- 45}}", json!({})), "23<45");
        // "{{-3}}" is the number -3, not a trim marker.
        assert_eq!(r("a {{-3}} b", json!({})), "a -3 b");
        assert_eq!(r("a\n  {{- /* c */}}\nb", json!({})), "a\nb");
        assert_eq!(
            r("a\n{{- if .x }}\n  x\n{{- end }}\nb", json!({"x": true})),
            "a\n  x\nb"
        );
        assert_eq!(
            r("a\n{{- if .x }}\n  x\n{{- end }}\nb", json!({"x": 0})),
            "a\nb"
        );
    }

    #[test]
    fn control_and_functions() {
        let data = json!({"l": ["a", "b"], "m": {"k": 1}, "e": "", "n": 9808});
        assert_eq!(
            r("{{ range .l }}[{{ . }}]{{ end }}", data.clone()),
            "[a][b]"
        );
        assert_eq!(
            r("{{ range .e }}x{{ else }}none{{ end }}", json!({"e": []})),
            "none"
        );
        assert_eq!(
            r("{{ with .m }}{{ .k }}{{ $.n }}{{ end }}", data.clone()),
            "19808"
        );
        assert_eq!(r("{{ .e | default \"d\" }}", data.clone()), "d");
        assert_eq!(r("{{ .n | quote }}", data.clone()), "\"9808\"");
        assert_eq!(
            r(
                "{{ if and .n .e }}y{{ else if .n }}n{{ end }}",
                data.clone()
            ),
            "n"
        );
        assert_eq!(
            r(
                "{{ if not (eq .n 9808) }}y{{ else }}n{{ end }}",
                data.clone()
            ),
            "n"
        );
        assert_eq!(
            r("x:{{ toYaml .m | nindent 2 }}", data.clone()),
            "x:\n  k: 1"
        );
        assert!(render("{{ .missing }}", &data).is_err());
        assert!(render("{{ .m }}", &data).is_err());
        assert!(render("{{ include \"x\" . }}", &data).is_err());
        assert!(render("{{ if .n }}", &data).is_err());
    }
}
