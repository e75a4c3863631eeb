//! The same families with prometheus-client's registry and text encoder.
use crate::*;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

type Labels = Vec<(&'static str, &'static str)>;

pub struct Metrics {
    registry: Registry,
    adjustments: Family<Labels, Counter>,
    hook: Histogram,
    pressure: Family<Labels, Gauge<f64, AtomicU64>>,
    evictions: Family<Labels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("nri_qos");
        let adjustments = Family::<Labels, Counter>::default();
        let hook = Histogram::new(HOOK_BUCKETS.iter().copied());
        let pressure = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        let evictions = Family::<Labels, Counter>::default();
        registry.register("adjustments", "Adjustments", adjustments.clone());
        registry.register("hook_duration_seconds", "Hook time", hook.clone());
        registry.register("pressure", "PSI", pressure.clone());
        registry.register("evictions", "Evictions", evictions.clone());
        Metrics {
            registry,
            adjustments,
            hook,
            pressure,
            evictions,
        }
    }
}

impl Exposition for Metrics {
    fn touch(&self, i: u64) {
        let i = i as usize;
        let c = CLASSES[i % CLASSES.len()];
        self.adjustments
            .get_or_create(&vec![("class", c), ("result", RESULTS[i % RESULTS.len()])])
            .inc();
        self.hook.observe((i % 50) as f64 * 0.000_01);
        self.pressure
            .get_or_create(&vec![
                ("resource", RESOURCES[i % 4]),
                ("kind", KINDS[i % 7]),
            ])
            .set(i as f64 * 0.5);
        self.evictions
            .get_or_create(&vec![("class", c), ("reason", REASONS[i % 3])])
            .inc();
    }

    fn render(&self) -> String {
        let mut o = String::with_capacity(8192);
        encode(&mut o, &self.registry).expect("encode to String");
        o
    }
}
