//! `etcd://host:port[,host:port...][/prefix]`: the members to talk to and the key prefix the
//! store keeps everything under.

/// The port etcd serves clients on unless told otherwise.
pub const DEFAULT_PORT: u16 = 2379;

/// The key prefix when the URL names none.
pub const DEFAULT_PREFIX: &str = "lease";

/// A parsed `etcd://` URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdUrl {
    /// Each member as `http://host:port`, in the URL's order.
    pub endpoints: Vec<String>,
    /// The prefix every key starts with (without a trailing `/`).
    pub prefix: String,
}

/// Why a string is not a usable `etcd://` URL.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EtcdUrlError {
    /// Another scheme than `etcd://`.
    #[error("not an etcd URL (expected etcd://host:port[,host:port...][/prefix]): {url:?}")]
    NotEtcd {
        /// The URL given.
        url: String,
    },
    /// `etcds://` (TLS to etcd) is not supported yet.
    #[error("TLS to etcd (etcds://) is not supported yet; use etcd:// on a trusted network")]
    TlsUnsupported,
    /// No member named.
    #[error("the etcd URL names no host: {url:?}")]
    NoHost {
        /// The URL given.
        url: String,
    },
    /// A member whose port is not a number from 1 to 65535.
    #[error("bad port in etcd member {member:?}: expected host:port with a port from 1 to 65535")]
    BadPort {
        /// The member as written.
        member: String,
    },
    /// A prefix with characters that would make keys ambiguous.
    #[error(
        "bad key prefix {prefix:?}: use letters, digits, '-', '_' and '.', with '/' between parts"
    )]
    BadPrefix {
        /// The prefix as written.
        prefix: String,
    },
}

impl EtcdUrl {
    /// Parse `url`. Retrying cannot help an error: the URL must change.
    pub fn parse(url: &str) -> Result<Self, EtcdUrlError> {
        let rest = if let Some(rest) = url.strip_prefix("etcd://") {
            rest
        } else if url.starts_with("etcds://") {
            return Err(EtcdUrlError::TlsUnsupported);
        } else {
            return Err(EtcdUrlError::NotEtcd { url: url.into() });
        };
        let (hosts, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let prefix = prefix.trim_end_matches('/');
        let prefix = if prefix.is_empty() {
            DEFAULT_PREFIX.to_owned()
        } else if prefix.split('/').all(|part| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        }) {
            prefix.to_owned()
        } else {
            return Err(EtcdUrlError::BadPrefix {
                prefix: prefix.into(),
            });
        };
        let mut endpoints = Vec::new();
        for member in hosts.split(',').filter(|m| !m.is_empty()) {
            endpoints.push(endpoint(member)?);
        }
        if endpoints.is_empty() {
            return Err(EtcdUrlError::NoHost { url: url.into() });
        }
        Ok(Self { endpoints, prefix })
    }
}

/// `host[:port]` as `http://host:port`; IPv6 hosts in brackets (`[::1]:2379`).
fn endpoint(member: &str) -> Result<String, EtcdUrlError> {
    let bad = || EtcdUrlError::BadPort {
        member: member.into(),
    };
    let (host, port) = if let Some(v6) = member.strip_prefix('[') {
        let (host, after) = v6.split_once(']').ok_or_else(bad)?;
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p),
            None if after.is_empty() => None,
            None => return Err(bad()),
        };
        (format!("[{host}]"), port)
    } else {
        match member.rsplit_once(':') {
            Some((host, port)) => (host.to_owned(), Some(port)),
            None => (member.to_owned(), None),
        }
    };
    if host.is_empty() || host == "[]" {
        return Err(bad());
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => p.parse::<u16>().ok().filter(|&p| p > 0).ok_or_else(bad)?,
    };
    Ok(format!("http://{host}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_and_prefix() {
        let u = EtcdUrl::parse("etcd://10.0.0.1:2379,10.0.0.2:2380,node3/apps/orders").unwrap();
        assert_eq!(
            u.endpoints,
            [
                "http://10.0.0.1:2379",
                "http://10.0.0.2:2380",
                "http://node3:2379"
            ]
        );
        assert_eq!(u.prefix, "apps/orders");
        let u = EtcdUrl::parse("etcd://[::1]:32379,[::1]/").unwrap();
        assert_eq!(u.endpoints, ["http://[::1]:32379", "http://[::1]:2379"]);
        assert_eq!(u.prefix, DEFAULT_PREFIX);
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        use EtcdUrlError::*;
        let err = |u: &str| EtcdUrl::parse(u).unwrap_err();
        assert!(matches!(err("postgres://h/db"), NotEtcd { .. }));
        assert_eq!(err("etcds://h:2379"), TlsUnsupported);
        assert!(matches!(err("etcd://"), NoHost { .. }));
        assert!(matches!(err("etcd://,/p"), NoHost { .. }));
        for bad in [
            "etcd://h:0",
            "etcd://h:70000",
            "etcd://h:x",
            "etcd://:2379",
            "etcd://[::1",
        ] {
            assert!(matches!(err(bad), BadPort { .. }), "{bad}");
        }
        for bad in ["etcd://h/a//b", "etcd://h/a b", "etcd://h/ü"] {
            assert!(matches!(err(bad), BadPrefix { .. }), "{bad}");
        }
    }
}
