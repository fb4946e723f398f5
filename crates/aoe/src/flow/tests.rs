use super::*;

const MS: Duration = Duration::from_millis(1);

#[test]
fn window_grows_after_a_clean_window_and_halves_once_per_rto() {
    let t0 = Instant::now();
    let mut w = Window::new(16, 10 * MS, Duration::from_secs(1));
    assert_eq!(w.size(), 8);
    let opened: usize = (0..8).map(|_| w.on_reply(Some(MS))).sum();
    assert_eq!((w.size(), opened), (9, 1));
    // One loss event times out many frames: one cut.
    w.on_timeout(t0);
    w.on_timeout(t0 + MS);
    assert_eq!(w.size(), 4);
    // Five places in flight beyond the new size are not given back...
    let kept = (0..9).filter(|_| w.on_release()).count();
    assert_eq!(kept, 4);
    // ...and the next cut waits a retransmit timeout.
    w.on_timeout(t0 + w.rtt().timeout());
    assert_eq!(w.size(), 2);
    w.on_timeout(t0 + w.rtt().timeout() * 3);
    w.on_timeout(t0 + w.rtt().timeout() * 5);
    assert_eq!(w.size(), 1, "never below one");
}

#[test]
fn retransmits_take_new_tags_back_off_and_give_up_at_the_deadline() {
    let t0 = Instant::now();
    let mut w = Window::new(4, 10 * MS, Duration::from_secs(1));
    let mut tags = Tags::default();
    let mut ex = Exchange::start(3, &mut tags, &w, t0, Duration::from_secs(2));
    let first = ex.tag();
    assert_eq!(Tags::slot(first), 3);
    assert_eq!(ex.expiry(), t0 + w.rto(0));
    let Expired::Retransmit { tag } = ex.on_expiry(ex.expiry(), &mut tags, &mut w) else { panic!() };
    assert_ne!(tag, first);
    assert_eq!(Tags::slot(tag), 3);
    // A late reply to the first send is not this request's answer, and a
    // reply after a retransmit gives no RTT sample (Karn).
    assert!(!ex.accepts(first) && ex.accepts(tag));
    assert_eq!(ex.rtt_sample(ex.expiry()), None);
    assert_eq!(w.rto(1), w.rto(0) * 2);
    let mut retransmits = 1;
    loop {
        match ex.on_expiry(ex.expiry(), &mut tags, &mut w) {
            Expired::Retransmit { .. } => retransmits += 1,
            Expired::GiveUp { retransmits: n } => {
                assert_eq!(n, retransmits);
                break;
            }
        }
        assert!(ex.expiry() <= t0 + Duration::from_secs(2));
    }
}

/// Deterministic generator for the simulated network (xorshift64).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn percent(&mut self, p: u64) -> bool {
        self.next() % 100 < p
    }
    fn micros(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_micros(lo + self.next() % (hi - lo))
    }
}

#[derive(Debug, Default)]
struct Outcome {
    completed: Vec<u32>,
    /// Replies accepted for a request they did not answer (would be wrong data).
    misdelivered: u64,
    retransmits: u64,
    stray: u64,
    max_in_flight: usize,
    min_window: usize,
    final_window: usize,
    rtt_average: Duration,
}

