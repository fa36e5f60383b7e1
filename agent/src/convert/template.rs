//! ESO's Go templates -> Latchkey's CEL, for the trivial cases only: literal text and
//! `{{ .key }}` / `{{ .key | toString }}` / `{{ index . "key" }}` references. Anything else
//! (functions, pipelines, conditionals, ranges) is left to the user.

/// CEL words that cannot follow `secret.`; such keys are written `secret['key']`.
const CEL_RESERVED: &[&str] = &[
    "true",
    "false",
    "null",
    "in",
    "as",
    "break",
    "const",
    "continue",
    "else",
    "for",
    "function",
    "if",
    "import",
    "let",
    "loop",
    "package",
    "namespace",
    "return",
    "var",
    "void",
    "while",
];

/// One piece of a template.
enum Part {
    Text(String),
    Key(String),
}

/// The CEL expression equivalent to the Go template `tpl`, or `None` when it is not trivial.
pub fn go_to_cel(tpl: &str) -> Option<String> {
    let mut parts = Vec::new();
    let mut rest = tpl;
    let mut trim_next = false;
    while let Some(start) = rest.find("{{") {
        let mut text = &rest[..start];
        if trim_next {
            text = text.trim_start();
        }
        let after = &rest[start + 2..];
        let end = after.find("}}")?;
        let mut action = &after[..end];
        if let Some(a) = action.strip_prefix('-') {
            text = text.trim_end();
            action = a;
        }
        trim_next = false;
        if let Some(a) = action.strip_suffix('-') {
            trim_next = true;
            action = a;
        }
        if !text.is_empty() {
            parts.push(Part::Text(text.to_string()));
        }
        parts.push(Part::Key(reference(action)?));
        rest = &after[end + 2..];
    }
    let tail = if trim_next { rest.trim_start() } else { rest };
    if tail.contains("}}") {
        return None;
    }
    if !tail.is_empty() {
        parts.push(Part::Text(tail.to_string()));
    }
    if parts.is_empty() {
        return Some("''".to_string());
    }
    if let [Part::Key(k)] = parts.as_slice() {
        return Some(secret_ref(k));
    }
    // Text and references: one format string, as the README writes templates.
    let mut format = String::new();
    let mut args = Vec::new();
    for p in &parts {
        match p {
            Part::Text(t) => format.push_str(&t.replace('%', "%%")),
            Part::Key(k) => {
                format.push_str("%s");
                args.push(secret_ref(k));
            }
        }
    }
    if args.is_empty() {
        return Some(cel_string(&format.replace("%%", "%")));
    }
    Some(format!(
        "{}.format([{}])",
        cel_string(&format),
        args.join(", ")
    ))
}

/// The key an action refers to: `.key`, `index . "key"`, optionally piped to `toString`.
fn reference(action: &str) -> Option<String> {
    let mut stages = action.split('|').map(str::trim);
    let head = stages.next()?;
    if !stages.all(|s| s == "toString") {
        return None;
    }
    if let Some(name) = head.strip_prefix('.') {
        let ok = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        return ok.then(|| name.to_string());
    }
    let words: Vec<&str> = head.split_whitespace().collect();
    match words.as_slice() {
        ["index", ".", key] => {
            let key = key.strip_prefix('"')?.strip_suffix('"')?;
            (!key.is_empty() && !key.contains(['"', '\\'])).then(|| key.to_string())
        }
        _ => None,
    }
}

/// `secret.key`, or `secret['key']` when the key is not a plain CEL identifier.
fn secret_ref(key: &str) -> String {
    let ident = key
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !CEL_RESERVED.contains(&key);
    if ident {
        format!("secret.{key}")
    } else {
        format!("secret[{}]", cel_string(key))
    }
}

/// A single-quoted CEL string literal.
fn cel_string(text: &str) -> String {
    let mut out = String::from("'");
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trivial_templates_become_cel() {
        assert_eq!(
            go_to_cel("{{ .password }}").as_deref(),
            Some("secret.password")
        );
        assert_eq!(
            go_to_cel("{{ .password | toString }}").as_deref(),
            Some("secret.password")
        );
        assert_eq!(
            go_to_cel(r#"{{ index . "db-pass" }}"#).as_deref(),
            Some("secret['db-pass']")
        );
        assert_eq!(
            go_to_cel("postgres://{{ .user }}:{{ .pass }}@db:5432/shop").as_deref(),
            Some("'postgres://%s:%s@db:5432/shop'.format([secret.user, secret.pass])")
        );
        assert_eq!(go_to_cel("  {{- .a -}}  \n").as_deref(), Some("secret.a"));
        assert_eq!(go_to_cel("it's 100%\n").as_deref(), Some(r"'it\'s 100%\n'"));
        assert_eq!(
            go_to_cel("{{ .n }}%").as_deref(),
            Some("'%s%%'.format([secret.n])")
        );
        assert_eq!(go_to_cel("{{ .in }}").as_deref(), Some("secret['in']"));
    }

    #[test]
    fn anything_else_is_left_alone() {
        for tpl in [
            "{{ .a | b64dec }}",
            "{{ if .a }}x{{ end }}",
            "{{ .a.b }}",
            "{{ range $k, $v := . }}{{ $k }}{{ end }}",
            "{{ .a ",
            "x }}",
            "{{ pkcs12cert .p12 }}",
        ] {
            assert_eq!(go_to_cel(tpl), None, "{tpl}");
        }
    }
}
