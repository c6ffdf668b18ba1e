//! Everything `leasectl` prints goes through here, because `println!` panics on any write
//! error and every output error needs an outcome of its own:
//!
//! - stdout's reader went away (a closed pipe: `leasectl demo | head -1`): nobody wants more
//!   output, so the command ends quietly with exit 0, once the work that changes something is
//!   done (`migrate`, `release --force`), at once for the demo, after a graceful stop for a
//!   worker;
//! - any other write error on stdout (a full disk: `> /dev/full`): a runtime failure, exit 1,
//!   said on stderr;
//! - a write error on stderr (closed, full): there is nowhere left to report it, so it is
//!   dropped, log lines included ([`LogWriter`]), and the exit code stays what it would be.

use std::fmt::Display;
use std::io::{self, Write};
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};

use tokio_util::sync::CancellationToken;

/// Why a line could not be written to stdout.
#[derive(Debug)]
pub enum OutputError {
    /// The reader went away (`EPIPE`).
    Closed,
    /// Any other write error (`ENOSPC`, `EIO`, ...).
    Failed(io::Error),
}

impl From<io::Error> for OutputError {
    fn from(e: io::Error) -> Self {
        if e.kind() == io::ErrorKind::BrokenPipe {
            Self::Closed
        } else {
            Self::Failed(e)
        }
    }
}

impl OutputError {
    /// The failure this ends the command with.
    pub fn failure(&self) -> Failure {
        match self {
            Self::Closed => Failure::OutputClosed,
            Self::Failed(e) => Failure::Runtime(format!("cannot write to stdout: {e}")),
        }
    }

    /// The failure for output lost after the command changed something: `done` says what, so a
    /// failed exit is not read as "nothing happened".
    pub fn failure_after(&self, done: &str) -> Failure {
        match self {
            Self::Closed => Failure::OutputClosed,
            Self::Failed(e) => Failure::Runtime(format!("{done}, but cannot write to stdout: {e}")),
        }
    }
}

impl From<OutputError> for Failure {
    fn from(e: OutputError) -> Self {
        e.failure()
    }
}

fn write_to(out: &mut impl Write, text: impl Display, newline: bool) -> Result<(), OutputError> {
    // Flushed at once: a line is either out or reported as not, never lost at exit.
    let written = if newline {
        writeln!(out, "{text}")
    } else {
        write!(out, "{text}")
    };
    written
        .and_then(|()| out.flush())
        .map_err(OutputError::from)
}

/// Write `text` and a newline to stdout.
pub fn line(text: impl Display) -> Result<(), OutputError> {
    write_to(&mut io::stdout().lock(), text, true)
}

/// Write `text` to stdout as it is.
pub fn text(text: impl Display) -> Result<(), OutputError> {
    write_to(&mut io::stdout().lock(), text, false)
}

/// Write `text` and a newline to stderr.
pub fn error_line(text: impl Display) {
    // Failing to write to stderr leaves nowhere to say so.
    write_to(&mut io::stderr().lock(), text, true).ok();
}

/// Stderr for the log lines: each one is written whole (under stderr's lock), and a write
/// error is dropped, as on every stderr line, and reported as success so that the logger does
/// not try to say so on stderr again.
#[derive(Clone, Copy, Debug)]
pub struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        io::stderr().lock().write_all(buf).ok();
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush().ok();
        Ok(())
    }
}

/// Stdout for code that cannot return an error (an ownership handler, the demo's renderer):
/// the first failure is kept and cancels `stop`, so the command winds down; later lines are
/// dropped. Lines of several tasks never interleave.
#[derive(Clone, Debug)]
pub struct SharedOutput {
    failure: Arc<Mutex<Option<OutputError>>>,
    stop: CancellationToken,
}

impl SharedOutput {
    /// Stdout that cancels `stop` when it fails.
    pub fn new(stop: CancellationToken) -> Self {
        Self {
            failure: Arc::new(Mutex::new(None)),
            stop,
        }
    }

    /// Write `text` and a newline; false if stdout failed, now or earlier.
    pub fn line(&self, text: impl Display) -> bool {
        let mut failure = self.failure.lock().unwrap_or_else(PoisonError::into_inner);
        if failure.is_some() {
            return false;
        }
        match line(text) {
            Ok(()) => true,
            Err(e) => {
                *failure = Some(e);
                self.stop.cancel();
                false
            }
        }
    }

    /// `Ok` while stdout works; else the failure to end the command with.
    pub fn check(&self) -> Result<(), Failure> {
        match &*self.failure.lock().unwrap_or_else(PoisonError::into_inner) {
            None => Ok(()),
            Some(e) => Err(e.failure()),
        }
    }

    /// Cancelled once stdout failed (or whoever shares the token stopped).
    pub fn stopped(&self) -> &CancellationToken {
        &self.stop
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer failing every write with `kind`.
    struct Failing(io::ErrorKind);

    impl Write for Failing {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::from(self.0))
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_closed_pipe_ends_quietly_and_anything_else_fails() {
        let closed = write_to(&mut Failing(io::ErrorKind::BrokenPipe), "x", true);
        assert!(matches!(closed, Err(OutputError::Closed)));
        assert!(matches!(
            closed.map_err(Failure::from),
            Err(Failure::OutputClosed)
        ));
        let full = write_to(&mut Failing(io::ErrorKind::StorageFull), "x", true);
        match full.map_err(|e| e.failure_after("applied")) {
            Err(Failure::Runtime(message)) => {
                assert!(
                    message.starts_with("applied, but cannot write to stdout"),
                    "{message}"
                );
            }
            other => panic!("a full disk is not a runtime failure: {other:?}"),
        }
    }
}

/// Why `leasectl` failed, and so its exit code.
#[derive(Debug)]
pub enum Failure {
    /// Bad input or configuration: exit 2.
    Usage(String),
    /// The operation failed: exit 1.
    Runtime(String),
    /// Stdout's reader went away (a closed pipe): stop quietly, exit 0, as nobody reads on.
    OutputClosed,
}

/// The exit code of `failure`, saying why on stderr.
pub fn exit_code(failure: Failure) -> ExitCode {
    match failure {
        Failure::OutputClosed => ExitCode::SUCCESS,
        Failure::Usage(message) => {
            error_line(format!("leasectl: {message}"));
            ExitCode::from(2)
        }
        Failure::Runtime(message) => {
            error_line(format!("leasectl: {message}"));
            ExitCode::from(1)
        }
    }
}

/// Help, version and usage errors the way clap prints them, with our exit codes for output
/// errors (clap's own `exit` ignores them).
pub fn clap_exit(e: &clap::Error) -> ExitCode {
    let code = u8::try_from(e.exit_code()).unwrap_or(2);
    let printed = e.print();
    if e.use_stderr() {
        // A usage error is already a failure; a lost message changes nothing.
        return ExitCode::from(code);
    }
    match printed.map_err(OutputError::from) {
        Ok(()) | Err(OutputError::Closed) => ExitCode::from(code),
        Err(failed) => exit_code(failed.failure()),
    }
}
