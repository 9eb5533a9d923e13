//! Kinds of Program, their sizes and their resumes. Sizes, for `resume_order: kind_size`:
//! Programs of a kind that runs much smaller than the fleet's average go before those of a kind
//! that runs much larger.
//!
//! A kind is the model, the system prompt ([`super::Arrival::system`]: a hash of its leading
//! bytes, whatever the session's own messages say) and whether the Program is a subagent:
//! subagents share their lead's system prompt but not its size, so they are a kind of their
//! own. Each kind keeps the final context (tokens) of its latest `stats_window_size` Programs
//! that ended; all kinds' latest are also pooled. A kind's tier is `round(log_r(its mean / the
//! pooled mean))`, `r` = `kind_size_tier_ratio`, and 0 — the fleet's own tier — until it has
//! [`MIN_KIND_SAMPLES`] samples and its mean is more than [`DISTINCT_STANDARD_ERRORS`] standard
//! errors from the pooled one. Kinds that differ only by their samples' noise (two system
//! prompts of one agent) thus share a tier, and within a tier the queue keeps its `mru` order.
//!
//! Each kind also counts its resumed Programs and how many resumed since the latest that had
//! held its place ([`Kinds::hold_free`]): requests of a kind none of whose latest resumed
//! Programs held (people thinking between turns) take the hold-free slack on any rank, not only
//! on a rank where nobody held (`hold_free_admission_by_kind`).
//!
//! At most [`MAX_KINDS`] kinds are kept. A new one replaces, of the kinds still short of
//! [`MIN_KIND_SAMPLES`], the one that learned least recently (an end or a resume), and only when
//! every kept kind has that many, the settled kind that learned least recently (the scheduler
//! counts either in a `Shed` note). One-off first messages (chats without a system prompt) and a
//! client sending ever new system prompts thus churn among themselves, not the kinds the fleet
//! has learned.

use rustc_hash::FxHashMap;

use super::Window;

/// Kinds kept at once.
pub const MAX_KINDS: usize = 1024;
/// Samples a kind needs before it can leave the fleet's tier.
pub const MIN_KIND_SAMPLES: usize = 5;
/// How far (in standard errors of its mean) a kind's mean must be from the pooled mean for it
/// to leave the fleet's tier.
pub const DISTINCT_STANDARD_ERRORS: f64 = 2.0;
/// The tier of kinds that are the fleet's size (or not known apart from it).
const FLEET_TIER: u64 = 1 << 32;

/// A kind's key: a hash of the model, the system prompt's key and the role (lead or
/// subagent); `None` without a system prompt (nor a first message standing for one).
pub fn kind_of(model: &str, system: Option<u64>, subagent: bool) -> Option<u64> {
    let system = system?;
    let mut bytes = Vec::with_capacity(model.len() + 9);
    bytes.extend_from_slice(model.as_bytes());
    bytes.extend_from_slice(&system.to_le_bytes());
    bytes.push(u8::from(subagent));
    Some(crate::hash::stable_hash(&bytes))
}

/// Which kind [`Kinds::learn`] replaced: one with [`MIN_KIND_SAMPLES`] samples or more, whose
/// size the fleet had learned, or one short of that.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replaced {
    Settled,
    Unsettled,
}

impl Replaced {
    /// The `Shed` note's reason.
    pub fn reason(self) -> &'static str {
        match self {
            Replaced::Settled => "kind_replaced",
            Replaced::Unsettled => "kind_replaced_unsettled",
        }
    }
}

/// A kind's latest totals, its resumes, and when it last learned (the [`Kinds`] learn count,
/// for replacement).
#[derive(Debug, Clone)]
struct Totals {
    window: Window,
    resumes: Resumes,
    learned_at: u64,
}

/// A kind's resumed Programs: how many resumed, and how many of those since the latest that had
/// held its place (all of them while none had).
#[derive(Debug, Clone, Copy, Default)]
struct Resumes {
    count: u64,
    since_held: u64,
}

impl Resumes {
    /// None of the latest `window` resumes held, and at least `min` of them are counted.
    fn hold_free(self, window: usize, min: usize) -> bool {
        let seen = self.count.min(window as u64);
        seen >= min as u64 && self.since_held >= seen
    }
}

impl Totals {
    /// It has the samples a kind needs before it can leave the fleet's tier.
    fn settled(&self) -> bool {
        self.window.len() >= MIN_KIND_SAMPLES
    }
}

