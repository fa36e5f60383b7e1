//! When a mounted volume is next due for a refresh. kubelet republishes every volume
//! periodically (`requiresRepublish`); a republish before the ExternalSecret's `refreshInterval`
//! has passed returns at once, with no backend call and no write.
//!
//! Held in memory: after an agent restart every volume is due once, then back on schedule.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// ESO's default when an ExternalSecret sets no `refreshInterval`.
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(3600);
/// How long a failed refresh waits before the next attempt when the backend is not backing off
/// (the failure was not transient); never longer than the refresh interval itself.
pub const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(30);

/// Longest `refreshInterval` accepted (see [`crate::api::rules::MAX_REFRESH_INTERVAL_SECS`]).
pub const MAX_REFRESH: Duration = Duration::from_secs(crate::api::rules::MAX_REFRESH_INTERVAL_SECS);

/// How often an ExternalSecret's values are refreshed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refresh {
    /// Re-resolve when this much time has passed since the last refresh.
    Every(Duration),
    /// `refreshInterval: 0`: fetched once, at mount time.
    Never,
}

impl Refresh {
    /// Parses `refreshInterval` (`1h`, `15m`, `1h30m`, `0`); absent means one hour, as in ESO.
    pub fn parse(interval: Option<&str>) -> Result<Self, String> {
        let Some(text) = interval else {
            return Ok(Refresh::Every(DEFAULT_REFRESH));
        };
        // The forms the CRD pattern admits are all Go's: one that still does not parse is more
        // than Go can count, so too long rather than malformed.
        let parsed = crate::api::duration::parse(text).or_else(|| {
            crate::api::rules::DURATION
                .is_match(text)
                .then_some(Duration::MAX)
        });
        match parsed {
            Some(d) if d.is_zero() => Ok(Refresh::Never),
            Some(d) if d > MAX_REFRESH => Err(format!(
                "spec.refreshInterval {text:?} is longer than the maximum of 8760h (one year); \
                 use 0 to fetch once"
            )),
            Some(d) => Ok(Refresh::Every(d)),
            None => Err(format!(
                "spec.refreshInterval {text:?} is not a duration like 1h, 15m or 0"
            )),
        }
    }

    /// The longest a fetched value may be reused for this ExternalSecret (`None`: forever).
    pub fn max_age(self) -> Option<Duration> {
        match self {
            Refresh::Every(d) => Some(d),
            Refresh::Never => None,
        }
    }
}

/// Next refresh time per mounted target (`None`: never).
#[derive(Default)]
pub struct Schedule {
    /// By the target path's bytes (see `locks`): cheaper to hash than a `Path`.
    due: Mutex<HashMap<OsString, Option<Instant>>>,
}

impl Schedule {
    /// True when `target` was refreshed by this process and is not due yet.
    pub fn is_fresh(&self, target: &Path, now: Instant) -> bool {
        let due = self.due.lock().unwrap_or_else(|p| p.into_inner());
        match due.get(target.as_os_str()) {
            Some(None) => true,
            Some(Some(at)) => now < *at,
            None => false,
        }
    }

    /// Records a successful (re)fresh of `target` at `now`.
    pub fn refreshed(&self, target: &Path, refresh: Refresh, now: Instant) {
        let next = match refresh {
            // Unreachable past MAX_REFRESH; an overflow would mean "never" anyway.
            Refresh::Every(d) => now.checked_add(d),
            Refresh::Never => None,
        };
        self.set(target, next);
    }

    /// Records a failed refresh: try again once the backend's backoff delay `backoff` has passed
    /// or, when it is not backing off, after a short wait; not at the next republish.
    pub fn failed(&self, target: &Path, refresh: Refresh, now: Instant, backoff: Option<Duration>) {
        let wait = match (backoff, refresh) {
            (Some(d), _) => d,
            (None, Refresh::Every(d)) => d.min(RETRY_AFTER_FAILURE),
            (None, Refresh::Never) => RETRY_AFTER_FAILURE,
        };
        self.set(target, Some(now.checked_add(wait).unwrap_or(now)));
    }

    /// How many targets are known: every volume this process mounted or refreshed and has not
    /// unpublished (volumes mounted before a restart count from their first republish).
    pub fn count(&self) -> usize {
        self.due.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Forgets `target` (unpublished).
    pub fn remove(&self, target: &Path) {
        let mut due = self.due.lock().unwrap_or_else(|p| p.into_inner());
        due.remove(target.as_os_str());
        crate::memory::shrink_emptied(&mut due);
    }

    fn set(&self, target: &Path, next: Option<Instant>) {
        self.due
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(target.as_os_str().to_owned(), next);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_intervals_like_eso() {
        assert_eq!(Refresh::parse(None), Ok(Refresh::Every(DEFAULT_REFRESH)));
        assert_eq!(Refresh::parse(Some("0")), Ok(Refresh::Never));
        assert_eq!(
            Refresh::parse(Some("1h30m")),
            Ok(Refresh::Every(Duration::from_secs(5400)))
        );
        assert!(
            Refresh::parse(Some("soon"))
                .unwrap_err()
                .contains("refreshInterval")
        );
        assert_eq!(Refresh::Never.max_age(), None);
        assert_eq!(
            Refresh::parse(Some("8760h")),
            Ok(Refresh::Every(MAX_REFRESH))
        );
        for huge in ["8761h", "3000000000h", "99999999999999999999999s"] {
            let err = Refresh::parse(Some(huge)).unwrap_err();
            assert!(err.contains("maximum of 8760h"), "{huge}: {err}");
        }
    }

    #[test]
    fn due_after_the_interval_never_for_zero_and_soon_after_a_failure() {
        let s = Schedule::default();
        let t = Path::new("/t");
        let now = Instant::now();
        assert!(!s.is_fresh(t, now), "unknown targets are due");
        s.refreshed(t, Refresh::Every(Duration::from_secs(60)), now);
        assert!(s.is_fresh(t, now + Duration::from_secs(59)));
        assert!(!s.is_fresh(t, now + Duration::from_secs(60)));
        s.refreshed(t, Refresh::Never, now);
        assert!(s.is_fresh(t, now + Duration::from_secs(1 << 30)));
        s.failed(t, Refresh::Every(Duration::from_secs(3600)), now, None);
        assert!(!s.is_fresh(t, now + RETRY_AFTER_FAILURE));
        s.failed(t, Refresh::Every(Duration::from_secs(1)), now, None);
        assert!(!s.is_fresh(t, now + Duration::from_secs(1)));
        // A backing-off backend: retried when its delay has passed, even past the interval.
        let backoff = Duration::from_secs(120);
        s.failed(
            t,
            Refresh::Every(Duration::from_secs(1)),
            now,
            Some(backoff),
        );
        assert!(s.is_fresh(t, now + backoff - Duration::from_millis(1)));
        assert!(!s.is_fresh(t, now + backoff));
        s.remove(t);
        assert!(!s.is_fresh(t, now));
    }
}
