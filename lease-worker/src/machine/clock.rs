//! The store's clock as the node watches it: steps between heartbeats, and when dead
//! sessions' buckets may be taken.

use super::*;

impl Machine {
    /// When this node may take dead sessions' buckets: a ttl after it began watching the
    /// store's clock advance steadily. Until then a session the store calls dead may be one
    /// whose holder still trusts it: the store's clock stepped forward (before this node
    /// started, or since), and the holder fences by its own clock, up to a ttl after its last
    /// renewal. The node's own ttl stands for the group's: members of a group share one.
    pub fn takeover_opens(&self) -> Option<Instant> {
        self.steady_since.map(|t| t + self.rules.ttl.as_duration())
    }

    /// Compare the store's time in a heartbeat with the earlier ones'. Between two answers the
    /// store's clock must have advanced by at least the time from the first answer to the
    /// second request: less, by more than half the safety margin (the trust deadline absorbs
    /// smaller steps), is a backward step. Forward, the store reads its clock late in a call
    /// (under the row lock, after any wait), so its time is judged against the answers' times:
    /// the store's clock ahead of ours by more than half the margin beyond the least it was
    /// ahead over the last ttl is a forward step, whether it jumped at once or in smaller steps
    /// that add up. (Over a ttl, clocks drift apart by far less.) A false alarm only defers
    /// takeovers for a ttl.
    pub(super) fn observe_clock(&mut self, sent: Instant, received: Instant, observed: Timestamp) {
        let tolerance = self.rules.safety_margin / 2;
        let Some((received_before, observed_before)) = self.last_beat else {
            self.steady_since = Some(received);
            self.last_beat = Some((received, observed));
            self.ahead.push_back((received, TimeDelta::zero()));
            return;
        };
        // How far the store's clock is ahead of the node's, relative to the last answer's
        // reading, accumulated in `ahead`.
        let elapsed = TimeDelta::from_std(received.saturating_duration_since(received_before))
            .unwrap_or(TimeDelta::MAX);
        let last_ahead = self.ahead.back().map_or(TimeDelta::zero(), |&(_, a)| a);
        let ahead = last_ahead + ((observed - observed_before) - elapsed);
        while self.ahead.front().is_some_and(|&(t, _)| {
            received.saturating_duration_since(t) > self.rules.ttl.as_duration()
        }) {
            self.ahead.pop_front();
        }
        let least_ahead = self
            .ahead
            .iter()
            .map(|&(_, a)| a)
            .min()
            .unwrap_or(last_ahead);
        let tolerance_delta = TimeDelta::from_std(tolerance).unwrap_or(TimeDelta::MAX);
        if ahead - least_ahead > tolerance_delta {
            self.steady_since = Some(received);
            let by = (ahead - least_ahead).to_std().unwrap_or_default();
            self.reports
                .push_back(Report::ClockStep(ClockStep::Forward(by)));
            // Judged from here on: the step is reported once.
            self.ahead.clear();
        } else {
            let least = sent.saturating_duration_since(received_before);
            let advanced = observed - observed_before;
            let least_delta = TimeDelta::from_std(least).unwrap_or(TimeDelta::MAX);
            if advanced + tolerance_delta < least_delta {
                let by = (least_delta - advanced).to_std().unwrap_or_default();
                self.reports
                    .push_back(Report::ClockStep(ClockStep::Backward(by)));
            }
        }
        self.ahead.push_back((received, ahead));
        self.last_beat = Some((received, observed));
    }
}