/// Ended Programs' totals per kind, bounded in kinds and samples.
#[derive(Debug, Clone)]
pub struct Kinds {
    kinds: FxHashMap<u64, Totals>,
    pooled: Window,
    window: usize,
    learned: u64,
}

impl Kinds {
    pub fn new(window: usize) -> Self {
        Kinds {
            kinds: FxHashMap::default(),
            pooled: Window::new(window),
            window: window.max(1),
            learned: 0,
        }
    }

    /// A Program of `kind` ended with `total` tokens of context. Returns the kind replaced to
    /// make room for this one, if one was.
    pub fn learn(&mut self, kind: Option<u64>, total: u64) -> Option<Replaced> {
        if total == 0 {
            return None;
        }
        self.pooled.push(total as f64);
        let (t, replaced) = self.entry(kind?);
        t.window.push(total as f64);
        replaced
    }

    /// A Program of `kind` resumed after a pause or a tool call; `held`: it had held its place
    /// meanwhile. Returns the kind replaced to make room for this one, if one was.
    pub fn resumed(&mut self, kind: Option<u64>, held: bool) -> Option<Replaced> {
        let (t, replaced) = self.entry(kind?);
        let r = &mut t.resumes;
        r.count = r.count.saturating_add(1);
        r.since_held = if held {
            0
        } else {
            r.since_held.saturating_add(1)
        };
        replaced
    }

    /// Whether none of the latest `window` resumed Programs of `kind` had held its place, with
    /// at least `min` of them counted.
    pub fn hold_free(&self, kind: Option<u64>, window: usize, min: usize) -> bool {
        kind.and_then(|k| self.kinds.get(&k))
            .is_some_and(|t| t.resumes.hold_free(window, min))
    }

    /// Kinds kept that [`Self::hold_free`] holds for.
    pub fn hold_free_count(&self, window: usize, min: usize) -> usize {
        self.kinds
            .values()
            .filter(|t| t.resumes.hold_free(window, min))
            .count()
    }

    /// The totals of `kind`, made room for when it is new; and the kind replaced to make room.
    fn entry(&mut self, kind: u64) -> (&mut Totals, Option<Replaced>) {
        self.learned += 1;
        let mut replaced = None;
        if !self.kinds.contains_key(&kind) && self.kinds.len() >= MAX_KINDS {
            // Unsettled kinds first, then the least recently learned.
            let oldest = self
                .kinds
                .iter()
                .min_by_key(|(k, t)| (t.settled(), t.learned_at, **k))
                .map(|(k, t)| (*k, t.settled()));
            if let Some((k, settled)) = oldest {
                self.kinds.remove(&k);
                replaced = Some(if settled {
                    Replaced::Settled
                } else {
                    Replaced::Unsettled
                });
            }
        }
        let (window, learned) = (self.window, self.learned);
        let t = self.kinds.entry(kind).or_insert_with(|| Totals {
            window: Window::new(window),
            resumes: Resumes::default(),
            learned_at: 0,
        });
        t.learned_at = learned;
        (t, replaced)
    }

    /// The queue tier of a Program of `kind` (smaller first): [`FLEET_TIER`] plus
    /// `round(log_ratio(kind mean / pooled mean))` for a kind known to differ, [`FLEET_TIER`]
    /// itself otherwise.
    pub fn tier(&self, kind: Option<u64>, ratio: f64) -> u64 {
        let Some(t) = kind
            .and_then(|k| self.kinds.get(&k))
            .filter(|t| t.settled())
        else {
            return FLEET_TIER;
        };
        let t = &t.window;
        let (Some(mean), Some(var), Some(all)) = (t.mean(), t.variance(), self.pooled.mean())
        else {
            return FLEET_TIER;
        };
        let se = (var / t.len() as f64).sqrt();
        if (mean - all).abs() <= DISTINCT_STANDARD_ERRORS * se || ratio <= 1.0 || all <= 0.0 {
            return FLEET_TIER;
        }
        // Within ±64 tiers of the fleet's (a ratio just above 1 could ask for more).
        let steps = ((mean / all).ln() / ratio.ln()).round().clamp(-64.0, 64.0) as i64;
        FLEET_TIER.saturating_add_signed(steps)
    }

    /// Kinds kept.
    pub fn len(&self) -> usize {
        self.kinds.len()
    }

    /// Kinds kept whose tier is not the fleet's.
    pub fn apart(&self, ratio: f64) -> usize {
        self.kinds
            .keys()
            .filter(|k| self.tier(Some(**k), ratio) != FLEET_TIER)
            .count()
    }

