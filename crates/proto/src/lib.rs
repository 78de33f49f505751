//! Wire contract between Gantry workers and the scheduler.
//!
//! * [`v1`]: the `gantry.worker.v1` protobuf messages and the `WorkerGateway`
//!   gRPC client and server, generated at build time from
//!   `proto/gantry/worker/v1/worker.proto`.
//! * [`auth`]: the JWT a worker presents when it connects.

pub mod auth;

/// Generated code for the `gantry.worker.v1` protobuf package.
pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("gantry.worker.v1");
}

/// The `Failure.error` of an attempt whose `Assign.deadline_unix_ms` passed,
/// whether while it ran or before the worker could start it. The scheduler
/// records such a job as `TIMED_OUT` rather than `FAILED`, so a worker must
/// send exactly this text (and `retryable: false`) for a passed deadline.
pub const DEADLINE_EXCEEDED: &str = "deadline exceeded";

/// Micro-units in one whole unit of [`v1::Usage::quantity_micros`].
pub const MICROS_PER_UNIT: i64 = 1_000_000;

impl v1::Usage {
    /// `count` whole units of `unit`, e.g. `Usage::whole("requests", 1)`.
    /// Saturates at `i64::MAX` micro-units (about 9.2 × 10¹² units).
    pub fn whole(unit: impl Into<String>, count: u64) -> Self {
        let count = i64::try_from(count).unwrap_or(i64::MAX);
        Self {
            unit: unit.into(),
            quantity_micros: count.saturating_mul(MICROS_PER_UNIT),
        }
    }

    /// An exact quantity given in millionths of `unit`
    /// (`Usage::micros("megapixels", 1_500_000)` is 1.5 megapixels).
    pub fn micros(unit: impl Into<String>, quantity_micros: i64) -> Self {
        Self {
            unit: unit.into(),
            quantity_micros,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::v1::Usage;

    #[test]
    fn usage_is_exact_fixed_point() {
        assert_eq!(Usage::whole("requests", 3).quantity_micros, 3_000_000);
        assert_eq!(Usage::whole("tokens", u64::MAX).quantity_micros, i64::MAX);
        assert_eq!(Usage::micros("megapixels", 1_500_000).quantity_micros, 1_500_000);
    }
}
