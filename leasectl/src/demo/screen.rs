//! What the demo shows: the buckets with their owners and tokens, the workers' loads, the
//! balance and the latest events, redrawn every frame on a terminal.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use lease::NodeId;
use lease::store::{BucketState, GroupSnapshot};

use super::{RENEW, TTL};

/// How often the screen is redrawn.
pub const FRAME: Duration = Duration::from_millis(100);
/// How many recent events the screen lists.
const RECENT: usize = 8;

/// What the screen shows, shared by the story and the renderer.
#[derive(Default)]
pub struct Screen {
    /// The phase being played.
    pub phase: String,
    /// Each worker's letter.
    pub letters: HashMap<NodeId, char>,
    /// Running workers by letter, with what each one's application owns.
    pub owned: BTreeMap<char, usize>,
    /// Workers crashed, by letter.
    pub crashed: Vec<char>,
    /// Workers stopped, by letter.
    pub stopped: Vec<char>,
    recent: VecDeque<String>,
}

impl Screen {
    /// Add an event line, forgetting the oldest beyond [`RECENT`].
    pub fn push_event(&mut self, line: String) {
        self.recent.push_back(line);
        while self.recent.len() > RECENT {
            self.recent.pop_front();
        }
    }
}

/// One frame: the screen's state with the store's snapshot, `elapsed` into the story.
pub fn render(screen: &Screen, snapshot: Option<&GroupSnapshot>, elapsed: Duration) -> String {
    let mut lines = vec![
        format!(
            "leasectl demo: workers sharing buckets on the in-memory store (ttl {}s, renew {}ms)",
            TTL.as_secs(),
            RENEW.as_millis()
        ),
        format!("t = {:>5.1}s  {}", elapsed.as_secs_f64(), screen.phase),
        String::new(),
        "buckets (owner letter and fencing token; . = unowned, lower case = expired):".into(),
    ];
    if let Some(snap) = snapshot {
        let cells: Vec<String> = snap
            .buckets
            .iter()
            .map(|b| {
                let owner = b.owner.and_then(|w| screen.letters.get(&w).copied());
                let cell = match (b.state, owner) {
                    (BucketState::Live, Some(l)) => format!("{l}{}", b.token),
                    (BucketState::Expired, Some(l)) => {
                        format!("{}{}", l.to_ascii_lowercase(), b.token)
                    }
                    _ => ".".into(),
                };
                format!("{:>3}:{cell:<5}", b.bucket)
            })
            .collect();
        for row in cells.chunks(8) {
            lines.push(format!("  {}", row.join(" ")));
        }
    }
    lines.push(String::new());
    lines.push("workers (buckets their application owns):".into());
    for (letter, n) in &screen.owned {
        lines.push(format!("  {letter}  {n:>3}  {}", "#".repeat(*n)));
    }
    for letter in &screen.crashed {
        lines.push(format!("  {letter}  crashed"));
    }
    for letter in &screen.stopped {
        lines.push(format!("  {letter}  stopped"));
    }
    if let Some(snap) = snapshot {
        lines.push(String::new());
        lines.push(crate::status::balance_line(snap));
    }
    lines.push(String::new());
    lines.push("recent events:".into());
    lines.extend(screen.recent.iter().map(|l| format!("  {l}")));
    lines.join("\n")
}
