//! The cost budget shared by all templates of an ExternalSecret: [`Budget`] records what the
//! evaluation has spent and which bound stopped it, and [`measure`] sizes a value.
//!
//! Not for deciding where values are measured (see `instrument`), nor for turning a stop into a
//! message (the evaluation in `mod.rs` does that).

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use cel::ExecutionError;
use cel::common::types::{CelBytes, CelList, CelMap, CelString};
use cel::common::value::Val;

use super::instrument::CHARGE;
use super::{COST_BUDGET, ELEMENT_COST, MAX_VALUE_BYTES, MAX_VALUE_DEPTH};

/// Why evaluation was stopped by a bound.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub(super) enum Stop {
    None = 0,
    Budget = 1,
    TooLarge = 2,
    TooDeep = 3,
    /// The publish's wall-clock deadline passed (see `crate::compute`).
    Deadline = 4,
}

/// What all templates of an ExternalSecret may spend.
#[derive(Default)]
pub(super) struct Budget {
    spent: AtomicU64,
    stop: AtomicU8,
}

impl Budget {
    pub(super) fn stopped(&self) -> Stop {
        match self.stop.load(Ordering::Relaxed) {
            1 => Stop::Budget,
            2 => Stop::TooLarge,
            3 => Stop::TooDeep,
            4 => Stop::Deadline,
            _ => Stop::None,
        }
    }

    fn stop(&self, s: Stop) -> ExecutionError {
        self.stop.store(s as u8, Ordering::Relaxed);
        ExecutionError::function_error(CHARGE, "stopped")
    }

    /// Measures a value produced and spends its size.
    pub(super) fn charge(&self, v: &dyn Val) -> Result<(), ExecutionError> {
        if self.stopped() != Stop::None {
            return Err(ExecutionError::function_error(CHARGE, "stopped"));
        }
        let size = measure(v, 0).map_err(|s| self.stop(s))?;
        self.spend(size)
    }

    /// Spends `units` (at least one), before or after the work they stand for.
    pub(super) fn spend(&self, units: u64) -> Result<(), ExecutionError> {
        if crate::compute::deadline_passed() {
            return Err(self.stop(Stop::Deadline));
        }
        let units = units.max(1);
        let spent = self
            .spent
            .fetch_add(units, Ordering::Relaxed)
            .saturating_add(units);
        if spent > COST_BUDGET {
            return Err(self.stop(Stop::Budget));
        }
        Ok(())
    }
}

/// The measured size of a value (see [`ELEMENT_COST`]), failing beyond [`MAX_VALUE_BYTES`].
pub(super) fn measure(v: &dyn Val, depth: usize) -> Result<u64, Stop> {
    if depth > MAX_VALUE_DEPTH {
        return Err(Stop::TooDeep);
    }
    let size = if let Some(s) = v.downcast_ref::<CelString>() {
        s.inner().len() as u64
    } else if let Some(b) = v.downcast_ref::<CelBytes>() {
        b.inner().len() as u64
    } else if let Some(l) = v.downcast_ref::<CelList>() {
        let mut total = 0u64;
        for e in l.inner() {
            total += ELEMENT_COST + measure(e.as_ref(), depth + 1)?;
            if total > MAX_VALUE_BYTES {
                return Err(Stop::TooLarge);
            }
        }
        total
    } else if let Some(m) = v.downcast_ref::<CelMap>() {
        let mut total = 0u64;
        for (k, e) in m.inner() {
            total +=
                ELEMENT_COST + measure(k.inner(), depth + 1)? + measure(e.as_ref(), depth + 1)?;
            if total > MAX_VALUE_BYTES {
                return Err(Stop::TooLarge);
            }
        }
        total
    } else if let Some(iterable) = v.as_iterable() {
        // Another list implementation (maps are all `CelMap` here).
        let mut total = 0u64;
        let mut items = iterable.iter();
        while let Some(e) = items.next() {
            total += ELEMENT_COST + measure(e, depth + 1)?;
            if total > MAX_VALUE_BYTES {
                return Err(Stop::TooLarge);
            }
        }
        total
    } else {
        8
    };
    if size > MAX_VALUE_BYTES {
        return Err(Stop::TooLarge);
    }
    Ok(size)
}
