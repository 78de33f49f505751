//! Windows, policies, and the pure decision logic shared by every backend.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

const MICROS: u64 = 1_000_000;

/// Structured Field integers are limited to 15 digits (RFC 8941 §3.3.1).
const SF_INT_MAX: u64 = 999_999_999_999_999;

/// One of the three fixed counting windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Window {
    Minute,
    Hour,
    Day,
}

impl Window {
    /// All windows, in header order.
    pub const ALL: [Window; 3] = [Window::Minute, Window::Hour, Window::Day];

    /// Name used in the headers: "minute", "hour" or "day".
    pub const fn name(self) -> &'static str {
        match self {
            Window::Minute => "minute",
            Window::Hour => "hour",
            Window::Day => "day",
        }
    }

    /// Window length in seconds.
    pub const fn secs(self) -> u64 {
        match self {
            Window::Minute => 60,
            Window::Hour => 3_600,
            Window::Day => 86_400,
        }
    }

    /// Index of the epoch-aligned window containing `now_us` (µs since the UNIX epoch).
    pub(crate) const fn index_at(self, now_us: u64) -> u64 {
        now_us / (self.secs() * MICROS)
    }

    /// Whole seconds (rounded up, so never 0) until the window containing `now_us` ends.
    const fn reset_secs_at(self, now_us: u64) -> u64 {
        let len = self.secs() * MICROS;
        let left = len - now_us % len;
        left.div_ceil(MICROS)
    }
}

/// Request quotas for the three windows; a quota of 0 blocks every request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Policy {
    pub minute: u64,
    pub hour: u64,
    pub day: u64,
}

impl Default for Policy {
    fn default() -> Self {
        Policy::new(600, 20_000, 200_000)
    }
}

impl Policy {
    pub const fn new(minute: u64, hour: u64, day: u64) -> Self {
        Policy { minute, hour, day }
    }

    /// Quota for one window.
    pub const fn quota(&self, window: Window) -> u64 {
        match window {
            Window::Minute => self.minute,
            Window::Hour => self.hour,
            Window::Day => self.day,
        }
    }

    pub(crate) const fn quotas(&self) -> [u64; 3] {
        [self.minute, self.hour, self.day]
    }
}

/// State of one window after a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowStatus {
    pub window: Window,
    /// Quota `q` of the window.
    pub quota: u64,
    /// Requests left `r` in the current window, after counting this request if it was admitted.
    pub remaining: u64,
    /// Seconds `t` until the window's quota is restored (1..=window length).
    pub reset_secs: u64,
}

/// The verdict for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    allowed: bool,
    windows: [WindowStatus; 3],
    exceeded: Option<Window>,
    retry_after: Option<u64>,
}

impl Decision {
    /// Whether the request was admitted (and counted).
    pub fn allowed(&self) -> bool {
        self.allowed
    }

    /// When denied, the exceeded window that is furthest from resetting.
    pub fn exceeded_window(&self) -> Option<Window> {
        self.exceeded
    }

    /// When denied, seconds until every exceeded window has reset (for `Retry-After`).
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after
    }

    /// Per-window state in the order minute, hour, day.
    pub fn windows(&self) -> &[WindowStatus; 3] {
        &self.windows
    }

    /// Value of the `RateLimit-Policy` header.
    pub fn policy_header(&self) -> String {
        let mut out = String::with_capacity(80);
        for (i, st) in self.windows.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            // Writing to a String cannot fail.
            let _ = write!(
                out,
                "\"{}\";q={};w={}",
                st.window.name(),
                st.quota.min(SF_INT_MAX),
                st.window.secs()
            );
        }
        out
    }

    /// Value of the `RateLimit` header.
    pub fn ratelimit_header(&self) -> String {
        let mut out = String::with_capacity(80);
        for (i, st) in self.windows.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            let _ = write!(
                out,
                "\"{}\";r={};t={}",
                st.window.name(),
                st.remaining.min(SF_INT_MAX),
                st.reset_secs
            );
        }
        out
    }
}

/// The admission rule every backend applies (the Lua script mirrors it): all windows must have room.
pub(crate) fn admits(policy: &Policy, counts_before: [u64; 3]) -> bool {
    counts_before
        .iter()
        .zip(policy.quotas())
        .all(|(&count, quota)| count < quota)
}

/// Builds the decision from the counts seen before this request, at time `now_us`.
pub(crate) fn decide(policy: &Policy, now_us: u64, counts_before: [u64; 3]) -> Decision {
    let allowed = admits(policy, counts_before);
    let mut exceeded: Option<(Window, u64)> = None;
    let windows = Window::ALL.map(|window| {
        let i = window as usize;
        let quota = policy.quota(window);
        let count = counts_before[i];
        let reset_secs = window.reset_secs_at(now_us);
        let remaining = if allowed {
            quota - count - 1
        } else {
            quota.saturating_sub(count)
        };
        if !allowed && count >= quota && exceeded.is_none_or(|(_, t)| reset_secs >= t) {
            exceeded = Some((window, reset_secs));
        }
        WindowStatus {
            window,
            quota,
            remaining,
            reset_secs,
        }
    });
    Decision {
        allowed,
        windows,
        exceeded: exceeded.map(|(w, _)| w),
        retry_after: exceeded.map(|(_, t)| t),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_is_rounded_up_and_never_zero() {
        assert_eq!(Window::Minute.reset_secs_at(0), 60);
        assert_eq!(Window::Minute.reset_secs_at(1), 60);
        assert_eq!(Window::Minute.reset_secs_at(59 * MICROS), 1);
        assert_eq!(Window::Minute.reset_secs_at(60 * MICROS - 1), 1);
        assert_eq!(Window::Day.reset_secs_at(86_400 * MICROS), 86_400);
    }

    #[test]
    fn huge_quota_is_clamped_in_headers() {
        let d = decide(&Policy::new(u64::MAX, u64::MAX, u64::MAX), 0, [0; 3]);
        assert!(d.policy_header().starts_with("\"minute\";q=999999999999999;w=60"));
    }
}
