//! A metrics recorder for tests: it counts the counters the worker increments, by series, so a
//! test can assert what the worker reported (a step of the store's clock, a store error)
//! rather than only what it did.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// Counters by name and labels, as `name{label="value",...}` (labels in the order the metric
/// was registered with); gauges and histograms are dropped.
///
/// Install it for one thread with `metrics::set_default_local_recorder` (the worker registers
/// its metrics inside `start`, on the thread awaiting it), or for the whole process with
/// `metrics::set_global_recorder` (one per test binary).
#[derive(Default)]
pub struct Counters(Mutex<BTreeMap<String, Arc<AtomicU64>>>);

impl Counters {
    /// The series' count so far (0 if it was never registered).
    pub fn get(&self, series: &str) -> u64 {
        self.series().get(series).copied().unwrap_or(0)
    }

    /// Every series registered so far, with its count.
    pub fn series(&self) -> BTreeMap<String, u64> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(k, v)| (k.clone(), v.load(Ordering::SeqCst)))
            .collect()
    }

    /// The sum of every series of counter `name` whose labels include each `(label, value)`.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        let wanted: Vec<String> = labels.iter().map(|(l, v)| format!("{l}={v:?}")).collect();
        self.series()
            .into_iter()
            .filter(|(series, _)| {
                series
                    .strip_prefix(name)
                    .and_then(|rest| rest.strip_prefix('{'))
                    .and_then(|rest| rest.strip_suffix('}'))
                    .is_some_and(|have| {
                        let have: Vec<&str> = have.split(',').collect();
                        wanted.iter().all(|w| have.contains(&w.as_str()))
                    })
            })
            .map(|(_, n)| n)
            .sum()
    }
}

impl metrics::Recorder for Counters {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }

    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }

    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }

    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={:?}", l.key(), l.value()))
            .collect();
        let series = format!("{}{{{}}}", key.name(), labels.join(","));
        let counter = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(series)
            .or_default()
            .clone();
        metrics::Counter::from_arc(counter)
    }

    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }

    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}
