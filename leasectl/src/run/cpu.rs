//! `--balance cpu`: a child's CPU use, from `/proc/PID/stat`, as its bucket's load (in cores:
//! CPU seconds per second). It counts the child and the children it has reaped (a shell's
//! commands, once they end); a grandchild still running counts once it ends and is reaped.

use std::time::Instant;

use lease::Load;

/// The CPU time a process used, in clock ticks: its own and its reaped children's.
fn ticks(stat: &str) -> Option<u64> {
    // The command name (field 2) is in parentheses and may hold spaces or parentheses: the
    // fields after the last ')' are fixed. From there, field 3 (state) is the first; utime,
    // stime, cutime and cstime are fields 14 to 17.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let mut sum = 0u64;
    for i in 11..=14 {
        sum = sum.checked_add(fields.get(i)?.parse::<u64>().ok()?)?;
    }
    Some(sum)
}

/// Clock ticks per second, as the kernel counts CPU time in `/proc`.
fn ticks_per_second() -> f64 {
    // SAFETY: sysconf reads a constant; it has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 { hz as f64 } else { 100.0 }
}

/// Samples one child's CPU use.
pub struct CpuMeter {
    pid: u32,
    last: Option<(Instant, u64)>,
    hz: f64,
}

impl CpuMeter {
    /// A meter of process `pid`.
    pub fn new(pid: u32) -> Self {
        Self {
            pid,
            last: None,
            hz: ticks_per_second(),
        }
    }

    /// The CPU the child used since the last sample, in cores; `None` on the first sample or
    /// when the process is gone.
    pub fn sample(&mut self) -> Option<Load> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).ok()?;
        let now = (Instant::now(), ticks(&stat)?);
        let before = self.last.replace(now)?;
        let seconds = now.0.duration_since(before.0).as_secs_f64();
        if seconds <= 0.0 {
            return None;
        }
        let used = now.1.saturating_sub(before.1) as f64 / self.hz;
        Load::new(used / seconds).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_read_after_the_command_name() {
        // A name with a space and a parenthesis; utime 150, stime 50, cutime 7, cstime 3.
        let stat = "4242 (my (odd) name) S 1 4242 4242 0 -1 4194304 100 0 0 0 150 50 7 3 20 0 1 0 \
                    12345 1000000 100 18446744073709551615";
        assert_eq!(ticks(stat), Some(210));
        assert_eq!(ticks("4242 (short) S 1 2"), None, "too few fields");
    }

    #[test]
    fn the_first_sample_only_starts_the_meter_and_a_gone_process_gives_none() {
        let mut meter = CpuMeter::new(std::process::id());
        assert_eq!(meter.sample(), None);
        assert!(meter.last.is_some(), "the first sample is kept");
        assert_eq!(CpuMeter::new(u32::MAX).sample(), None);
    }
}
