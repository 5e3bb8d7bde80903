//! `--slots N` through the binary, on any store: the checks each store's e2e file runs.

use std::time::Duration;

use serde_json::Value;

use super::*;

const LONG: Duration = Duration::from_secs(60);

/// A child that records its slot and token, then runs until the file `stop-$LEADERRUN_SLOT`
/// exists.
const SLOT_HOLDER: &str = r#"
echo "$LEADERRUN_SLOT $LEADERRUN_FENCING_TOKEN" > "$D/slot-$NAME.tmp"; mv "$D/slot-$NAME.tmp" "$D/slot-$NAME"
while [ ! -e "$D/stop-$LEADERRUN_SLOT" ]; do sleep 0.05; done
"#;

/// The slot and token a `SLOT_HOLDER` named `name` started with, once it has.
fn started(sb: &Sandbox, name: &str) -> (usize, u64) {
    wait_for(|| sb.exists(&format!("slot-{name}")), LONG, &format!("{name}'s child to start"));
    let text = sb.read(&format!("slot-{name}"));
    let mut words = text.split_whitespace().map(|w| w.parse::<u64>().expect("a number"));
    (words.next().unwrap() as usize, words.next().unwrap())
}

fn holder(sb: &Sandbox, url: &str, name: &str, extra: &[&str]) -> Wrapper {
    let mut args = vec!["--lock", "pool", "--slots", "3"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "sh", "-c", SLOT_HOLDER]);
    let mut cmd = sb.at(url, &args);
    cmd.env("NAME", name);
    sb.spawn(name, cmd)
}

fn json(out: &std::process::Output) -> Value {
    serde_json::from_str(stdout_of(out).trim()).unwrap_or_else(|e| panic!("no JSON ({e}): {}", stdout_of(out)))
}

