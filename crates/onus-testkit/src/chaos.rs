//! A chaos sink: an [`HttpSink`] whose answers are drawn at random from a seed, per endpoint path,
//! from every way an endpoint misbehaves: 2xx, 5xx, 408, 429 with and without `Retry-After`, 410,
//! a hang past the caller's timeout, a reset connection, a slow answer. The same seed gives every
//! path the same sequence of answers in every run (the n-th request to a path draws from the
//! seed, the path and n), whatever order requests of different paths arrive in; the sink records
//! every request with its time, headers, body and the concurrency at its path.
//!
//! ```no_run
//! # async fn demo() {
//! use std::time::Duration;
//! use onus_testkit::chaos::{Behaviour, Chaos, Mix};
//! let chaos = Chaos::new(42)
//!     .rule("/dead/", Mix::only(Behaviour::Hang(Duration::from_secs(3600))))
//!     .rule("/ok/", Mix::only(Behaviour::Ok));
//! let sink = chaos.start().await; // everything else: Mix::default(), a bit of everything
//! # let _ = sink.url("/flaky/1");
//! # }
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::distributions::{Distribution, WeightedIndex};
use rand::SeedableRng;

use crate::sink::{HttpSink, Received, Reply};

/// One way an endpoint answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// 200 at once.
    Ok,
    /// 500 at once.
    ServerError,
    /// 408 at once.
    RequestTimeout,
    /// 429 without `Retry-After`.
    TooMany,
    /// 429 with `Retry-After` of so many seconds.
    TooManyAfter(u32),
    /// 503 with `Retry-After` of so many seconds.
    UnavailableAfter(u32),
    /// 410: the endpoint is gone.
    Gone,
    /// No answer for this long (past any sane timeout), then 200.
    Hang(Duration),
    /// The connection is reset, no status.
    Reset,
    /// 200 after this long.
    Slow(Duration),
}

impl Behaviour {
    /// The sink's answer.
    pub fn reply(self) -> Reply {
        match self {
            Behaviour::Ok => Reply::status(200),
            Behaviour::ServerError => Reply::status(500).body("chaos: server error"),
            Behaviour::RequestTimeout => Reply::status(408),
            Behaviour::TooMany => Reply::status(429),
            Behaviour::TooManyAfter(s) => Reply::status(429).header("retry-after", &s.to_string()),
            Behaviour::UnavailableAfter(s) => {
                Reply::status(503).header("retry-after", &s.to_string())
            }
            Behaviour::Gone => Reply::status(410),
            Behaviour::Hang(d) => Reply::status(200).delay(d),
            Behaviour::Reset => Reply::reset(),
            Behaviour::Slow(d) => Reply::status(200).delay(d),
        }
    }
}

/// Behaviours with weights: each request draws one, with chances in proportion to its weight.
#[derive(Debug, Clone)]
pub struct Mix(Vec<(Behaviour, u32)>);

impl Mix {
    /// Behaviours and their weights; at least one weight must be above zero.
    pub fn new(weights: &[(Behaviour, u32)]) -> Mix {
        assert!(
            weights.iter().any(|(_, w)| *w > 0),
            "a mix needs at least one behaviour with a weight above zero"
        );
        Mix(weights.to_vec())
    }

    /// Always the same behaviour.
    pub fn only(b: Behaviour) -> Mix {
        Mix(vec![(b, 1)])
    }

    fn draw(&self, rng: &mut rand::rngs::StdRng) -> Behaviour {
        match WeightedIndex::new(self.0.iter().map(|(_, w)| *w)) {
            Ok(ix) => self.0[ix.sample(rng)].0,
            Err(_) => Behaviour::Ok,
        }
    }
}

impl Default for Mix {
    /// Mostly 2xx, and a bit of every failure: 5xx, 408, 429 with and without `Retry-After`, 503
    /// with it, 410, hangs of an hour, resets, and answers half a second late.
    fn default() -> Mix {
        Mix::new(&[
            (Behaviour::Ok, 60),
            (Behaviour::ServerError, 10),
            (Behaviour::RequestTimeout, 3),
            (Behaviour::TooMany, 3),
            (Behaviour::TooManyAfter(1), 4),
            (Behaviour::UnavailableAfter(1), 3),
            (Behaviour::Gone, 1),
            (Behaviour::Hang(Duration::from_secs(3600)), 3),
            (Behaviour::Reset, 5),
            (Behaviour::Slow(Duration::from_millis(500)), 8),
        ])
    }
}

/// The script of a chaos sink: a seed, rules by path prefix, and a mix for every other path.
#[derive(Debug, Clone)]
pub struct Chaos {
    seed: u64,
    rules: Vec<(String, Mix)>,
    default: Mix,
}

impl Chaos {
    /// A script drawn from `seed`, [`Mix::default`] for every path.
    pub fn new(seed: u64) -> Chaos {
        Chaos {
            seed,
            rules: Vec::new(),
            default: Mix::default(),
        }
    }

    /// Paths starting with `prefix` draw from `mix` (the first rule that matches wins).
    pub fn rule(mut self, prefix: &str, mix: Mix) -> Chaos {
        self.rules.push((prefix.to_string(), mix));
        self
    }

    /// Every path no rule matches draws from `mix`.
    pub fn otherwise(mut self, mix: Mix) -> Chaos {
        self.default = mix;
        self
    }

    /// What the `n`-th request (from 1) to `path` meets: the same for the same seed, path and n.
    pub fn behaviour(&self, path: &str, n: u64) -> Behaviour {
        let mix = self
            .rules
            .iter()
            .find(|(p, _)| path.starts_with(p.as_str()))
            .map_or(&self.default, |(_, m)| m);
        let mut rng = rand::rngs::StdRng::seed_from_u64(mix_seed(self.seed, path, n));
        mix.draw(&mut rng)
    }

    /// The sink's script: counts requests per path and answers each as [`Chaos::behaviour`] says.
    pub fn script(self) -> impl Fn(&Received, usize) -> Reply + Send + Sync + 'static {
        let counts: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
        move |req, _| {
            let path = req.path_only().to_string();
            let n = {
                let mut c = counts.lock().unwrap_or_else(|e| e.into_inner());
                let n = c.entry(path.clone()).or_default();
                *n += 1;
                *n
            };
            self.behaviour(&path, n).reply()
        }
    }

    /// Starts a sink on loopback answering by this script.
    pub async fn start(self) -> HttpSink {
        HttpSink::start(self.script()).await
    }
}

/// One seed from the sink's seed, a path and a request number (FNV-1a, then SplitMix64's
/// finaliser): stable across runs and platforms, unlike the standard library's hasher.
fn mix_seed(seed: u64, path: &str, n: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed;
    for b in path.bytes().chain(n.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}
