//! The connection string's keys the engine reads itself, taken out before tokio-postgres
//! parses the rest (it refuses keys it does not know).
//!
//! One mechanism for all of them: [`take_keys`] finds the given keys in a URL
//! (`postgres://…?k=v&…`, percent-encoded) or a libpq key-value string (`k=v …`, values
//! optionally single-quoted), hands each value over, and returns the string without them. The
//! TLS keys (`sslmode`, `sslrootcert`, `sslcert`, `sslkey`) are read by [`crate::tls`]; the
//! engine's own key, [`TRANSACTION_POOLER`], here.

use crate::PgSetupError;

/// The engine's key saying the URL reaches the server through a transaction-pooling
/// connection pooler (PgBouncer in `pool_mode = transaction`): `transaction_pooler=true`.
pub(crate) const TRANSACTION_POOLER: &str = "transaction_pooler";

/// Take [`TRANSACTION_POOLER`] out of `url`: the rest, and its value if the URL sets it.
pub(crate) fn split_engine_keys(url: &str) -> Result<(String, Option<bool>), PgSetupError> {
    let mut pooler = None;
    let rest = take_keys(url, &[TRANSACTION_POOLER], |key, value| {
        pooler = Some(parse_bool(key, &value)?);
        Ok(())
    })?;
    Ok((rest, pooler))
}

/// A boolean the way libpq spells them (`true`/`false`, `on`/`off`, `yes`/`no`, `1`/`0`).
fn parse_bool(key: &str, value: &str) -> Result<bool, PgSetupError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" | "on" | "yes" | "1" => Ok(true),
        "false" | "off" | "no" | "0" => Ok(false),
        _ => Err(PgSetupError::InvalidUrl {
            message: format!("invalid {key} {value:?}: use true or false"),
        }),
    }
}

/// `url` without `keys`, each of which found is handed to `take` with its decoded value, in
/// the order they appear.
pub(crate) fn take_keys(
    url: &str,
    keys: &[&str],
    mut take: impl FnMut(&str, String) -> Result<(), PgSetupError>,
) -> Result<String, PgSetupError> {
    let Some(scheme_len) = ["postgres://", "postgresql://"]
        .iter()
        .find(|s| url.starts_with(**s))
        .map(|s| s.len())
    else {
        // A key-value string: cut the pairs out where they are.
        let mut rest = String::new();
        let mut last = 0;
        for pair in key_values(url)? {
            if keys.contains(&pair.key.as_str()) {
                rest.push_str(&url[last..pair.start]);
                last = pair.end;
                take(&pair.key, pair.value)?;
            }
        }
        rest.push_str(&url[last..]);
        return Ok(rest);
    };
    let Some(q) = url[scheme_len..].find('?').map(|i| i + scheme_len) else {
        return Ok(url.to_owned());
    };
    let mut kept = Vec::new();
    for pair in url[q + 1..].split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let key = percent_decode(key)?;
        if keys.contains(&key.as_str()) {
            take(&key, percent_decode(value)?)?;
        } else {
            kept.push(pair);
        }
    }
    Ok(if kept.is_empty() {
        url[..q].to_owned()
    } else {
        format!("{}?{}", &url[..q], kept.join("&"))
    })
}

/// One `key=value` of a key-value connection string, with where it is.
struct Pair {
    key: String,
    value: String,
    start: usize,
    end: usize,
}

/// The pairs of a libpq key-value string: `key = value`, values optionally single-quoted,
/// backslash escaping a quote or a backslash.
fn key_values(text: &str) -> Result<Vec<Pair>, PgSetupError> {
    let bytes = text.as_bytes();
    let invalid = |why: &str| PgSetupError::InvalidUrl {
        message: format!("invalid connection string: {why}"),
    };
    let mut pairs = Vec::new();
    let mut i = 0;
    let skip_space = |i: &mut usize| {
        while *i < bytes.len() && bytes[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    loop {
        skip_space(&mut i);
        if i >= bytes.len() {
            return Ok(pairs);
        }
        let start = i;
        while i < bytes.len() && bytes[i] != b'=' && !bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        let key = text[start..i].to_owned();
        skip_space(&mut i);
        if i >= bytes.len() || bytes[i] != b'=' {
            return Err(invalid(&format!("{key:?} has no value")));
        }
        i += 1;
        skip_space(&mut i);
        let mut value = String::new();
        let quoted = i < bytes.len() && bytes[i] == b'\'';
        if quoted {
            i += 1;
        }
        loop {
            let Some(c) = text[i..].chars().next() else {
                if quoted {
                    return Err(invalid(&format!(
                        "the value of {key:?} has no closing quote"
                    )));
                }
                break;
            };
            if c == '\\'
                && let Some(next) = text[i + 1..].chars().next()
            {
                value.push(next);
                i += 1 + next.len_utf8();
                continue;
            }
            if quoted && c == '\'' {
                i += 1;
                break;
            }
            if !quoted && c.is_whitespace() {
                break;
            }
            value.push(c);
            i += c.len_utf8();
        }
        pairs.push(Pair {
            key,
            value,
            start,
            end: i,
        });
    }
}

fn percent_decode(text: &str) -> Result<String, PgSetupError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| PgSetupError::InvalidUrl {
                    message: format!("invalid percent-encoding in {text:?}"),
                })?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| PgSetupError::InvalidUrl {
        message: format!("{text:?} is not UTF-8 once decoded"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pooler_key_leaves_the_url_and_the_rest_stays() {
        let split = |url: &str| split_engine_keys(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        assert_eq!(
            split("postgres://u@h:6432/db?sslmode=disable&transaction_pooler=true"),
            (
                "postgres://u@h:6432/db?sslmode=disable".to_owned(),
                Some(true)
            )
        );
        assert_eq!(
            split("postgres://h/db?transaction_pooler=off"),
            ("postgres://h/db".to_owned(), Some(false))
        );
        assert_eq!(
            split("postgres://h/db?application_name=x"),
            ("postgres://h/db?application_name=x".to_owned(), None)
        );
        let (rest, pooler) = split("host=h transaction_pooler = 'yes' port=6432");
        assert_eq!(
            rest.split_whitespace().collect::<Vec<_>>(),
            ["host=h", "port=6432"]
        );
        assert_eq!(pooler, Some(true));
        let refused = split_engine_keys("postgres://h/db?transaction_pooler=maybe")
            .expect_err("not a boolean");
        assert!(
            refused.to_string().contains("transaction_pooler"),
            "{refused}"
        );
    }
}
