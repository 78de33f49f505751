//! Billing history: charges summed into time buckets (UTC), as
//! `GET /v2/billing`, `/v2/billing/endpoints` and
//! `/v2/billing/network-volumes` return them.
//!
//! Buckets are half-open `[start, end)`: hours, days, ISO weeks (from
//! Monday), calendar months and years. A window is snapped outward to bucket
//! boundaries, so every charge of a bucket is in its record and the records'
//! totals add up to the charges of the window exactly (sums are integer
//! micro-dollars; only the rendering is decimal).

use sea_orm::{ConnectionTrait, DbBackend, DbErr, Statement};

const HOUR_MS: i64 = 3_600_000;
const DAY_MS: i64 = 24 * HOUR_MS;
/// Most buckets one query may cover.
pub const MAX_BUCKETS: usize = 10_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BucketSize {
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl BucketSize {
    pub const ALL: [BucketSize; 5] = [Self::Hour, Self::Day, Self::Week, Self::Month, Self::Year];

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|b| b.as_str() == text)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hour => "hour",
            Self::Day => "day",
            Self::Week => "week",
            Self::Month => "month",
            Self::Year => "year",
        }
    }

    /// The start of the bucket `ms` falls in.
    pub fn floor(self, ms: i64) -> i64 {
        let days = ms.div_euclid(DAY_MS);
        match self {
            Self::Hour => ms.div_euclid(HOUR_MS) * HOUR_MS,
            Self::Day => days * DAY_MS,
            // 1970-01-01 was a Thursday: Monday is 3 days before it.
            Self::Week => (days - (days + 3).rem_euclid(7)) * DAY_MS,
            Self::Month => {
                let (y, m, _) = civil_from_days(days);
                days_from_civil(y, m, 1) * DAY_MS
            }
            Self::Year => {
                let (y, _, _) = civil_from_days(days);
                days_from_civil(y, 1, 1) * DAY_MS
            }
        }
    }

    /// The start of the bucket after the one starting at `start`.
    pub fn next(self, start: i64) -> i64 {
        match self {
            Self::Hour => start + HOUR_MS,
            Self::Day => start + DAY_MS,
            Self::Week => start + 7 * DAY_MS,
            Self::Month => {
                let (y, m, _) = civil_from_days(start.div_euclid(DAY_MS));
                let (y, m) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
                days_from_civil(y, m, 1) * DAY_MS
            }
            Self::Year => {
                let (y, _, _) = civil_from_days(start.div_euclid(DAY_MS));
                days_from_civil(y + 1, 1, 1) * DAY_MS
            }
        }
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
pub fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date `days` after 1970-01-01: (year, month, day).
pub fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Parses an RFC 3339 date-time (`2026-06-01T00:00:00Z`,
/// `2026-06-01T02:00:00.5+02:00`) into Unix milliseconds.
pub fn parse_rfc3339(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    if b.len() < 20 {
        return None;
    }
    let num = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = text.get(range)?;
        part.bytes().all(|c| c.is_ascii_digit()).then(|| part.parse().ok())?
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') || b[13] != b':' || b[16] != b':' {
        return None;
    }
    let days_in_month = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        _ => return None,
    };
    if !(1..=days_in_month).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut rest = &text[19..];
    let mut millis = 0i64;
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let padded = format!("{:0<3}", &fraction[..digits.min(3)]);
        millis = padded.parse().ok()?;
        rest = &fraction[digits..];
    }
    let offset_minutes = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            if rest.len() != 6 || rest.as_bytes()[3] != b':' {
                return None;
            }
            let h: i64 = rest[1..3].parse().ok()?;
            let m: i64 = rest[4..6].parse().ok()?;
            if h > 23 || m > 59 {
                return None;
            }
            sign * (h * 60 + m)
        }
    };
    let seconds =
        days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second.min(59) - offset_minutes * 60;
    Some(seconds * 1000 + millis)
}

/// Unix ms as RFC 3339 in UTC (`2026-06-01T00:00:00Z`).
pub fn format_rfc3339(ms: i64) -> String {
    let days = ms.div_euclid(DAY_MS);
    let (y, m, d) = civil_from_days(days);
    let in_day = ms.rem_euclid(DAY_MS) / 1000;
    let millis = ms.rem_euclid(1000);
    let base = format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}",
        in_day / 3600,
        in_day % 3600 / 60,
        in_day % 60
    );
    if millis == 0 {
        format!("{base}Z")
    } else {
        format!("{base}.{millis:03}Z")
    }
}

