use super::*;

fn params() -> SessionParams {
    SessionParams { max_send_data_segment_length: 512, ..SessionParams::default() }
}

fn session(cmd_sn: u32, max_cmd_sn: u32) -> InitiatorSession {
    InitiatorSession::new(params(), cmd_sn, max_cmd_sn, 100, Duration::from_secs(10))
}

fn read(len: usize) -> Command {
    Command { lun: 0, cdb: [0x88; 16], read_len: len, write: Bytes::new() }
}

fn write(data: &[u8]) -> Command {
    Command { lun: 0, cdb: [0x8A; 16], read_len: 0, write: Bytes::copy_from_slice(data) }
}

fn sent(out: &mut Vec<Action>) -> Vec<(Message, Bytes)> {
    let mut v = Vec::new();
    out.retain(|a| match a {
        Action::Send(p) => {
            v.push((Message::decode(&p.bhs).expect("we send valid PDUs"), p.data.clone()));
            false
        }
        _ => true,
    });
    v
}

fn pdu(m: Message, data: &[u8]) -> Pdu {
    Pdu::new(m.encode(), Bytes::copy_from_slice(data))
}

fn response(itt: u32, stat_sn: u32, exp_cmd_sn: u32, max_cmd_sn: u32) -> Pdu {
    pdu(Message::ScsiResponse(ScsiResponse { itt, stat_sn, exp_cmd_sn, max_cmd_sn, ..Default::default() }), &[])
}