/// `requests` requests through a window of `max` slots over a network that
/// loses `loss`% of frames each way, duplicates `dup`% of replies and
/// delays each by 0.1-3 ms (so replies overtake each other).
fn simulate(requests: usize, max: usize, loss: u64, dup: u64, seed: u64) -> Outcome {
    let t0 = Instant::now();
    let mut now = t0;
    let mut rng = Rng(seed);
    let mut w = Window::new(max, MS, Duration::from_secs(1));
    let mut tags = Tags::default();
    let mut slots: Vec<Option<(usize, Exchange)>> = vec![None; max];
    let mut places = w.size();
    let mut net: Vec<(Instant, u32, usize)> = Vec::new();
    let mut o = Outcome { completed: vec![0; requests], min_window: w.size(), ..Default::default() };
    let mut next = 0;
    let send = |rng: &mut Rng, net: &mut Vec<(Instant, u32, usize)>, now: Instant, tag: u32, id: usize| {
        if rng.percent(loss) {
            return; // request lost
        }
        let at = now + rng.micros(100, 3000);
        if !rng.percent(loss) {
            net.push((at, tag, id));
        }
        if rng.percent(dup) {
            net.push((at + rng.micros(1, 2000), tag, id));
        }
    };
    while o.completed.contains(&0) {
        while places > 0 && next < requests {
            let s = slots.iter().position(|x| x.is_none()).expect("a free slot for every place in the window");
            places -= 1;
            let ex = Exchange::start(s as u8, &mut tags, &w, now, Duration::from_secs(30));
            send(&mut rng, &mut net, now, ex.tag(), next);
            slots[s] = Some((next, ex));
            next += 1;
        }
        o.max_in_flight = o.max_in_flight.max(slots.iter().filter(|x| x.is_some()).count());
        let reply = net.iter().enumerate().min_by_key(|(_, (at, _, _))| *at).map(|(i, (at, _, _))| (i, *at));
        let timer = slots.iter().flatten().map(|(_, ex)| ex.expiry()).min();
        let reply_first = match (reply, timer) {
            (Some((_, at)), Some(t)) => at <= t,
            (Some(_), None) => true,
            (None, _) => false,
        };
        match (reply, timer) {
            (Some((i, at)), _) if reply_first => {
                now = at;
                let (_, tag, answers) = net.swap_remove(i);
                let s = Tags::slot(tag);
                match &slots[s] {
                    Some((id, ex)) if ex.accepts(tag) => {
                        if answers != *id {
                            o.misdelivered += 1;
                        }
                        o.completed[*id] += 1;
                        places += w.on_reply(ex.rtt_sample(now));
                        slots[s] = None;
                        if w.on_release() {
                            places += 1;
                        }
                    }
                    _ => o.stray += 1,
                }
            }
            (_, Some(t)) => {
                now = t;
                for slot in slots.iter_mut().flatten() {
                    if slot.1.expiry() <= now {
                        match slot.1.on_expiry(now, &mut tags, &mut w) {
                            Expired::Retransmit { tag } => {
                                o.retransmits += 1;
                                send(&mut rng, &mut net, now, tag, slot.0);
                            }
                            Expired::GiveUp { .. } => panic!("request {} given up", slot.0),
                        }
                    }
                }
            }
            _ => panic!("stalled with requests outstanding"),
        }
        o.min_window = o.min_window.min(w.size());
    }
    o.final_window = w.size();
    o.rtt_average = w.rtt().average();
    o
}

#[test]
fn clean_network_opens_the_window_without_retransmits() {
    let o = simulate(2000, 16, 0, 0, 7);
    assert!(o.completed.iter().all(|&n| n == 1));
    assert_eq!((o.retransmits, o.stray), (0, 0));
    assert_eq!(o.final_window, 16);
    assert!(o.max_in_flight <= 16);
}

#[test]
fn loss_duplication_and_reordering_complete_every_request_exactly_once() {
    for seed in [1, 2, 3, 0x5eed] {
        let o = simulate(2000, 16, 10, 10, seed);
        assert!(o.completed.iter().all(|&n| n == 1), "seed {seed}: {:?}", o.completed.iter().filter(|&&n| n != 1).count());
        assert_eq!(o.misdelivered, 0, "seed {seed}: a late or duplicate reply was taken for a newer request");
        assert!(o.retransmits > 0 && o.stray > 0, "seed {seed}: {o:?}");
        assert!(o.max_in_flight <= 16);
        assert!(o.min_window < 8, "losses must shrink the window: {o:?}");
        // Karn: only first sends are sampled, so the estimate stays within
        // the simulated one-way-and-back delay (0.1-3 ms each way).
        assert!(o.rtt_average < Duration::from_millis(6), "seed {seed}: {o:?}");
    }
}

#[test]
fn initiators_sharing_an_interface_never_share_tags() {
    let mut a = Tags::for_initiator(7);
    let mut b = Tags::for_initiator(8);
    let ta: std::collections::HashSet<u32> = (0..10_000).map(|i| a.next((i % 256) as u8)).collect();
    assert!((0..10_000).map(|i| b.next((i % 256) as u8)).all(|t| !ta.contains(&t)));
    let mut c = Tags::for_initiator(7);
    let (t1, t2) = (c.next(5), c.next(5));
    assert!(t1 != t2 && Tags::slot(t1) == 5 && Tags::slot(t2) == 5);
}