/// A resolved query window: `[start, end)`, aligned to `bucket`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub start: i64,
    pub end: i64,
    pub bucket: BucketSize,
}

impl Window {
    /// From `startTime`/`endTime` (defaults: 30 days ago, now) or `lastN`
    /// buckets ending with the current one, snapped outward to buckets.
    pub fn resolve(
        start: Option<i64>,
        end: Option<i64>,
        last_n: Option<u64>,
        bucket: BucketSize,
        now: i64,
    ) -> Result<Self, Vec<String>> {
        let mut errors = Vec::new();
        if last_n.is_some() && (start.is_some() || end.is_some()) {
            errors.push("lastN: cannot be combined with startTime or endTime".to_owned());
        }
        if last_n == Some(0) {
            errors.push("lastN: must be at least 1".to_owned());
        }
        if let (Some(s), Some(e)) = (start, end)
            && e <= s
        {
            errors.push("endTime: must be after startTime".to_owned());
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        let (start, end) = match last_n {
            Some(n) => {
                let end = bucket.next(bucket.floor(now));
                let mut start = bucket.floor(now);
                for _ in 1..n.min(MAX_BUCKETS as u64 + 1) {
                    start = bucket.floor(start - 1);
                }
                (start, end)
            }
            None => {
                let end = end.unwrap_or(now);
                let start = start.unwrap_or(end - 30 * DAY_MS);
                if end <= start {
                    return Err(vec![
                        "startTime: must be before endTime (which defaults to now)".to_owned(),
                    ]);
                }
                let floor_end = bucket.floor(end);
                let end = if floor_end == end { end } else { bucket.next(floor_end) };
                (bucket.floor(start), end)
            }
        };
        let window = Self { start, end, bucket };
        if window.buckets().len() > MAX_BUCKETS {
            return Err(vec![format!(
                "the window spans more than {MAX_BUCKETS} {}s: narrow it or use a larger bucketSize",
                bucket.as_str()
            )]);
        }
        Ok(window)
    }

    /// The buckets' starts and ends, in order.
    pub fn buckets(&self) -> Vec<(i64, i64)> {
        let mut out = Vec::new();
        let mut at = self.start;
        while at < self.end && out.len() <= MAX_BUCKETS {
            let next = self.bucket.next(at);
            out.push((at, next));
            at = next;
        }
        out
    }

    /// The index of the bucket holding `ms` (which must be in the window).
    pub fn index_of(&self, buckets: &[(i64, i64)], ms: i64) -> Option<usize> {
        let i = buckets.partition_point(|(start, _)| *start <= ms);
        (i > 0 && ms < buckets[i - 1].1).then(|| i - 1)
    }
}

/// A user's job charges in the window: (created ms, micro-USD).
pub async fn job_charges<C: ConnectionTrait>(db: &C, user: &str, window: &Window) -> Result<Vec<(i64, i64)>, DbErr> {
    // Every charge but the per-second ones (workers' and pods' time).
    let per_second: Vec<&str> = [Compute::Workers, Compute::Pods]
        .iter()
        .flat_map(|compute| compute.parts().iter().map(|(unit, _)| *unit))
        .collect();
    let sql = placeholders(
        db.get_database_backend(),
        &format!(
            "SELECT created_at, amount_micro_usd FROM ledger_entries WHERE user_id = ? AND created_at >= ? \
             AND created_at < ? AND unit NOT IN ({})",
            vec!["?"; per_second.len()].join(", ")
        ),
    );
    let mut values: Vec<sea_orm::Value> = vec![user.into(), window.start.into(), window.end.into()];
    values.extend(per_second.into_iter().map(sea_orm::Value::from));
    let rows = db
        .query_all_raw(Statement::from_sql_and_values(db.get_database_backend(), sql, values))
        .await?;
    rows.iter()
        .map(|r| Ok((r.try_get_by_index(0)?, r.try_get_by_index(1)?)))
        .collect()
}

/// Ledger units of serverless workers' time (GPU and CPU workers).
pub const GPU_WORKER_SECONDS: &str = "gpu_worker_seconds";
pub const CPU_WORKER_SECONDS: &str = "cpu_worker_seconds";
/// Ledger units of pods' time (GPU and CPU pods).
pub const GPU_POD_SECONDS: &str = "gpu_pod_seconds";
pub const CPU_POD_SECONDS: &str = "cpu_pod_seconds";
/// Ledger unit of a stopped pod's disk (the seconds it is kept).
pub const POD_DISK_SECONDS: &str = "pod_disk_seconds";

/// Compute charged by the second: serverless workers or pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compute {
    Workers,
    Pods,
}

