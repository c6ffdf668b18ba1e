//! Durations on the command line: `500ms`, `3s`, `1m`, `2h` (also `1.5s`), read and shown
//! exactly: a value is never rounded on its way in or out, so what a message says of a flag is
//! what the flag was given (`1499ms` reads back as `1.499s`, not `1.5s`).

use std::time::Duration;

/// The units, longest first: name and length in nanoseconds.
const UNITS: [(&str, u128); 4] = [
    ("h", 3_600_000_000_000),
    ("m", 60_000_000_000),
    ("s", 1_000_000_000),
    ("ms", 1_000_000),
];

/// The longest duration taken: a year.
const LONGEST_NANOS: u128 = 365 * 24 * 3_600_000_000_000;

/// Parse a duration such as `500ms`, `3s`, `1m` or `1.5s`. Decimals are exact (read as
/// decimal digits, not as a float); digits below a nanosecond are dropped.
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("{text:?} has no unit; write e.g. 500ms, 3s or 1m"))?;
    let (number, unit) = text.split_at(split);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if (whole.is_empty() && fraction.is_empty()) || !digits(fraction) {
        return Err(format!("{text:?} does not start with a number"));
    }
    let Some(&(_, per_unit)) = UNITS.iter().find(|(name, _)| *name == unit) else {
        return Err(format!("{text:?} has unit {unit:?}; use ms, s, m or h"));
    };
    let too_long = || format!("{text:?} is too long; at most a year (8760h)");
    // More than 40 digits is past a year whatever the unit: no need to read them.
    let whole: u128 = if whole.is_empty() {
        0
    } else if whole.len() > 40 {
        return Err(too_long());
    } else {
        whole.parse().map_err(|_| too_long())?
    };
    let mut nanos = whole.checked_mul(per_unit).ok_or_else(too_long)?;
    // Each decimal digit is a tenth of the one before; past a nanosecond they add nothing.
    let mut place = per_unit;
    for d in fraction.bytes() {
        place /= 10;
        if place == 0 {
            break;
        }
        nanos += u128::from(d - b'0') * place;
    }
    if nanos > LONGEST_NANOS {
        return Err(too_long());
    }
    // At most a year: fits in u64 nanoseconds.
    Ok(Duration::from_nanos(
        u64::try_from(nanos).map_err(|_| too_long())?,
    ))
}

/// A duration exactly, the way `parse` reads it back: in hours, minutes or seconds when one
/// of them divides it (`2h`, `2m`, `30s`), else in seconds from a second on and in
/// milliseconds below, with as many decimals as it takes (`1.499s`, `500ms`, `1.5ms`).
pub fn show(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_owned();
    }
    let whole = UNITS[..3].iter().find(|(_, n)| nanos.is_multiple_of(*n));
    if let Some((name, per_unit)) = whole {
        return format!("{}{name}", nanos / per_unit);
    }
    let (name, per_unit) = if nanos >= UNITS[2].1 {
        UNITS[2]
    } else {
        UNITS[3]
    };
    if nanos.is_multiple_of(per_unit) {
        return format!("{}{name}", nanos / per_unit);
    }
    let width = per_unit.ilog10() as usize;
    let fraction = format!("{:0width$}", nanos % per_unit);
    format!(
        "{}.{}{name}",
        nanos / per_unit,
        fraction.trim_end_matches('0')
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("3s"), Ok(Duration::from_secs(3)));
        assert_eq!(parse("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1_500)));
        assert_eq!(parse("2h"), Ok(Duration::from_secs(7_200)));
        assert_eq!(parse(".5s"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("8760h"), Ok(Duration::from_secs(365 * 86_400)));
        assert!(parse("3").is_err());
        assert!(parse("s").is_err());
        assert!(parse(".s").is_err());
        assert!(parse("1.2.3s").is_err());
        assert!(parse("3 days").is_err());
        assert!(parse("-1s").is_err());
        assert!(parse("8761h").is_err());
        assert!(parse(&format!("{}s", "9".repeat(60))).is_err());
    }

    /// Decimals are read as written: `1.499s` is 1,499 ms, not the float nearest to it.
    #[test]
    fn durations_parse_exactly() {
        assert_eq!(parse("1.499s"), Ok(Duration::from_millis(1_499)));
        assert_eq!(parse("0.1s"), Ok(Duration::from_millis(100)));
        assert_eq!(parse("1.5ms"), Ok(Duration::from_micros(1_500)));
        assert_eq!(parse("0.000000001s"), Ok(Duration::from_nanos(1)));
        assert_eq!(parse("0.0000000019s"), Ok(Duration::from_nanos(1)));
    }

    /// What is shown is what was given: never rounded (`1499ms` is not `1.5s`).
    #[test]
    fn durations_show_exactly() {
        assert_eq!(show(Duration::from_millis(500)), "500ms");
        assert_eq!(show(Duration::from_secs(30)), "30s");
        assert_eq!(show(Duration::from_secs(90)), "90s");
        assert_eq!(show(Duration::from_secs(120)), "2m");
        assert_eq!(show(Duration::from_secs(86_400)), "24h");
        assert_eq!(show(Duration::from_millis(1_500)), "1.5s");
        assert_eq!(show(Duration::from_millis(1_499)), "1.499s");
        assert_eq!(show(Duration::from_millis(60_001)), "60.001s");
        assert_eq!(show(Duration::from_micros(1_500)), "1.5ms");
        assert_eq!(show(Duration::from_nanos(1)), "0.000001ms");
        assert_eq!(show(Duration::ZERO), "0s");
        for text in [
            "1499ms",
            "1.5ms",
            "90s",
            "2m",
            "24h",
            "0.000001ms",
            "60.001s",
        ] {
            let d = parse(text).expect("a duration");
            assert_eq!(parse(&show(d)), Ok(d), "{text} -> {}", show(d));
        }
    }
}