#[test]
fn commands_wait_for_the_cmdsn_window_and_leave_in_order() {
    // Window of one command: CmdSN 7, MaxCmdSN 7.
    let mut s = session(7, 7);
    let now = Instant::now();
    let mut out = Vec::new();
    let a = s.submit(read(0), now, &mut out).unwrap();
    let b = s.submit(read(0), now, &mut out).unwrap();
    let c = s.submit(read(0), now, &mut out).unwrap();
    let first = sent(&mut out);
    assert_eq!(first.len(), 1);
    let Message::ScsiCommand(cmd) = &first[0].0 else { panic!("{first:?}") };
    assert_eq!((cmd.itt, cmd.cmd_sn), (a, 7));
    // The answer opens the window by two: both waiting commands go, in order.
    s.on_pdu(response(a, 100, 8, 9), &mut out).unwrap();
    let next = sent(&mut out);
    let sns: Vec<(u32, u32)> = next
        .iter()
        .map(|(m, _)| match m {
            Message::ScsiCommand(c) => (c.itt, c.cmd_sn),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(sns, vec![(b, 8), (c, 9)]);
    // ExpStatSN follows the target's StatSN.
    let Message::ScsiCommand(cmd) = &next[0].0 else { unreachable!() };
    assert_eq!(cmd.exp_stat_sn, 101);
    assert!(matches!(&out[..], [Action::Complete { itt, result: Ok(_) }] if *itt == a));
}

#[test]
fn nonsense_window_is_ignored() {
    let mut s = session(7, 7);
    let now = Instant::now();
    let mut out = Vec::new();
    let a = s.submit(read(0), now, &mut out).unwrap();
    s.submit(read(0), now, &mut out).unwrap();
    sent(&mut out);
    // MaxCmdSN < ExpCmdSN - 1: must not open the window.
    s.on_pdu(response(a, 100, 20, 10), &mut out).unwrap();
    assert!(sent(&mut out).is_empty());
}

#[test]
fn data_in_is_reassembled_in_any_order() {
    let mut s = session(1, 10);
    let now = Instant::now();
    let mut out = Vec::new();
    let itt = s.submit(read(1024), now, &mut out).unwrap();
    sent(&mut out);
    let data: Vec<u8> = (0..1024u32).map(|i| (i % 251) as u8).collect();
    let second = DataIn { itt, buffer_offset: 512, data_sn: 1, exp_cmd_sn: 2, max_cmd_sn: 11, ..Default::default() };
    let first = DataIn { itt, buffer_offset: 0, data_sn: 0, final_: true, has_status: true, stat_sn: 100, exp_cmd_sn: 2, max_cmd_sn: 11, ..Default::default() };
    s.on_pdu(pdu(Message::DataIn(second), &data[512..]), &mut out).unwrap();
    assert!(out.is_empty());
    s.on_pdu(pdu(Message::DataIn(first), &data[..512]), &mut out).unwrap();
    match &out[..] {
        [Action::Complete { itt: i, result: Ok(c) }] => {
            assert_eq!(*i, itt);
            assert_eq!(c.status, 0);
            assert_eq!(c.data, data);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(s.outstanding(), 0);
}

#[test]
fn data_in_past_the_buffer_ends_the_connection() {
    let mut s = session(1, 10);
    let mut out = Vec::new();
    let itt = s.submit(read(512), Instant::now(), &mut out).unwrap();
    let d = DataIn { itt, buffer_offset: 256, ..Default::default() };
    assert!(s.on_pdu(pdu(Message::DataIn(d), &[0u8; 512]), &mut out).is_err());
}

#[test]
fn r2t_is_answered_with_data_out_of_the_asked_range() {
    // No immediate or unsolicited data: everything goes on R2T.
    let p = SessionParams { immediate_data: false, initial_r2t: true, ..params() };
    let mut s = InitiatorSession::new(p, 1, 10, 100, Duration::from_secs(10));
    let mut out = Vec::new();
    let data: Vec<u8> = (0..2048u32).map(|i| (i * 7) as u8).collect();
    let itt = s.submit(write(&data), Instant::now(), &mut out).unwrap();
    let cmd = sent(&mut out);
    let Message::ScsiCommand(c) = &cmd[0].0 else { panic!() };
    assert!(c.final_ && c.write && cmd[0].1.is_empty() && cmd.len() == 1);
    let r2t = R2t { itt, ttt: 0x55, buffer_offset: 512, desired_length: 1024, exp_cmd_sn: 2, max_cmd_sn: 11, ..Default::default() };
    s.on_pdu(pdu(Message::R2t(r2t), &[]), &mut out).unwrap();
    let outs = sent(&mut out);
    // 1024 bytes in MaxSendDataSegmentLength (512) pieces, TTT echoed, F on the last.
    assert_eq!(outs.len(), 2);
    for (i, (m, d)) in outs.iter().enumerate() {
        let Message::DataOut(o) = m else { panic!("{m:?}") };
        let off = 512 + 512 * i;
        assert_eq!((o.itt, o.ttt, o.data_sn, o.buffer_offset as usize, o.final_), (itt, 0x55, i as u32, off, i == 1));
        assert_eq!(&d[..], &data[off..off + 512]);
    }
    // An R2T past the end of the write is a protocol violation.
    let bad = R2t { itt, ttt: 0x56, buffer_offset: 1536, desired_length: 1024, ..Default::default() };
    assert!(s.on_pdu(pdu(Message::R2t(bad), &[]), &mut out).is_err());
}

#[test]
fn immediate_and_unsolicited_data_up_to_first_burst() {
    let p = SessionParams { immediate_data: true, initial_r2t: false, first_burst_length: 1536, ..params() };
    let mut s = InitiatorSession::new(p, 1, 10, 100, Duration::from_secs(10));
    let mut out = Vec::new();
    s.submit(write(&[9u8; 4096]), Instant::now(), &mut out).unwrap();
    let pdus = sent(&mut out);
    // Command with 512 immediate bytes (segment limit), then Data-Out to 1536.
    let Message::ScsiCommand(c) = &pdus[0].0 else { panic!() };
    assert!(!c.final_);
    assert_eq!(pdus[0].1.len(), 512);
    let offs: Vec<u32> = pdus[1..]
        .iter()
        .map(|(m, _)| match m {
            Message::DataOut(o) => o.buffer_offset,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(offs, vec![512, 1024]);
}

#[test]
fn nop_in_ping_is_answered_with_its_ttt() {
    let mut s = session(3, 10);
    let mut out = Vec::new();
    s.on_pdu(pdu(Message::NopIn(NopIn { ttt: 0x1234, lun: 0, itt: RESERVED_TAG, exp_cmd_sn: 3, max_cmd_sn: 10, ..Default::default() }), &[]), &mut out).unwrap();
    let reply = sent(&mut out);
    let Message::NopOut(o) = &reply[0].0 else { panic!("{reply:?}") };
    assert_eq!((o.ttt, o.itt, o.cmd_sn), (0x1234, RESERVED_TAG, 3));
    // A NOP-In that is not a ping (reserved TTT) gets no answer.
    s.on_pdu(pdu(Message::NopIn(NopIn { ttt: RESERVED_TAG, itt: RESERVED_TAG, exp_cmd_sn: 3, max_cmd_sn: 10, ..Default::default() }), &[]), &mut out).unwrap();
    assert!(out.is_empty());
}

#[test]
fn timeouts_complete_once_and_keep_the_itt_reserved() {
    let mut s = session(1, 1);
    let t0 = Instant::now();
    let mut out = Vec::new();
    let a = s.submit(read(0), t0, &mut out).unwrap();
    let b = s.submit(read(0), t0 + Duration::from_secs(1), &mut out).unwrap();
    sent(&mut out);
    assert_eq!(s.next_deadline(), Some(t0 + Duration::from_secs(10)));
    s.on_timer(t0 + Duration::from_secs(9), &mut out);
    assert!(out.is_empty());
    s.on_timer(t0 + Duration::from_secs(10), &mut out);
    assert!(matches!(&out[..], [Action::Complete { itt, result: Err(TaskError::Timeout) }] if *itt == a));
    out.clear();
    s.on_timer(t0 + Duration::from_secs(11), &mut out);
    // b never left (window of one): it fails as such and is forgotten.
    assert!(matches!(&out[..], [Action::Complete { itt, result: Err(TaskError::WindowClosed) }] if *itt == b));
    out.clear();
    // a's ITT stays taken until the target answers.
    let c = s.submit(read(0), t0, &mut out).unwrap();
    assert_ne!(c, a);
    // The late answer completes nothing (a was reported), and opens the window for c.
    s.on_pdu(response(a, 100, 2, 2), &mut out).unwrap();
    assert!(!out.iter().any(|x| matches!(x, Action::Complete { .. })));
    assert_eq!(sent(&mut out).len(), 1);
}

#[test]
fn reject_fails_the_command_and_service_response_is_an_error() {
    let mut s = session(1, 10);
    let mut out = Vec::new();
    let a = s.submit(read(0), Instant::now(), &mut out).unwrap();
    let b = s.submit(read(0), Instant::now(), &mut out).unwrap();
    let cmds = sent(&mut out);
    // The rejected header rides in the data segment.
    let Message::ScsiCommand(c) = &cmds[0].0 else { panic!() };
    let hdr = Message::ScsiCommand(c.clone()).encode();
    s.on_pdu(pdu(Message::Reject(Reject { reason: 0x04, ..Default::default() }), &hdr.0[..]), &mut out).unwrap();
    assert!(matches!(&out[..], [Action::Complete { itt, result: Err(TaskError::Rejected(4)) }] if *itt == a));
    out.clear();
    let r = ScsiResponse { itt: b, response: 1, stat_sn: 100, exp_cmd_sn: 3, max_cmd_sn: 10, ..Default::default() };
    s.on_pdu(pdu(Message::ScsiResponse(r), &[]), &mut out).unwrap();
    assert!(matches!(&out[..], [Action::Complete { itt, result: Err(TaskError::ServiceResponse(1)) }] if *itt == b));
}

#[test]
fn sense_data_and_fail_all() {
    let mut s = session(1, 10);
    let mut out = Vec::new();
    let a = s.submit(read(0), Instant::now(), &mut out).unwrap();
    let b = s.submit(read(0), Instant::now(), &mut out).unwrap();
    sent(&mut out);
    let r = ScsiResponse { itt: a, status: 2, stat_sn: 100, exp_cmd_sn: 3, max_cmd_sn: 10, ..Default::default() };
    s.on_pdu(pdu(Message::ScsiResponse(r), &[0, 3, 0x70, 0, 6, 0xEE]), &mut out).unwrap();
    match &out[..] {
        [Action::Complete { result: Ok(c), .. }] => assert_eq!((c.status, &c.sense[..]), (2, &[0x70, 0, 6][..])),
        other => panic!("{other:?}"),
    }
    out.clear();
    s.fail_all("gone", &mut out);
    assert!(matches!(&out[..], [Action::Complete { itt, result: Err(TaskError::Disconnected(_)) }] if *itt == b));
    assert!(s.submit(read(0), Instant::now(), &mut out).is_err());
}
