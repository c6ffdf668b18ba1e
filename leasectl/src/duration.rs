//! Durations on the command line: `500ms`, `3s`, `1m`, `2h` (also `1.5s`).

use std::time::Duration;

/// Parse a duration such as `500ms`, `3s`, `1m` or `1.5s`.
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("{text:?} has no unit; write e.g. 500ms, 3s or 1m"))?;
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} does not start with a number"))?;
    let seconds = match unit {
        "ms" => value / 1_000.0,
        "s" => value,
        "m" => value * 60.0,
        "h" => value * 3_600.0,
        _ => return Err(format!("{text:?} has unit {unit:?}; use ms, s, m or h")),
    };
    if !seconds.is_finite() || seconds > 86_400.0 * 365.0 {
        return Err(format!("{text:?} is too long"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// A duration the way `parse` reads it back: `500ms`, `3s`, `1.5s`, `2m`.
pub fn show(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(60_000) && ms > 0 {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1_000) && ms > 0 {
        format!("{}s", ms / 1_000)
    } else if ms >= 1_000 {
        format!("{:.1}s", d.as_secs_f64())
    } else {
        format!("{ms}ms")
    }
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
        assert!(parse("3").is_err());
        assert!(parse("s").is_err());
        assert!(parse("3 days").is_err());
        assert!(parse("-1s").is_err());
        assert_eq!(show(Duration::from_millis(500)), "500ms");
        assert_eq!(show(Duration::from_secs(30)), "30s");
        assert_eq!(show(Duration::from_secs(120)), "2m");
        assert_eq!(show(Duration::from_millis(1_500)), "1.5s");
    }
}
