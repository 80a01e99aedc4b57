//! The proxy's global budgets: bytes (request bodies being received, lines queued for agents'
//! stdin) and counts (SSE subscribers). A reservation is an RAII value, so whatever path a
//! request or line takes (written, refused, cancelled, agent gone) its share comes back exactly
//! once. **Invariant:** `used` never exceeds `limit`; a reservation that would is refused, never
//! waited for (the caller answers 503 with `Retry-After`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Releases at least this much at once count as "large" (worth giving memory back for).
const LARGE: u64 = 1 << 20;

/// A shared budget of bytes or items.
#[derive(Debug)]
pub struct Budget {
    used: AtomicU64,
    limit: u64,
    /// A large reservation was released since the budget was last empty.
    large_released: AtomicBool,
}

impl Budget {
    pub fn new(limit: u64) -> Arc<Budget> {
        Arc::new(Budget {
            used: AtomicU64::new(0),
            limit,
            large_released: AtomicBool::new(false),
        })
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Takes `n` from the budget, or `None` when that would exceed the limit.
    pub fn try_reserve(self: &Arc<Self>, n: u64) -> Option<Reservation> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(n).filter(|t| *t <= self.limit)
            })
            .ok()?;
        Some(Reservation {
            budgets: vec![(self.clone(), n)],
        })
    }

    fn release(&self, n: u64) {
        let before = self.used.fetch_sub(n, Ordering::AcqRel);
        if n >= LARGE {
            self.large_released.store(true, Ordering::Relaxed);
        }
        if before == n && self.large_released.swap(false, Ordering::Relaxed) {
            crate::sys::trim_soon();
        }
    }
}

/// A share of one or more budgets, given back on drop.
#[derive(Debug, Default)]
pub struct Reservation {
    budgets: Vec<(Arc<Budget>, u64)>,
}

impl Reservation {
    /// Adds `n` more from `budget` to this reservation; false (and nothing taken) when full.
    pub fn grow(&mut self, budget: &Arc<Budget>, n: u64) -> bool {
        match budget.try_reserve(n) {
            Some(mut r) => {
                self.budgets.append(&mut r.budgets);
                true
            }
            None => false,
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        for (b, n) in self.budgets.drain(..) {
            b.release(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_come_back_exactly_once() {
        let a = Budget::new(100);
        let b = Budget::new(50);
        let mut r = a.try_reserve(60).expect("fits");
        assert!(a.try_reserve(41).is_none());
        assert!(r.grow(&b, 50));
        assert!(!r.grow(&b, 1));
        assert_eq!((a.used(), b.used()), (60, 50));
        drop(r);
        assert_eq!((a.used(), b.used()), (0, 0));
        assert!(a.try_reserve(100).is_some());
        assert!(a.try_reserve(u64::MAX).is_none());
    }
}