/// What a per-second charge paid for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Gpu,
    Cpu,
    /// A stopped pod's disk.
    Disk,
}

impl Compute {
    /// Its ledger units, each with what it pays for (a worker's disk is not
    /// charged).
    pub fn parts(self) -> &'static [(&'static str, Part)] {
        match self {
            Compute::Workers => &[(GPU_WORKER_SECONDS, Part::Gpu), (CPU_WORKER_SECONDS, Part::Cpu)],
            Compute::Pods => &[
                (GPU_POD_SECONDS, Part::Gpu),
                (CPU_POD_SECONDS, Part::Cpu),
                (POD_DISK_SECONDS, Part::Disk),
            ],
        }
    }
}

/// A user's charges for `compute` in the window: (charged at ms, endpoint or
/// pod id, what it paid for, micro-USD), optionally of one endpoint or pod.
pub async fn compute_charges<C: ConnectionTrait>(
    db: &C,
    user: &str,
    window: &Window,
    compute: Compute,
    subject: Option<&str>,
) -> Result<Vec<(i64, String, Part, i64)>, DbErr> {
    let parts = compute.parts();
    let mut sql = format!(
        "SELECT created_at, model, unit, amount_micro_usd FROM ledger_entries WHERE user_id = ? \
         AND unit IN ({}) AND created_at >= ? AND created_at < ?",
        vec!["?"; parts.len()].join(", ")
    );
    let mut values: Vec<sea_orm::Value> = vec![user.into()];
    values.extend(parts.iter().map(|(unit, _)| sea_orm::Value::from(*unit)));
    values.extend([window.start.into(), window.end.into()]);
    if let Some(subject) = subject {
        sql.push_str(" AND model = ?");
        values.push(subject.into());
    }
    let sql = placeholders(db.get_database_backend(), &sql);
    let rows = db
        .query_all_raw(Statement::from_sql_and_values(db.get_database_backend(), sql, values))
        .await?;
    rows.iter()
        .map(|r| {
            let unit: String = r.try_get_by_index(2)?;
            Ok((
                r.try_get_by_index(0)?,
                r.try_get_by_index(1)?,
                parts
                    .iter()
                    .find(|(known, _)| *known == unit)
                    .map_or(Part::Cpu, |(_, part)| *part),
                r.try_get_by_index(3)?,
            ))
        })
        .collect()
}

/// A user's storage charges in the window: (hour ms, volume id, volume type,
/// micro-USD), optionally of one volume.
pub async fn storage_charges<C: ConnectionTrait>(
    db: &C,
    user: &str,
    window: &Window,
    volume: Option<&str>,
) -> Result<Vec<(i64, String, String, i64)>, DbErr> {
    let backend = db.get_database_backend();
    let mut sql = String::from(
        "SELECT hour_start_ms, volume_id, volume_type, amount_micro_usd FROM storage_charges \
         WHERE user_id = ? AND hour_start_ms >= ? AND hour_start_ms < ?",
    );
    let mut values: Vec<sea_orm::Value> = vec![user.into(), window.start.into(), window.end.into()];
    if let Some(volume) = volume {
        sql.push_str(" AND volume_id = ?");
        values.push(volume.into());
    }
    let rows = db
        .query_all_raw(Statement::from_sql_and_values(
            backend,
            placeholders(backend, &sql),
            values,
        ))
        .await?;
    rows.iter()
        .map(|r| {
            Ok((
                r.try_get_by_index(0)?,
                r.try_get_by_index(1)?,
                r.try_get_by_index(2)?,
                r.try_get_by_index(3)?,
            ))
        })
        .collect()
}

/// A user's ledger charges from `from` to `to` summed per bucket of `size`
/// ms, unit and subject (model, endpoint or pod): (bucket start ms, unit,
/// subject, micro-USD). One row per bucket and subject, however many
/// charges there were.
pub async fn charges_by_bucket<C: ConnectionTrait>(
    db: &C,
    user: &str,
    from: i64,
    to: i64,
    size: i64,
) -> Result<Vec<(i64, String, String, i64)>, DbErr> {
    let backend = db.get_database_backend();
    let sql = placeholders(
        backend,
        "SELECT (created_at - ?) / ? AS b, unit, model, CAST(SUM(amount_micro_usd) AS BIGINT) FROM ledger_entries \
         WHERE user_id = ? AND created_at >= ? AND created_at < ? GROUP BY b, unit, model",
    );
    let rows = db
        .query_all_raw(Statement::from_sql_and_values(
            backend,
            sql,
            [from.into(), size.into(), user.into(), from.into(), to.into()],
        ))
        .await?;
    rows.iter()
        .map(|r| {
            let bucket: i64 = r.try_get_by_index(0)?;
            Ok((
                from + bucket * size,
                r.try_get_by_index(1)?,
                r.try_get_by_index(2)?,
                r.try_get_by_index(3)?,
            ))
        })
        .collect()
}

