use proptest::prelude::*;

use super::*;

fn spec(length: u32, digits: Option<u32>, symbols: Option<u32>) -> PasswordSpec {
    PasswordSpec {
        length,
        digits,
        symbols,
        ..Default::default()
    }
}

fn count(p: &str, set: &str) -> usize {
    p.chars().filter(|c| set.contains(*c)).count()
}

#[test]
fn defaults_are_esos() {
    let p = Password::new(&PasswordSpec {
        length: 24,
        ..Default::default()
    })
    .unwrap();
    let pw = p.make().unwrap();
    assert_eq!(pw.chars().count(), 24);
    assert_eq!(count(&pw, DIGITS), 6, "a quarter of the length");
    assert_eq!(count(&pw, DEFAULT_SYMBOLS), 6);
    assert_eq!(count(&pw, LOWER) + count(&pw, UPPER), 12);
    let odd = Password::new(&spec(7, None, None)).unwrap().make().unwrap();
    assert_eq!(count(&odd, DIGITS), 1, "rounded down");
    assert_eq!(count(&odd, DEFAULT_SYMBOLS), 1);
}

#[test]
fn no_repeat_refuses_an_alphabet_too_small() {
    let err = Password::new(&spec(40, Some(11), Some(0))).unwrap_err();
    assert!(err.to_string().contains("11 distinct digits"), "{err}");
    let err = Password::new(&PasswordSpec {
        length: 30,
        digits: Some(0),
        symbols: Some(0),
        no_upper: true,
        ..Default::default()
    })
    .unwrap_err();
    assert!(err.to_string().contains("distinct letters"), "{err}");
    assert!(err.to_string().contains("allowRepeat"), "{err}");
    // With repeats allowed the same request is fine.
    let p = Password::new(&PasswordSpec {
        length: 30,
        digits: Some(20),
        symbols: Some(0),
        no_upper: true,
        allow_repeat: true,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(count(&p.make().unwrap(), DIGITS), 20);
}

#[test]
fn bad_specs_are_refused() {
    for bad in [
        spec(0, None, None),
        spec(MAX_PASSWORD_LENGTH + 1, None, None),
        spec(10, Some(6), Some(5)),
        spec(10, Some(u32::MAX), Some(u32::MAX)),
    ] {
        assert!(
            matches!(Password::new(&bad), Err(GeneratorError::Invalid(_))),
            "{bad:?}"
        );
    }
    let only_letters = PasswordSpec {
        length: 8,
        symbols: Some(2),
        symbol_characters: Some("ab".into()),
        ..Default::default()
    };
    let err = Password::new(&only_letters).unwrap_err();
    assert!(err.to_string().contains("symbol"), "{err}");
}

#[test]
fn symbol_characters_are_used_and_deduplicated() {
    let p = Password::new(&PasswordSpec {
        length: 64,
        digits: Some(0),
        symbols: Some(32),
        symbol_characters: Some("**--".into()),
        allow_repeat: true,
        ..Default::default()
    })
    .unwrap();
    let pw = p.make().unwrap();
    assert_eq!(count(&pw, "*-"), 32);
    assert_eq!(p.symbol_chars, vec!['*', '-']);
}

#[test]
fn draws_are_unbiased_enough() {
    // 26 letters, 26,000 draws of one position: every letter within 5 sigma of 1,000.
    let mut d = Draws::new();
    let mut seen = [0u32; 26];
    for _ in 0..26_000 {
        seen[d.below(26).unwrap()] += 1;
    }
    for (i, n) in seen.iter().enumerate() {
        assert!((840..1160).contains(n), "letter {i} drawn {n} times");
    }
}

#[test]
fn two_passwords_differ() {
    let p = Password::new(&spec(24, None, None)).unwrap();
    assert_ne!(*p.make().unwrap(), *p.make().unwrap());
}

#[tokio::test]
async fn generate_returns_only_a_password_and_debug_hides_it() {
    let g = Password::new(&spec(32, None, None)).unwrap();
    let out = g.generate().await.unwrap();
    assert_eq!(out.values.keys().collect::<Vec<_>>(), ["password"]);
    assert!(out.state.is_none() && out.lease.is_none());
    let pw = String::from_utf8(out.values["password"].expose().to_vec()).unwrap();
    let debug = format!("{out:?} {g:?}");
    assert!(!debug.contains(&pw), "{debug}");
    assert_eq!(g.renew(&serde_json::json!({})).await.unwrap(), None);
    g.cleanup(&serde_json::json!({})).await.unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn length_classes_and_repeats_hold(
        length in 1u32..=200,
        digit_share in 0u32..=100,
        symbol_share in 0u32..=100,
        no_upper in any::<bool>(),
        allow_repeat in any::<bool>(),
        symbols_given in proptest::option::of("[!-/:-@]{1,12}"),
    ) {
        let digits = length * digit_share / 200;
        let symbols = length * symbol_share / 200;
        let s = PasswordSpec {
            length,
            digits: Some(digits),
            symbols: Some(symbols),
            symbol_characters: symbols_given.clone(),
            no_upper,
            allow_repeat,
        };
        let Ok(p) = Password::new(&s) else {
            // Refused only when the classes cannot be filled without repeats.
            prop_assert!(!allow_repeat);
            return Ok(());
        };
        let pw = p.make().unwrap();
        let symbol_set = symbols_given.unwrap_or_else(|| DEFAULT_SYMBOLS.into());
        prop_assert_eq!(pw.chars().count(), length as usize);
        prop_assert_eq!(count(&pw, DIGITS), digits as usize);
        prop_assert_eq!(count(&pw, &symbol_set), symbols as usize);
        let letters = if no_upper { LOWER.to_string() } else { format!("{LOWER}{UPPER}") };
        prop_assert_eq!(count(&pw, &letters), (length - digits - symbols) as usize);
        if no_upper {
            prop_assert_eq!(count(&pw, UPPER), 0);
        }
        if !allow_repeat {
            let mut seen = std::collections::HashSet::new();
            prop_assert!(pw.chars().all(|c| seen.insert(c)), "repeat in a no-repeat password");
        }
    }
}
