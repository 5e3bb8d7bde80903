//! A store with no server-side expiry (the client-timed core over in-memory records), on
//! the paused clock: a one-shot run takes a dead holder's record after one observation,
//! gives up at the first sign of a live holder, and watches no longer than its --timeout.

use super::*;

/// An elector on the client-timed core over in-memory records: a store with no
/// server-side expiry, where only a record's changes show that its holder lives.
fn client_timed_elector(s: &mut Setup, records: &Arc<MemoryRecords>, mode: Mode) -> Elector {
    let wall: Arc<dyn Fn() -> std::time::SystemTime + Send + Sync> = Arc::new(std::time::SystemTime::now);
    let store = Arc::new(ClientTimed::with_clocks(records.clone(), s.clock.clone(), wall));
    let election = Election {
        lock: LOCK.into(),
        identity: "a".into(),
        unique_identity: true,
        timing: timing(Duration::ZERO),
        mode,
        stop: Signal::SIGTERM,
        max_runtime: None,
        heartbeat: None,
        slots: 1,
    };
    let receiver = s.receiver.take().unwrap_or_else(|| mpsc::unbounded_channel().1);
    Elector::new(store, s.clock.clone(), election, receiver)
}

fn records() -> Arc<MemoryRecords> {
    Arc::new(MemoryRecords::new(Arc::new(std::time::SystemTime::now)))
}

/// A record left by a holder that crashed: nobody will ever write it again.
fn crashed_holder(records: &MemoryRecords) {
    let record = ClientRecord { holder: "crashed".into(), ttl_seconds: 10, token: Some(7), ..ClientRecord::default() };
    records.put(LOCK, record);
}

#[tokio::test(start_paused = true)]
async fn a_one_shot_run_takes_a_dead_holders_record_after_one_observation() {
    let mut s = setup();
    let records = records();
    crashed_holder(&records);
    let mut child = s.recorder(Some(secs(1.0)), true);
    let outcome = client_timed_elector(&mut s, &records, once()).run(&mut child).await;
    assert!(matches!(outcome, Outcome::Exited(ChildExit::Code(0))), "{outcome:?}");
    match child.events()[0] {
        Event::Start { at, token, .. } => {
            assert_eq!(at, observation(10), "taken once the record went a whole observation unchanged");
            assert!(token > 7, "token {token} after the crashed holder's 7");
        }
        ref other => panic!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_one_shot_run_gives_up_at_the_first_sign_of_a_live_holder() {
    let mut s = setup();
    let records = records();
    crashed_holder(&records);
    let writer = records.clone();
    tokio::spawn(async move {
        // The holder renews 2 s in: alive.
        tokio::time::sleep(secs(2.0)).await;
        let renewed = ClientRecord { renewed: Some(std::time::SystemTime::now()), ..writer.get(LOCK).unwrap() };
        writer.put(LOCK, renewed);
    });
    let mut child = s.recorder(Some(secs(1.0)), true);
    let outcome = client_timed_elector(&mut s, &records, once()).run(&mut child).await;
    assert!(matches!(outcome, Outcome::Conflict(Some(_))), "{outcome:?}");
    assert!(child.events().is_empty());
    assert_eq!(s.clock.now(), secs(2.0), "it gave up when it saw the renewal, not later");
}

#[tokio::test(start_paused = true)]
async fn a_one_shot_run_watches_no_longer_than_its_timeout() {
    let mut s = setup();
    let records = records();
    crashed_holder(&records);
    let mut child = s.recorder(Some(secs(1.0)), true);
    let outcome =
        client_timed_elector(&mut s, &records, Mode::OneShot { until: Some(secs(4.0)), retry_until: secs(4.0) })
            .run(&mut child)
            .await;
    assert!(matches!(outcome, Outcome::Conflict(Some(_))), "{outcome:?}");
    assert!(child.events().is_empty());
    assert_eq!(s.clock.now(), secs(4.0));
}
