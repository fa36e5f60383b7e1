//! Compiled templates kept by their source text, so a republish that is due (every refresh of
//! every mounted volume) evaluates the ExternalSecret's templates without parsing, checking and
//! instrumenting them again. Bounded by count; the least recently used program goes first.
//!
//! A program holds no state of an evaluation (values, pod and budget come in through the CEL
//! context), so one compiled program serves every publish. Compile errors are not kept: a
//! broken template fails its publish, which is rare and already cheap to repeat.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use super::{Program, compile};

/// Most programs kept. A source is at most `MAX_EXPRESSION_BYTES` (4 KiB), so the cache holds
/// a few MiB at worst; a cluster's templates are far fewer than this.
const MAX_PROGRAMS: usize = 512;

/// Programs by source, with the tick of their last use.
#[derive(Default)]
struct Programs {
    by_source: HashMap<String, (Arc<Program>, u64)>,
    tick: u64,
}

static PROGRAMS: LazyLock<Mutex<Programs>> = LazyLock::new(Mutex::default);

fn programs() -> std::sync::MutexGuard<'static, Programs> {
    // Every critical section is one map operation: a poisoned lock still holds a whole map.
    PROGRAMS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The compiled program for `source`: kept from an earlier publish, or compiled now (outside
/// the lock, so one slow compile never holds up other templates).
pub(super) fn get(source: &str) -> Result<Arc<Program>, String> {
    {
        let mut cache = programs();
        cache.tick += 1;
        let tick = cache.tick;
        if let Some((program, used)) = cache.by_source.get_mut(source) {
            *used = tick;
            return Ok(Arc::clone(program));
        }
    }
    let program = Arc::new(compile(source)?);
    let mut cache = programs();
    if cache.by_source.len() >= MAX_PROGRAMS
        && let Some(oldest) = cache
            .by_source
            .iter()
            .min_by_key(|(_, (_, used))| *used)
            .map(|(source, _)| source.clone())
    {
        cache.by_source.remove(&oldest);
    }
    let tick = cache.tick;
    cache
        .by_source
        .insert(source.to_owned(), (Arc::clone(&program), tick));
    Ok(program)
}

/// How many programs are kept (tests).
#[cfg(test)]
pub(super) fn len() -> usize {
    programs().by_source.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_is_compiled_once_and_the_cache_is_bounded() {
        let source = "'programs-test-' + string(1)";
        let first = get(source).unwrap();
        let again = get(source).unwrap();
        assert!(
            Arc::ptr_eq(&first, &again),
            "the second get reuses the program"
        );
        for i in 0..MAX_PROGRAMS + 5 {
            get(&format!("'programs-bound-{i}'")).unwrap();
        }
        assert!(len() <= MAX_PROGRAMS, "{}", len());
        assert!(get("1 +").is_err());
        assert!(get("1 +").is_err(), "errors are reported every time");
    }
}
