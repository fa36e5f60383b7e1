//! The static bounds of an expression: its length and lexical nesting, checked before parsing
//! (so that no input can exhaust the parser's stack), and the depth and comprehension nesting of
//! its syntax tree, checked after parsing (which also collects the names error messages may
//! repeat).
//!
//! Not for bounds while evaluating (see `budget`), nor for turning parse errors into messages
//! (see `errors`).

use std::collections::HashSet;

use cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue};

use super::{MAX_AST_DEPTH, MAX_COMPREHENSION_NESTING, MAX_EXPRESSION_BYTES, MAX_NESTING};

/// Checks the bounds that apply before parsing: [`MAX_EXPRESSION_BYTES`] and [`MAX_NESTING`].
pub(super) fn check_source(source: &str) -> Result<(), String> {
    if source.len() > MAX_EXPRESSION_BYTES {
        return Err(format!(
            "the expression is {} bytes long, more than the limit of {MAX_EXPRESSION_BYTES}",
            source.len()
        ));
    }
    if nesting(source) > MAX_NESTING {
        return Err(format!(
            "the expression nests brackets and conditionals more than {MAX_NESTING} deep"
        ));
    }
    Ok(())
}

/// The lexical nesting of `source`: open brackets, plus conditionals (`?`) within the innermost
/// one. String literals (quoted, triple-quoted, raw) and comments are skipped.
pub(super) fn nesting(source: &str) -> usize {
    let b = source.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    // Conditionals seen in each open bracket (the first entry: outside any).
    let mut levels: Vec<usize> = vec![0];
    let mut depth = 0usize;
    let mut max = 0usize;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            q @ (b'"' | b'\'') => {
                // Raw when prefixed by `r`/`R` (optionally after `b`/`B`) starting a token.
                let raw = i >= 1 && matches!(b[i - 1], b'r' | b'R') && {
                    let mut start = i - 1;
                    if start >= 1 && matches!(b[start - 1], b'b' | b'B') {
                        start -= 1;
                    }
                    start == 0 || !ident(b[start - 1])
                };
                let triple = b.get(i + 1) == Some(&q) && b.get(i + 2) == Some(&q);
                i += if triple { 3 } else { 1 };
                while i < b.len() {
                    if b[i] == b'\\' && !raw {
                        i += 2;
                        continue;
                    }
                    if triple {
                        if b[i] == q && b.get(i + 1) == Some(&q) && b.get(i + 2) == Some(&q) {
                            i += 2;
                            break;
                        }
                    } else if b[i] == q || b[i] == b'\n' {
                        break;
                    }
                    i += 1;
                }
            }
            b'(' | b'[' | b'{' => {
                levels.push(0);
                depth += 1;
            }
            b')' | b']' | b'}' if levels.len() > 1 => {
                depth -= 1 + levels.pop().unwrap_or_default();
            }
            b'?' => {
                if let Some(level) = levels.last_mut() {
                    *level += 1;
                }
                depth += 1;
            }
            _ => {}
        }
        max = max.max(depth);
        if max > MAX_NESTING {
            return max;
        }
        i += 1;
    }
    max
}

/// The children of a node.
fn children(e: &IdedExpr) -> Vec<&IdedExpr> {
    match &e.expr {
        Expr::Call(c) => c.target.as_deref().into_iter().chain(&c.args).collect(),
        Expr::Comprehension(c) => vec![
            &c.iter_range,
            &c.accu_init,
            &c.loop_cond,
            &c.loop_step,
            &c.result,
        ],
        Expr::List(l) => l.elements.iter().collect(),
        Expr::Map(m) => m
            .entries
            .iter()
            .flat_map(|e| entry_children(&e.expr))
            .collect(),
        Expr::Struct(s) => s
            .entries
            .iter()
            .flat_map(|e| entry_children(&e.expr))
            .collect(),
        Expr::Select(s) => vec![&s.operand],
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => vec![],
    }
}

fn entry_children(e: &EntryExpr) -> Vec<&IdedExpr> {
    match e {
        EntryExpr::MapEntry(m) => vec![&m.key, &m.value],
        EntryExpr::StructField(f) => vec![&f.value],
    }
}

/// Checks the tree's depth and comprehension nesting (without recursion: the tree is not yet
/// known to be shallow) and collects its names.
pub(super) fn check_tree(root: &IdedExpr) -> Result<HashSet<String>, String> {
    let mut names = HashSet::new();
    let mut stack = vec![(root, 1usize, 0usize)];
    while let Some((e, depth, comprehensions)) = stack.pop() {
        if depth > MAX_AST_DEPTH {
            return Err(format!(
                "the expression is nested more than {MAX_AST_DEPTH} deep (long operator chains \
                 count too)"
            ));
        }
        let mut comprehensions = comprehensions;
        match &e.expr {
            Expr::Ident(n) => {
                names.insert(n.clone());
            }
            Expr::Select(s) => {
                names.insert(s.field.clone());
            }
            Expr::Call(c) => {
                names.insert(c.func_name.clone());
                if let Some(Expr::Ident(ns)) = c.target.as_deref().map(|t| &t.expr) {
                    names.insert(format!("{ns}.{}", c.func_name));
                }
            }
            Expr::Literal(LiteralValue::String(s)) => {
                names.insert(s.inner().to_owned());
            }
            Expr::Comprehension(c) => {
                comprehensions += 1;
                if comprehensions > MAX_COMPREHENSION_NESTING {
                    return Err(format!(
                        "comprehensions (map, filter, all, exists, exists_one) are nested more \
                         than {MAX_COMPREHENSION_NESTING} deep"
                    ));
                }
                names.insert(c.iter_var.clone());
            }
            _ => {}
        }
        stack.extend(
            children(e)
                .into_iter()
                .map(|c| (c, depth + 1, comprehensions)),
        );
    }
    Ok(names)
}
