//! Instrumentation of a parsed expression for the cost budget: `cel` has no cost tracking, so
//! every node that produces a value is wrapped in the hidden function [`CHARGE`], which measures
//! the value and spends its size, and `matches` calls are rewritten to the bounded [`MATCHES`].
//!
//! Not for measuring or spending (see `budget`), nor for binding the hidden functions at
//! evaluation (see `context`).

use cel::common::ast::{CallExpr, EntryExpr, Expr, IdedExpr, operators};

/// Hidden function the instrumentation wraps values in; `@` cannot appear in a CEL identifier, so
/// no expression can call or shadow it.
pub(super) const CHARGE: &str = "@charge";

/// Hidden function `matches` calls are rewritten to (see
/// [`CompiledPattern`](super::functions::CompiledPattern)).
pub(super) const MATCHES: &str = "@matches";

/// Function namespaces: a call on one of these names is a namespaced function, not a method.
const NAMESPACES: [&str; 2] = ["base64", "json"];

/// Where a node sits: most produce a value; an identifier or field selection that is the operand
/// of a field selection is part of a qualified name (`pod.name`) and must stay as written, and
/// one that is indexed (`secret['a.b']`) need not be measured (the result is).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Position {
    Value,
    NameOperand,
}

fn charge(e: IdedExpr) -> IdedExpr {
    IdedExpr {
        id: e.id,
        expr: Expr::Call(CallExpr {
            func_name: CHARGE.to_owned(),
            target: None,
            args: vec![e],
        }),
    }
}

fn is_accu(e: &IdedExpr, accus: &[String]) -> bool {
    matches!(&e.expr, Expr::Ident(n) if accus.contains(n))
}

/// Wraps every value-producing node in [`CHARGE`], except the parts of qualified names, the
/// targets of namespaced functions and the accumulator plumbing of comprehensions (whose shapes
/// the interpreter recognises to build results in place).
pub(super) fn instrument(e: IdedExpr, pos: Position, accus: &[String]) -> IdedExpr {
    let id = e.id;
    let expr = match e.expr {
        Expr::Ident(n) => {
            let keep = pos == Position::NameOperand || accus.contains(&n);
            let e = IdedExpr {
                id,
                expr: Expr::Ident(n),
            };
            return if keep { e } else { charge(e) };
        }
        Expr::Select(mut s) => {
            s.operand = Box::new(instrument(*s.operand, Position::NameOperand, accus));
            let e = IdedExpr {
                id,
                expr: Expr::Select(s),
            };
            return if pos == Position::NameOperand {
                e
            } else {
                charge(e)
            };
        }
        Expr::Call(mut c) => {
            // `s.matches(p)` and `matches(s, p)` call the bounded `matches`.
            if c.func_name == "matches" && c.args.len() + usize::from(c.target.is_some()) == 2 {
                if let Some(target) = c.target.take() {
                    c.args.insert(0, *target);
                }
                c.func_name = MATCHES.to_owned();
            }
            c.target = c.target.map(|t| {
                let namespace =
                    matches!(&t.expr, Expr::Ident(n) if NAMESPACES.contains(&n.as_str()));
                if namespace {
                    t
                } else {
                    Box::new(instrument(*t, Position::Value, accus))
                }
            });
            // Indexing is a constant-time lookup: `secret['tls.crt']` need not measure `secret`.
            let index = c.func_name == operators::INDEX && c.target.is_none();
            c.args = c
                .args
                .into_iter()
                .enumerate()
                .map(|(i, a)| {
                    let pos = if index && i == 0 {
                        Position::NameOperand
                    } else {
                        Position::Value
                    };
                    instrument(a, pos, accus)
                })
                .collect();
            Expr::Call(c)
        }
        Expr::List(mut l) => {
            l.elements = l
                .elements
                .into_iter()
                .map(|e| instrument(e, Position::Value, accus))
                .collect();
            Expr::List(l)
        }
        Expr::Map(mut m) => {
            for entry in &mut m.entries {
                instrument_entry(&mut entry.expr, accus);
            }
            Expr::Map(m)
        }
        Expr::Struct(mut s) => {
            for entry in &mut s.entries {
                instrument_entry(&mut entry.expr, accus);
            }
            Expr::Struct(s)
        }
        Expr::Comprehension(mut c) => {
            c.iter_range = instrument(std::mem::take(&mut c.iter_range), Position::Value, accus);
            let mut inner = accus.to_vec();
            inner.push(c.accu_var.clone());
            c.loop_step = instrument_step(std::mem::take(&mut c.loop_step), &inner);
            // accu_init, loop_cond and result only involve the accumulator and constants.
            Expr::Comprehension(c)
        }
        other @ (Expr::Literal(_) | Expr::Unspecified) => other,
    };
    charge(IdedExpr { id, expr })
}

fn instrument_entry(entry: &mut EntryExpr, accus: &[String]) {
    match entry {
        EntryExpr::MapEntry(m) => {
            m.key = instrument(std::mem::take(&mut m.key), Position::Value, accus);
            m.value = instrument(std::mem::take(&mut m.value), Position::Value, accus);
        }
        EntryExpr::StructField(f) => {
            f.value = instrument(std::mem::take(&mut f.value), Position::Value, accus);
        }
    }
}

/// A comprehension's loop step: `@result + [x]` (map, filter), `c ? @result + [x] : @result`,
/// `@result && p` / `@result || p` (all, exists), `p ? @result + 1 : @result` (exists_one). The
/// plumbing stays as it is; what the user wrote (`x`, `c`, `p`) is instrumented.
fn instrument_step(e: IdedExpr, accus: &[String]) -> IdedExpr {
    let IdedExpr { id, expr } = e;
    match expr {
        Expr::Call(mut c) if c.target.is_none() => {
            let name = c.func_name.as_str();
            let on_accu = c.args.first().is_some_and(|a| is_accu(a, accus));
            if name == operators::CONDITIONAL && c.args.len() == 3 {
                let mut args = std::mem::take(&mut c.args).into_iter();
                let cond = args.next().unwrap_or_default();
                c.args = std::iter::once(instrument(cond, Position::Value, accus))
                    .chain(args.map(|a| instrument_step(a, accus)))
                    .collect();
            } else if on_accu && c.args.len() == 2 && name == operators::ADD {
                let rhs = c.args.pop().unwrap_or_default();
                c.args.push(match rhs.expr {
                    Expr::List(mut l) => {
                        l.elements = l
                            .elements
                            .into_iter()
                            .map(|e| instrument(e, Position::Value, accus))
                            .collect();
                        IdedExpr {
                            id: rhs.id,
                            expr: Expr::List(l),
                        }
                    }
                    other => instrument(
                        IdedExpr {
                            id: rhs.id,
                            expr: other,
                        },
                        Position::Value,
                        accus,
                    ),
                });
            } else if on_accu
                && c.args.len() == 2
                && (name == operators::LOGICAL_AND || name == operators::LOGICAL_OR)
            {
                let rhs = c.args.pop().unwrap_or_default();
                c.args.push(instrument(rhs, Position::Value, accus));
            } else {
                return instrument(
                    IdedExpr {
                        id,
                        expr: Expr::Call(c),
                    },
                    Position::Value,
                    accus,
                );
            }
            IdedExpr {
                id,
                expr: Expr::Call(c),
            }
        }
        Expr::Ident(n) if accus.contains(&n) => IdedExpr {
            id,
            expr: Expr::Ident(n),
        },
        other => instrument(IdedExpr { id, expr: other }, Position::Value, accus),
    }
}
