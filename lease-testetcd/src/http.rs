//! Asking a member about itself over HTTP/1: on its client port, through etcd's JSON gateway
//! (same port as gRPC), `GET /health` and `POST /v3/maintenance/status`; on its peer port,
//! `GET /version`. Plain std, no async runtime, so the harness works from any thread and
//! builds without protoc.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// How long a connection may take (on loopback it is made or refused at once).
const CONNECT_TIMEOUT: Duration = Duration::from_millis(300);
/// How long a status may take. A member accepts connections on its client port before it
/// answers on it (it serves clients only once it has published itself through raft, which
/// takes a quorum): waiting longer would only slow down polling.
const STATUS_TIMEOUT: Duration = Duration::from_millis(500);
/// How long the peer port's `/version` may take: answered at once once the member serves
/// its peers; a connection made just before may hang, and should cost little.
const PEER_TIMEOUT: Duration = Duration::from_millis(200);
/// How long `/health` may take: it makes a quorum read that gives up after 1 s.
const HEALTH_TIMEOUT: Duration = Duration::from_millis(1500);

/// What a member says about itself (`Maintenance.Status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberStatus {
    /// Its raft member id.
    pub member_id: u64,
    /// The member id of the leader it knows, if it knows one.
    pub leader: Option<u64>,
    /// Its raft term.
    pub raft_term: u64,
    /// The index of the last raft entry it has.
    pub raft_index: u64,
    /// The index of the last raft entry it has applied.
    pub raft_applied_index: u64,
    /// The store's revision as this member has applied it.
    pub revision: i64,
    /// The errors it reports (`etcdserver: no leader` when it has none).
    pub errors: Vec<String>,
}

/// `Maintenance.Status` of the member listening on `port`.
pub(crate) fn status(port: u16) -> Result<MemberStatus, String> {
    let body = request(port, "POST", "/v3/maintenance/status", "{}", STATUS_TIMEOUT)?;
    parse_status(&body).ok_or_else(|| format!("an unexpected status answer: {body}"))
}

/// Whether the member on `port` says it is healthy (`/health`: no alarm, a leader, and a
/// quorum read that succeeds).
pub(crate) fn healthy(port: u16) -> Result<bool, String> {
    let body = request(port, "GET", "/health", "", HEALTH_TIMEOUT)?;
    Ok(string_field(&body, "health") == Some("true"))
}

/// Whether the member whose peer port is `port` serves its peers (`GET /version` there): its
/// raft node runs, whether or not it is part of a quorum.
pub(crate) fn serves_peers(port: u16) -> bool {
    request(port, "GET", "/version", "", PEER_TIMEOUT).is_ok_and(|body| body.contains("etcdserver"))
}

fn request(
    port: u16,
    method: &str,
    path: &str,
    body: &str,
    timeout: Duration,
) -> Result<String, String> {
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&address, CONNECT_TIMEOUT)
        .map_err(|e| format!("connecting to {address}: {e}"))?;
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(|e| format!("setting timeouts: {e}"))?;
    // HTTP/1.0: the answer comes whole (never chunked) and the server closes the connection.
    let request = format!(
        "{method} {path} HTTP/1.0\r\nHost: {address}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream
        .write_all(request.as_bytes())
        .map_err(|e| format!("{method} {path} to {address}: {e}"))?;
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .map_err(|e| format!("{method} {path} to {address}: reading the answer: {e}"))?;
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{method} {path} to {address}: a truncated answer: {answer:?}"))?;
    let status_line = head.lines().next().unwrap_or_default();
    if status_line.split_whitespace().nth(1) != Some("200") {
        return Err(format!(
            "{method} {path} to {address}: {status_line}: {body}"
        ));
    }
    Ok(body.to_owned())
}

/// The gateway's JSON, read by hand: Go writes it compactly (`"key":"value"`), 64-bit numbers
/// as strings, and leaves out fields at their zero value (`leader` when there is none).
fn parse_status(body: &str) -> Option<MemberStatus> {
    let number = |key: &str| -> Option<u64> {
        match string_field(body, key) {
            Some(v) => v.parse().ok(),
            None => Some(0),
        }
    };
    let member_id = string_field(body, "member_id")?.parse().ok()?;
    Some(MemberStatus {
        member_id,
        leader: Some(number("leader")?).filter(|&l| l != 0),
        raft_term: number("raftTerm")?,
        raft_index: number("raftIndex")?,
        raft_applied_index: number("raftAppliedIndex")?,
        revision: string_field(body, "revision").map_or(Some(0), |v| v.parse().ok())?,
        errors: string_array(body, "errors"),
    })
}

/// The string value of the first `"key":"…"` in `body` (values here have no escapes).
fn string_field<'a>(body: &'a str, key: &str) -> Option<&'a str> {
    let marker = format!("\"{key}\":\"");
    let start = body.find(&marker)? + marker.len();
    let len = body[start..].find('"')?;
    Some(&body[start..start + len])
}

/// The strings of `"key":["…","…"]` in `body`; empty if absent.
fn string_array(body: &str, key: &str) -> Vec<String> {
    let marker = format!("\"{key}\":[");
    let Some(start) = body.find(&marker).map(|i| i + marker.len()) else {
        return Vec::new();
    };
    let Some(len) = body[start..].find(']') else {
        return Vec::new();
    };
    body[start..start + len]
        .split("\",\"")
        .map(|s| s.trim_matches('"').to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers of etcd 3.4.23, copied from a cluster.
    const FOLLOWER: &str = r#"{"header":{"cluster_id":"11669370906531957715","member_id":"11852298949108755392","revision":"7","raft_term":"2"},"version":"3.4.23","dbSize":"20480","leader":"6421395704004641794","raftIndex":"9","raftTerm":"2","raftAppliedIndex":"9","dbSizeInUse":"16384"}"#;
    const LEADERLESS: &str = r#"{"header":{"cluster_id":"11669370906531957715","member_id":"11801405351176995464","revision":"1","raft_term":"3"},"version":"3.4.23","dbSize":"20480","raftIndex":"12","raftTerm":"3","raftAppliedIndex":"12","errors":["etcdserver: no leader"],"dbSizeInUse":"16384"}"#;

    #[test]
    fn a_status_answer_is_read() {
        assert_eq!(
            parse_status(FOLLOWER),
            Some(MemberStatus {
                member_id: 11_852_298_949_108_755_392,
                leader: Some(6_421_395_704_004_641_794),
                raft_term: 2,
                raft_index: 9,
                raft_applied_index: 9,
                revision: 7,
                errors: vec![],
            })
        );
        let leaderless = parse_status(LEADERLESS).expect("parsed");
        assert_eq!(leaderless.leader, None);
        assert_eq!(leaderless.raft_term, 3);
        assert_eq!(leaderless.errors, vec!["etcdserver: no leader".to_owned()]);
        assert_eq!(parse_status(r#"{"error":"x"}"#), None);
        assert_eq!(
            string_field(r#"{"health":"true","reason":""}"#, "health"),
            Some("true")
        );
    }
}