/// Three one-shot runs fill slots 0, 1 and 2 in turn; a fourth finds every slot held and
/// runs nothing; status and list show every slot; release stands one slot or all down.
pub fn assert_a_semaphore_of_three(sb: &Sandbox, url: &str) {
    let mut running = Vec::new();
    for (i, name) in ["a", "b", "c"].into_iter().enumerate() {
        running.push(holder(sb, url, name, &[]));
        assert_eq!(started(sb, name).0, i, "the lowest free slot first");
    }
    let fourth = sb.output(sb.at(url, &["--lock", "pool", "--slots", "3", "-E", "3", "--", "touch", "fourth"]));
    assert_eq!(fourth.status.code(), Some(3), "every slot held: {}", stderr_of(&fourth));
    assert!(!sb.exists("fourth"), "a fourth child never starts");

    let status = sb.output(sb.at(url, &["status", "--lock", "pool"]));
    assert_eq!(status.status.code(), Some(0));
    assert!(stdout_of(&status).contains("slots:       3 seen, 3 held"), "{}", stdout_of(&status));
    let all = json(&sb.output(sb.at(url, &["status", "--json", "--lock", "pool"])));
    let all = all.as_array().expect("status --json of a lock with slots is a list");
    assert_eq!(all.len(), 3, "{all:?}");
    for (i, record) in all.iter().enumerate() {
        assert_eq!(
            (record["lock"].as_str(), record["slot"].as_u64(), record["held"].as_bool()),
            (Some("pool"), Some(i as u64), Some(true))
        );
        assert_eq!(record["fencing_token"].as_u64(), Some(started(sb, ["a", "b", "c"][i]).1));
    }
    let one = json(&sb.output(sb.at(url, &["status", "--json", "--lock", "pool", "--slot", "1"])));
    assert_eq!((one["slot"].as_u64(), one["held"].as_bool()), (Some(1), Some(true)), "{one}");
    let listed = json(&sb.output(sb.at(url, &["list", "--json"])));
    let slots: Vec<u64> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["lock"] == "pool")
        .map(|r| r["slot"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(slots.len(), 3, "list shows each slot under the lock's name: {listed}");

    // One slot stood down: its holder stops its child and exits 75; the others run on.
    let out = sb.output(sb.at(url, &["release", "--lock", "pool", "--slot", "1"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert_eq!(running.remove(1).wait_code(LONG), 75);
    assert!(running.iter_mut().all(|w| w.try_status().is_none()), "the other slots' children run on");
    // A new run takes the freed slot, with a larger token than its last holder's.
    running.insert(1, holder(sb, url, "d", &[]));
    let (slot, token) = started(sb, "d");
    assert_eq!(slot, 1);
    assert!(token > started(sb, "b").1);
    // Every slot stood down; each holder frees its slot as it goes.
    let out = sb.output(sb.at(url, &["release", "--lock", "pool"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    for mut wrapper in running {
        assert_eq!(wrapper.wait_code(LONG), 75);
    }
    let (code, all) = status_json(sb, url, "pool");
    assert_eq!(code, 1, "every slot free again: {all}");
}

/// A `--wait` run with every slot held takes the first slot that frees, and that one only.
pub fn assert_a_waiter_takes_the_slot_that_frees(sb: &Sandbox, url: &str) {
    let mut holders = Vec::new();
    for name in ["a", "b", "c"] {
        holders.push(holder(sb, url, name, &[]));
        started(sb, name);
    }
    let mut waiter = holder(sb, url, "w", &["--wait"]);
    std::thread::sleep(Duration::from_millis(300));
    assert!(!sb.exists("slot-w"), "no slot is free yet");
    std::fs::write(sb.file("stop-2"), "").unwrap();
    assert_eq!(holders.remove(2).wait_code(LONG), 0);
    let (slot, token) = started(sb, "w");
    assert_eq!(slot, 2, "the slot that freed");
    assert!(token > started(sb, "c").1);
    for slot in 0..2 {
        std::fs::write(sb.file(&format!("stop-{slot}")), "").unwrap();
    }
    for mut wrapper in holders {
        assert_eq!(wrapper.wait_code(LONG), 0);
    }
    assert_eq!(waiter.wait_code(LONG), 0);
}

/// A child that records its start and its stop with its slot and token, on CLOCK_BOOTTIME.
const TURN_IN_A_SLOT: &str = r#"
echo "start $NAME $LEADERRUN_SLOT $LEADERRUN_FENCING_TOKEN $(cut -d' ' -f1 /proc/uptime)" >> "$D/turns"
sleep 0.3
echo "stop $NAME $LEADERRUN_SLOT $LEADERRUN_FENCING_TOKEN $(cut -d' ' -f1 /proc/uptime)" >> "$D/turns"
"#;

/// Waiting runs with --slots 2 and --slots 3 on one lock: never more than 3 children at once,
/// never two in one slot, tokens rising within each slot, and the --slots 2 runs only ever in
/// slots 0 and 1.
pub fn assert_mixed_counts_never_exceed_the_largest(sb: &Sandbox, url: &str) {
    let mut runs = Vec::new();
    for i in 0..8 {
        let (count, name) = if i % 2 == 0 { ("2", format!("two-{i}")) } else { ("3", format!("three-{i}")) };
        let mut cmd = sb.at(url, &["--lock", "mixed", "--wait", "--slots", count, "--", "sh", "-c", TURN_IN_A_SLOT]);
        cmd.env("NAME", &name);
        runs.push(sb.spawn(&name, cmd));
    }
    for mut run in runs {
        assert_eq!(run.wait_code(Duration::from_secs(120)), 0, "{}", run.stderr());
    }
    // (name, slot, token, start, stop)
    let mut turns: Vec<(String, usize, u64, f64, f64)> = Vec::new();
    for line in sb.lines("turns") {
        let f: Vec<&str> = line.split(' ').collect();
        let at: f64 = f[4].parse().unwrap();
        match f[0] {
            "start" => turns.push((f[1].into(), f[2].parse().unwrap(), f[3].parse().unwrap(), at, f64::NAN)),
            _ => turns.iter_mut().find(|t| t.0 == f[1]).expect("a stop after its start").4 = at,
        }
    }
    assert_eq!(turns.len(), 8, "{turns:?}");
    for t in &turns {
        assert!(t.1 < 3, "{t:?}");
        assert!(!t.0.starts_with("two") || t.1 < 2, "a --slots 2 run in slot {}: {t:?}", t.1);
    }
    for slot in 0..3 {
        let mut in_slot: Vec<_> = turns.iter().filter(|t| t.1 == slot).collect();
        in_slot.sort_by(|a, b| a.3.total_cmp(&b.3));
        for pair in in_slot.windows(2) {
            assert!(pair[1].3 >= pair[0].4, "two children in slot {slot} at once: {in_slot:?}");
            assert!(pair[1].2 > pair[0].2, "slot {slot}'s tokens out of order: {in_slot:?}");
        }
    }
    for t in &turns {
        let beside = turns.iter().filter(|o| o.3 <= t.3 && t.3 < o.4).count();
        assert!(beside <= 3, "{beside} children at once at {}: {turns:?}", t.3);
    }
}