/// `?` placeholders as the backend spells them (`$1`, `$2`, … on PostgreSQL).
pub fn placeholders(backend: DbBackend, sql: &str) -> String {
    if backend != DbBackend::Postgres {
        return sql.to_owned();
    }
    let mut out = String::with_capacity(sql.len() + 8);
    let mut n = 0;
    for c in sql.chars() {
        if c == '?' {
            n += 1;
            out.push_str(&format!("${n}"));
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> i64 {
        parse_rfc3339(text).unwrap_or_else(|| panic!("{text}"))
    }

    #[test]
    fn rfc3339_round_trips_and_refuses_nonsense() {
        assert_eq!(at("1970-01-01T00:00:00Z"), 0);
        assert_eq!(at("2026-06-01T02:00:00+02:00"), at("2026-06-01T00:00:00Z"));
        assert_eq!(at("2026-06-01T00:00:00.5Z") - at("2026-06-01T00:00:00Z"), 500);
        assert_eq!(format_rfc3339(at("2024-02-29T23:59:59Z")), "2024-02-29T23:59:59Z");
        for bad in [
            "2026-02-30T00:00:00Z",
            "2026-13-01T00:00:00Z",
            "2026-06-01",
            "2026-06-01T00:00:00",
            "yesterday",
            "2026-06-01T24:00:00Z",
            "2026-06-01T00:00:00+2:00",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn buckets_follow_the_calendar() {
        let t = at("2026-11-24T15:42:10Z");
        assert_eq!(format_rfc3339(BucketSize::Hour.floor(t)), "2026-11-24T15:00:00Z");
        assert_eq!(format_rfc3339(BucketSize::Day.floor(t)), "2026-11-24T00:00:00Z");
        // 2026-11-24 is a Tuesday: its ISO week began on Monday the 23rd.
        assert_eq!(format_rfc3339(BucketSize::Week.floor(t)), "2026-11-23T00:00:00Z");
        assert_eq!(format_rfc3339(BucketSize::Month.floor(t)), "2026-11-01T00:00:00Z");
        assert_eq!(format_rfc3339(BucketSize::Year.floor(t)), "2026-01-01T00:00:00Z");
        assert_eq!(
            format_rfc3339(BucketSize::Month.next(at("2026-12-01T00:00:00Z"))),
            "2027-01-01T00:00:00Z"
        );
        assert_eq!(
            format_rfc3339(BucketSize::Month.next(at("2024-02-01T00:00:00Z"))),
            "2024-03-01T00:00:00Z"
        );
    }

    #[test]
    fn windows_snap_outward_and_count_back() {
        let now = at("2026-11-24T15:42:10Z");
        let w = Window::resolve(
            Some(at("2026-11-20T10:00:00Z")),
            Some(at("2026-11-22T00:00:00Z")),
            None,
            BucketSize::Day,
            now,
        )
        .unwrap();
        assert_eq!(
            (format_rfc3339(w.start), format_rfc3339(w.end)),
            ("2026-11-20T00:00:00Z".into(), "2026-11-22T00:00:00Z".into())
        );
        assert_eq!(w.buckets().len(), 2);
        let w = Window::resolve(None, None, Some(3), BucketSize::Month, now).unwrap();
        assert_eq!(
            (format_rfc3339(w.start), format_rfc3339(w.end)),
            ("2026-09-01T00:00:00Z".into(), "2026-12-01T00:00:00Z".into())
        );
        assert!(Window::resolve(Some(1), Some(1), None, BucketSize::Day, now).is_err());
        assert!(Window::resolve(Some(1), None, Some(2), BucketSize::Day, now).is_err());
        assert!(
            Window::resolve(Some(0), Some(now), None, BucketSize::Hour, now).is_err(),
            "too many buckets"
        );
        let buckets = w.buckets();
        assert_eq!(w.index_of(&buckets, at("2026-10-31T23:59:59Z")), Some(1));
        assert_eq!(w.index_of(&buckets, at("2026-12-01T00:00:00Z")), None);
    }
}