    /// The pooled mean size (tokens) of the latest Programs that ended, all kinds together.
    pub fn pooled_mean(&self) -> Option<f64> {
        self.pooled.mean()
    }
}

/// A tier as steps from the fleet's (negative: ahead of it).
pub fn tier_steps(tier: u64) -> i64 {
    // Tiers stay within ±64 of FLEET_TIER, so the difference fits.
    tier.wrapping_sub(FLEET_TIER) as i64
}

impl super::Scheduler {
    /// The queue tier of a request of the Program in `slot` under `resume_order: kind_size`.
    pub(super) fn kind_tier(&self, slot: usize) -> u64 {
        self.kinds
            .tier(self.kind(slot), self.cfg.kind_size_tier_ratio)
    }

    /// The kind of the Program in `slot`.
    pub(super) fn kind(&self, slot: usize) -> Option<u64> {
        self.program(slot).kind
    }

    /// Kinds of Program kept, by their sizes or their resumes (diagnostics).
    pub fn kinds_kept(&self) -> usize {
        self.kinds.len()
    }

    /// Kinds of Program kept whose `kind_size` tier is not the fleet's (diagnostics).
    pub fn kinds_apart(&self) -> usize {
        self.kinds.apart(self.cfg.kind_size_tier_ratio)
    }

    /// The mean final context of the latest Programs that ended, all kinds (diagnostics).
    pub fn program_size_mean(&self) -> Option<f64> {
        self.kinds.pooled_mean()
    }

