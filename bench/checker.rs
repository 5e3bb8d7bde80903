//! The fault run's checker: reads the probes' log and the faults applied, and reports
//! overlaps (the figure that must be 0), fencing tokens out of order, failover gaps per
//! fault kind and false losses; with `--slots`, each per slot, and the most children alive
//! at once over all slots.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use super::{Config, Fault, BEAT_SLACK_NS};

/// One applied fault, for the checker.
pub struct Applied {
    pub fault: Fault,
    pub holder: String,
    pub at: u64,
    /// Applied as the first step of another fault (the release before a failover that loses the
    /// next grant): counted in the table, not among the run's faults.
    pub first_step: bool,
}

/// One probe's life, from the log.
#[derive(Debug, Default, Clone)]
struct Life {
    /// The slot it ran in (--slots; 0 otherwise).
    slot: usize,
    token: u64,
    start: u64,
    last: u64,
    stopped: bool,
}

pub struct Report {
    pub lines: Vec<String>,
    pub failed: bool,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN; // printed as "-"
    }
    let rank = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn ms(v: f64) -> String {
    if v.is_nan() {
        "-".into()
    } else {
        format!("{v:.1}")
    }
}

pub fn check(log: &Path, applied: &[Applied], exits: &[(String, i32, u64)], config: &Config) -> Report {
    let text = fs::read_to_string(log).unwrap_or_default();
    let mut lives: BTreeMap<String, Life> = BTreeMap::new();
    let mut caught = 0usize;
    // When the server restarted with its token floor starting again (the Datastore
    // emulator's version counter): tokens compare within one epoch only.
    let mut epochs: Vec<u64> = Vec::new();
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["START", id, token, t, slot @ ..] => {
                let t = t.parse().unwrap_or(0);
                let slot = slot.first().and_then(|s| s.parse().ok()).unwrap_or(0);
                lives.insert(
                    id.to_string(),
                    Life { slot, token: token.parse().unwrap_or(0), start: t, last: t, stopped: false },
                );
            }
            ["BEAT", id, t] => {
                if let Some(life) = lives.get_mut(*id) {
                    life.last = life.last.max(t.parse().unwrap_or(0));
                }
            }
            ["STOP", id, t] => {
                if let Some(life) = lives.get_mut(*id) {
                    life.last = life.last.max(t.parse().unwrap_or(0));
                    life.stopped = true;
                }
            }
            ["OVERLAP", ..] => caught += 1,
            ["EPOCH", t] => epochs.push(t.parse().unwrap_or(0)),
            _ => {}
        }
    }
    let mut ordered: Vec<(&String, &Life)> = lives.iter().collect();
    ordered.sort_by_key(|(_, l)| l.start);

    // Within each slot (the one lock without --slots): overlapping intervals [start, last
    // seen], and tokens out of order.
    let mut overlaps = 0usize;
    let mut longest = 0u64;
    let (mut disorder, mut disorder_across) = (0usize, 0usize);
    let across_restart = |a: &Life, b: &Life| epochs.iter().any(|&t| a.start < t && t <= b.start);
    for slot in 0..config.slots {
        let in_slot: Vec<&(&String, &Life)> = ordered.iter().filter(|(_, l)| l.slot == slot).collect();
        let mut latest_end: Option<(u64, &String)> = None;
        for (id, life) in &in_slot {
            if let Some((end, prev)) = latest_end {
                if life.start < end && prev != *id {
                    overlaps += 1;
                    longest = longest.max(end - life.start);
                }
            }
            if latest_end.is_none_or(|(end, _)| life.last > end) {
                latest_end = Some((life.last, id));
            }
        }
        for w in in_slot.windows(2).filter(|w| w[1].1.token <= w[0].1.token) {
            if across_restart(w[0].1, w[1].1) {
                disorder_across += 1;
            } else {
                disorder += 1;
            }
        }
    }
    let outside = ordered.iter().filter(|(_, l)| l.slot >= config.slots).count();
    // The most children alive at one instant, over every slot: at most --slots.
    let mut edges: Vec<(u64, i64)> = ordered.iter().flat_map(|(_, l)| [(l.start, 1), (l.last, -1)]).collect();
    edges.sort_by_key(|&(t, step)| (t, step));
    let most_at_once = edges
        .iter()
        .scan(0i64, |alive, &(_, step)| {
            *alive += step;
            Some(*alive)
        })
        .max()
        .unwrap_or(0) as usize;

    // Failover gap per fault kind: from the end of the faulted holder's child (its last
    // sign of life, or the fault itself if that came later, as when the child is
    // SIGKILLed between beats) to the next START. A holder whose child outlived the
    // next fault held through this one: no failover to measure.
    let mut gaps: BTreeMap<Fault, Vec<f64>> = BTreeMap::new();
    let mut held_through: BTreeMap<Fault, usize> = BTreeMap::new();
    for (i, a) in applied.iter().enumerate() {
        let Some(old) = lives.get(&a.holder) else { continue };
        // A child that was still beating when the next fault came held through this one
        // (its last BEAT may precede that fault by up to one beat period).
        let next_fault = applied.get(i + 1).map_or(u64::MAX, |n| n.at.saturating_sub(BEAT_SLACK_NS));
        if old.last >= next_fault {
            *held_through.entry(a.fault).or_default() += 1;
            continue;
        }
        let end = old.last.max(a.at);
        if let Some((_, next)) = ordered.iter().find(|(id, l)| l.start >= old.last && **id != a.holder) {
            gaps.entry(a.fault).or_default().push(next.start.saturating_sub(end) as f64 / 1e6);
        }
    }
    // False losses: a wrapper that exited 75 (lease lost) though no fault that may cost
    // the lease was applied to it. With --slots, a fault on the store itself (a server killed
    // or frozen, `leaderrun release`, which stands every slot down) applied while the wrapper's
    // child ran may cost its lease too.
    let hit_while_running = |identity: &String, exit_at: u64| {
        let Some(life) = lives.get(identity).filter(|_| config.slots > 1) else { return false };
        applied
            .iter()
            .any(|a| a.fault.hits_every_holder() && a.fault.may_lose_lease() && (life.start..=exit_at).contains(&a.at))
    };
    let false_losses: Vec<&(String, i32, u64)> = exits
        .iter()
        .filter(|(identity, code, at)| {
            *code == 75
                && !applied.iter().any(|a| &a.holder == identity && a.fault.may_lose_lease())
                && !hit_while_running(identity, *at)
        })
        .collect();

    let mut lines = Vec::new();
    let mut counts: BTreeMap<Fault, usize> = BTreeMap::new();
    for a in applied {
        *counts.entry(a.fault).or_default() += 1;
    }
    lines.push(format!(
        "fault run: {} faults, {} contenders{}, ttl {}, renew every {}, kill after {}, seed {}",
        applied.iter().filter(|a| !a.first_step).count(),
        config.contenders,
        if config.slots > 1 { format!(" on {} slots", config.slots) } else { String::new() },
        humantime::format_duration(config.ttl),
        humantime::format_duration(config.renew_every),
        humantime::format_duration(config.kill_after),
        config.seed
    ));
    lines.push(format!("children started: {}", ordered.len()));
    lines.push(format!("overlaps caught by flock: {caught}"));
    lines.push(format!("overlapping intervals: {overlaps} (longest {:.1} ms)", longest as f64 / 1e6));
    lines.push(format!("fencing tokens out of order: {disorder}"));
    if config.slots > 1 {
        lines.push(format!(
            "slots: {}; most children at once: {most_at_once}; children outside the slots: {outside}",
            config.slots
        ));
    }
    if !epochs.is_empty() {
        lines.push(format!(
            "server restarts that restart the token floor: {} (tokens out of order across one: {disorder_across})",
            epochs.len()
        ));
    }
    lines.push(format!("false losses: {}", false_losses.len()));
    // Each counted against the last fault applied before it (whichever holder that hit).
    let mut by_fault: BTreeMap<Fault, usize> = BTreeMap::new();
    for (identity, _, at) in &false_losses {
        let last = applied.iter().rev().find(|a| a.at <= *at).map(|a| a.fault);
        lines.push(format!("  false loss: {identity} exited 75, after {}", last.map_or("no fault", Fault::name)));
        if let Some(fault) = last {
            *by_fault.entry(fault).or_default() += 1;
        }
    }
    if !by_fault.is_empty() {
        let counted: Vec<String> = by_fault.iter().map(|(f, n)| format!("{}: {n}", f.name())).collect();
        lines.push(format!("false losses by the fault before them: {}", counted.join(", ")));
    }
    lines.push(String::new());
    lines.push("| fault | applied | held through | failovers | gap p50 ms | gap p99 ms | gap max ms |".into());
    lines.push("|---|---|---|---|---|---|---|".into());
    // Only the faults this run applied (each store and mode has its own).
    for fault in Fault::ALL.into_iter().filter(|f| counts.contains_key(f)) {
        let mut g = gaps.remove(&fault).unwrap_or_default();
        g.sort_by(|a, b| a.partial_cmp(b).unwrap());
        lines.push(format!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            fault.name(),
            counts.get(&fault).copied().unwrap_or(0),
            held_through.get(&fault).copied().unwrap_or(0),
            g.len(),
            ms(percentile(&g, 50.0)),
            ms(percentile(&g, 99.0)),
            ms(g.last().copied().unwrap_or(f64::NAN))
        ));
    }
    let failed =
        caught > 0 || overlaps > 0 || disorder > 0 || ordered.len() < 2 || most_at_once > config.slots || outside > 0;
    lines.push(String::new());
    lines.push(if failed { "RESULT: FAIL".into() } else { "RESULT: PASS (0 overlaps, tokens in order)".into() });
    Report { lines, failed }
}
