//! Free loopback ports for the members, taken from below the kernel's ephemeral range.
//!
//! A port the kernel hands out for `bind(0)` comes from the ephemeral range, which is also
//! where the local ports of outgoing connections come from: once a killed member's port is
//! free, any client connection may take it as its local port and the member's restart would
//! fail with "address already in use". Ports below the range are only ever taken by a
//! listener that asks for them by number.

use std::net::TcpListener;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// The lowest port handed out.
const LOWEST: u16 = 10_000;

/// The next candidate of this process, starting at a random point, so that the processes
/// running tests at the same time seldom try the same ports.
static CURSOR: Mutex<Option<u16>> = Mutex::new(None);

/// `n` distinct ports on 127.0.0.1 that nobody listens on right now.
pub(crate) fn free_ports(n: usize) -> Result<Vec<u16>, String> {
    let first_ephemeral = ephemeral_start();
    if first_ephemeral < LOWEST + 1_000 {
        return ephemeral_ports(n);
    }
    let span = first_ephemeral - LOWEST;
    let mut cursor = CURSOR
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut next = cursor.unwrap_or_else(|| LOWEST + random_below(span));
    // Held until every port is chosen, so one call never returns a port twice.
    let mut held = Vec::with_capacity(n);
    for _ in 0..span {
        if held.len() == n {
            break;
        }
        let port = next;
        next = if next + 1 >= first_ephemeral {
            LOWEST
        } else {
            next + 1
        };
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
            held.push((port, listener));
        }
    }
    *cursor = Some(next);
    if held.len() < n {
        return Err(format!(
            "only {} free loopback ports between {LOWEST} and {first_ephemeral}",
            held.len()
        ));
    }
    Ok(held.into_iter().map(|(port, _)| port).collect())
}

/// The first port of the kernel's ephemeral range (`ip_local_port_range`).
fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// Ports from the kernel, when the range below the ephemeral one is too small to use.
fn ephemeral_ports(n: usize) -> Result<Vec<u16>, String> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind(("127.0.0.1", 0)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("finding a free port: {e}"))?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("finding a free port: {e}"))
}

fn random_below(span: u16) -> u16 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let mixed = u64::from(std::process::id())
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(u64::from(nanos).wrapping_mul(0xBF58_476D_1CE4_E5B9));
    u16::try_from((mixed >> 17) % u64::from(span)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_free_and_below_the_ephemeral_range() {
        let first = free_ports(6).expect("ports");
        let second = free_ports(6).expect("ports");
        let mut all: Vec<u16> = first.iter().chain(&second).copied().collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 12, "{first:?} {second:?}");
        let limit = ephemeral_start();
        if limit >= LOWEST + 1_000 {
            assert!(all.iter().all(|p| (LOWEST..limit).contains(p)), "{all:?}");
        }
        for port in all {
            TcpListener::bind(("127.0.0.1", port)).expect("still free");
        }
    }
}