    /// The `kind_size` tier of the Program in `slot`, in steps from the fleet's (diagnostics).
    pub fn kind_tier_steps(&self, slot: usize) -> i64 {
        tier_steps(self.kind_tier(slot))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn learn(k: &mut Kinds, kind: u64, totals: &[u64]) {
        for &t in totals {
            k.learn(Some(kind), t);
        }
    }

    #[test]
    fn kinds_far_from_the_fleet_leave_its_tier() {
        let mut k = Kinds::new(100);
        // Chat ~1,000 tokens, agents ~16,000, tools ~4,000: pooled mean 7,000.
        learn(&mut k, 1, &[900, 1000, 1100, 1000, 1000]);
        learn(&mut k, 2, &[15_000, 16_000, 17_000, 16_000, 16_000]);
        learn(&mut k, 3, &[3900, 4000, 4100, 4000, 4000]);
        // log4(1/7) = -1.40, log4(16/7) = 0.60, log4(4/7) = -0.40.
        assert_eq!(k.tier(Some(1), 4.0), FLEET_TIER - 1);
        assert_eq!(k.tier(Some(2), 4.0), FLEET_TIER + 1);
        assert_eq!(k.tier(Some(3), 4.0), FLEET_TIER);
        assert_eq!(tier_steps(k.tier(Some(1), 4.0)), -1);
        assert_eq!(tier_steps(k.tier(Some(2), 4.0)), 1);
        assert_eq!(k.apart(4.0), 2, "chat and agents, not tools");
        assert_eq!(k.pooled_mean(), Some(7000.0));
        // Finer tiers tell the tools kind apart too: log2(4/7) = -0.81.
        assert_eq!(k.tier(Some(3), 2.0), FLEET_TIER - 1);
        assert_eq!(
            k.tier(None, 4.0),
            FLEET_TIER,
            "no lead key: the fleet's tier"
        );
        assert_eq!(k.tier(Some(9), 4.0), FLEET_TIER, "never seen");
        assert_eq!(
            Kinds::new(4).tier(Some(1), 4.0),
            FLEET_TIER,
            "nothing ended yet"
        );
    }

    #[test]
    fn kinds_alike_but_for_noise_share_the_fleet_tier() {
        let mut k = Kinds::new(100);
        // Two system prompts of one agent: the same spread, means 10 % apart.
        learn(&mut k, 1, &[2000, 9000, 30_000, 6000, 14_000, 4000]);
        learn(&mut k, 2, &[3000, 11_000, 33_000, 6000, 12_000, 5000]);
        assert_eq!(k.tier(Some(1), 2.0), FLEET_TIER);
        assert_eq!(k.tier(Some(2), 2.0), FLEET_TIER);
        // Too few samples to tell, however far off.
        let mut k = Kinds::new(100);
        learn(&mut k, 1, &[100; MIN_KIND_SAMPLES - 1]);
        learn(&mut k, 2, &[10_000; 10]);
        assert_eq!(k.tier(Some(1), 4.0), FLEET_TIER);
    }

    #[test]
    fn samples_and_kinds_are_bounded() {
        let mut k = Kinds::new(3);
        learn(&mut k, 7, &[9000, 9000, 9000, 10, 10, 10]);
        assert_eq!(k.kinds[&7].window.len(), 3, "the latest 3 only");
        assert_eq!(k.pooled.len(), 3);
        let mut replaced = Vec::new();
        for kind in 0..(MAX_KINDS as u64 + 10) {
            replaced.extend(k.learn(Some(1000 + kind), 50));
        }
        assert_eq!(k.len(), MAX_KINDS);
        assert_eq!(
            replaced,
            [Replaced::Unsettled; 11],
            "kind 7 (3 samples) and the ten that learned least recently"
        );
        assert!(!k.kinds.contains_key(&7));
        assert_eq!(
            k.learn(Some(1000 + MAX_KINDS as u64 + 9), 50),
            None,
            "kept: none replaced"
        );
        assert_eq!(
            k.learn(Some(5), 0),
            None,
            "an empty Program teaches nothing"
        );
    }

    #[test]
    fn one_off_kinds_churn_among_themselves() {
        let mut k = Kinds::new(100);
        // A settled kind that learned first of all, then a flood of one-off kinds.
        learn(&mut k, 1, &[800; MIN_KIND_SAMPLES]);
        let mut replaced = Vec::new();
        for kind in 0..(3 * MAX_KINDS as u64) {
            replaced.extend(k.learn(Some(10_000 + kind), 20_000));
        }
        assert!(replaced.iter().all(|r| *r == Replaced::Unsettled));
        assert_eq!(replaced.len(), 2 * MAX_KINDS + 1);
        assert!(k.kinds.contains_key(&1), "the learned kind is kept");
        assert!(k.tier(Some(1), 3.0) < FLEET_TIER, "and still told apart");
        // Once every kept kind is settled, the least recently learned settled one goes.
        let mut k = Kinds::new(100);
        for kind in 0..MAX_KINDS as u64 {
            learn(&mut k, kind, &[100; MIN_KIND_SAMPLES]);
        }
        assert_eq!(
            k.learn(Some(MAX_KINDS as u64), 100),
            Some(Replaced::Settled)
        );
        assert!(!k.kinds.contains_key(&0));
    }

    #[test]
    fn a_kind_is_hold_free_once_its_latest_resumes_never_held() {
        let mut k = Kinds::new(100);
        k.resumed(Some(1), true);
        for _ in 0..10 {
            k.resumed(Some(1), false);
        }
        assert!(
            !k.hold_free(Some(1), 16, 16),
            "11 resumes counted, 16 needed"
        );
        for _ in 0..10 {
            k.resumed(Some(1), false);
        }
        assert!(
            k.hold_free(Some(1), 16, 16),
            "the held one left the latest 16"
        );
        assert!(
            !k.hold_free(Some(1), 100, 16),
            "and is still among the latest 100"
        );
        k.resumed(Some(1), true);
        assert!(!k.hold_free(Some(1), 16, 16), "one held resume ends it");
        assert!(!k.hold_free(None, 16, 1), "no kind");
        assert!(!k.hold_free(Some(2), 16, 1), "never seen");
        assert_eq!(k.resumed(None, false), None);
        assert_eq!(k.len(), 1, "resumes make a kind kept, without a size");
        assert_eq!(k.tier(Some(1), 2.0), FLEET_TIER);
        for _ in 0..16 {
            k.resumed(Some(3), false);
        }
        assert_eq!(k.hold_free_count(16, 16), 1);
    }

    #[test]
    fn resumes_make_room_like_ends() {
        let mut k = Kinds::new(100);
        learn(&mut k, 1, &[100; MIN_KIND_SAMPLES]);
        let mut replaced = Vec::new();
        for kind in 0..(2 * MAX_KINDS as u64) {
            replaced.extend(k.resumed(Some(10_000 + kind), false));
        }
        assert_eq!(k.len(), MAX_KINDS);
        assert!(replaced.iter().all(|r| *r == Replaced::Unsettled));
        assert!(k.kinds.contains_key(&1), "the settled kind is kept");
    }

    #[test]
    fn the_same_lead_under_another_model_or_role_is_another_kind() {
        assert_ne!(kind_of("a", Some(1), false), kind_of("b", Some(1), false));
        assert_ne!(kind_of("a", Some(1), false), kind_of("a", Some(1), true));
        assert_eq!(kind_of("a", Some(1), true), kind_of("a", Some(1), true));
        assert_eq!(kind_of("a", None, false), None);
    }
}
