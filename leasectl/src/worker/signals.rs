//! The signals that stop a worker.

use tokio::signal::unix::{Signal, SignalKind, signal};

/// SIGTERM, SIGINT and SIGHUP, all meaning "stop": a closed terminal or a supervisor's hang-up
/// stops a worker gracefully too, instead of killing it without a revoke or a leave.
pub struct Signals(Option<[Signal; 3]>);

impl Signals {
    /// Listen from now on: a signal sent once this returns is never missed.
    pub fn listen() -> Self {
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
            signal(SignalKind::hangup()),
        ) {
            (Ok(term), Ok(int), Ok(hup)) => Self(Some([term, int, hup])),
            _ => {
                tracing::error!(
                    "cannot listen for SIGTERM/SIGINT/SIGHUP; stop the worker with SIGKILL"
                );
                Self(None)
            }
        }
    }

    /// The next SIGTERM, SIGINT or SIGHUP (never, if they cannot be listened for).
    pub async fn recv(&mut self) {
        match &mut self.0 {
            Some([term, int, hup]) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                    _ = hup.recv() => {}
                }
            }
            None => std::future::pending().await,
        }
    }
}
