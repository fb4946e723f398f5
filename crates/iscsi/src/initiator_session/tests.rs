use super::*;
use crate::pdu::Pdu;

fn params() -> SessionParams {
    SessionParams { max_send_data_segment_length: 512, max_recv_data_segment_length: 8192, ..SessionParams::default() }
}

/// A caller: an id to tell completions apart, and maybe a buffer.
#[derive(Debug)]
struct Caller {
    id: u32,
    buf: Option<Vec<u8>>,
}

impl Context for Caller {
    fn read_buf(&mut self) -> Option<&mut [u8]> {
        self.buf.as_deref_mut()
    }
}

type Session = InitiatorSession<Caller>;

fn session_with(p: SessionParams, cmd_sn: u32, max_cmd_sn: u32) -> Session {
    InitiatorSession::new(p, cmd_sn, max_cmd_sn, 100, Duration::from_secs(10))
}

fn session(cmd_sn: u32, max_cmd_sn: u32) -> Session {
    session_with(params(), cmd_sn, max_cmd_sn)
}

fn read(len: usize) -> Command<'static> {
    Command { lun: 0, cdb: [0x88; 16], read_len: len, write: Payload::None }
}

fn write(data: &[u8]) -> Command<'_> {
    Command { lun: 0, cdb: [0x8A; 16], read_len: 0, write: Payload::Borrowed(data) }
}

fn caller(id: u32) -> Caller {
    Caller { id, buf: None }
}

fn submit(s: &mut Session, c: Command<'_>, ctx: Caller) -> u32 {
    s.submit(c, ctx, Instant::now()).map_err(|(_, e)| e).unwrap().itt
}

/// Everything queued to send, as PDUs (large payloads included).
fn sent(s: &mut Session) -> Vec<(Message, Bytes)> {
    let (mut out, mut refs) = (Vec::new(), Vec::new());
    s.poll_transmit(&mut out, &mut refs);
    let mut wire = BytesMut::new();
    let mut at = 0;
    for (end, b) in refs {
        wire.extend_from_slice(&out[at..end]);
        wire.extend_from_slice(&b);
        at = end;
    }
    wire.extend_from_slice(&out[at..]);
    let mut dec = Decoder::new(1 << 24);
    dec.digests = s.digests();
    let mut v = Vec::new();
    while let Some(p) = dec.decode(&mut wire).expect("we send valid PDUs") {
        v.push((Message::decode(&p.bhs).expect("we send valid PDUs"), p.data));
    }
    assert!(wire.is_empty(), "a partial PDU queued");
    v
}

fn done(s: &mut Session) -> Vec<(Caller, Result<Completion, TaskError>)> {
    std::iter::from_fn(|| s.poll_completion()).collect()
}

fn pdu(m: Message, data: &[u8]) -> Pdu {
    Pdu::new(m.encode(), Bytes::copy_from_slice(data))
}

/// Feed whole PDUs; direct payloads are all in the buffer.
fn feed(s: &mut Session, pdus: &[Pdu]) -> Result<(), ConnectionError> {
    let mut buf = BytesMut::new();
    for p in pdus {
        buf.extend_from_slice(&p.encode(s.digests()));
    }
    loop {
        match s.receive(&mut buf)? {
            Received::NeedMore => break,
            Received::Pdu => {}
            Received::Direct(d) => assert!(d.is_done(), "the payload was all there"),
        }
    }
    assert!(buf.is_empty(), "{} bytes left", buf.len());
    Ok(())
}

fn response(itt: u32, stat_sn: u32, exp_cmd_sn: u32, max_cmd_sn: u32) -> Pdu {
    pdu(Message::ScsiResponse(ScsiResponse { itt, stat_sn, exp_cmd_sn, max_cmd_sn, ..Default::default() }), &[])
}

#[test]
fn commands_wait_for_the_cmdsn_window_and_leave_in_order() {
    // Window of one command: CmdSN 7, MaxCmdSN 7.
    let mut s = session(7, 7);
    let a = submit(&mut s, read(0), caller(1));
    let b = submit(&mut s, read(0), caller(2));
    let c = submit(&mut s, read(0), caller(3));
    let first = sent(&mut s);
    assert_eq!(first.len(), 1);
    let Message::ScsiCommand(cmd) = &first[0].0 else { panic!("{first:?}") };
    assert_eq!((cmd.itt, cmd.cmd_sn), (a, 7));
    // The answer opens the window by two: both waiting commands go, in order.
    feed(&mut s, &[response(a, 100, 8, 9)]).unwrap();
    let next = sent(&mut s);
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
    assert!(matches!(&done(&mut s)[..], [(Caller { id: 1, .. }, Ok(_))]));
}

/// A burst of commands is one run of bytes for one write, and each command
/// has a tag of its own (tags of finished commands are reused).
#[test]
fn a_burst_of_commands_leaves_in_one_send() {
    let mut s = session(1, 100);
    let itts: Vec<u32> = (0..32).map(|i| submit(&mut s, read(4096), caller(i))).collect();
    let (mut out, mut refs) = (Vec::new(), Vec::new());
    s.poll_transmit(&mut out, &mut refs);
    assert!(refs.is_empty());
    assert_eq!(out.len(), 32 * pdu::BHS_LEN);
    assert!(!s.has_transmit());
    let mut sorted = itts.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), 32);
    assert_eq!(s.outstanding(), 32);
    // The transport reads in large chunks only while no large read is in
    // flight (its payloads go straight to the callers' buffers).
    assert_eq!(s.large_reads(), 0);
    let big = submit(&mut s, read(LARGE_READ), Caller { id: 99, buf: Some(vec![0; LARGE_READ]) });
    assert_eq!(s.large_reads(), 1);
    sent(&mut s);
    feed(&mut s, &[response(big, 100, 2, 100)]).unwrap();
    assert_eq!(s.large_reads(), 0);
    submit(&mut s, read(LARGE_READ), caller(100));
    s.fail_all("gone");
    assert_eq!(s.large_reads(), 0);
}

#[test]
fn nonsense_window_is_ignored() {
    let mut s = session(7, 7);
    let a = submit(&mut s, read(0), caller(1));
    submit(&mut s, read(0), caller(2));
    sent(&mut s);
    // MaxCmdSN < ExpCmdSN - 1: must not open the window.
    feed(&mut s, &[response(a, 100, 20, 10)]).unwrap();
    assert!(sent(&mut s).is_empty());
}

fn data_in(itt: u32, offset: u32, data_sn: u32, status: bool) -> DataIn {
    DataIn { itt, buffer_offset: offset, data_sn, final_: status, has_status: status, stat_sn: 100, exp_cmd_sn: 2, max_cmd_sn: 11, ..Default::default() }
}

/// Data-In goes into the caller's buffer, also when its payload arrives in
/// pieces (read straight from the socket by the transport), and the
/// padding behind a payload is dropped from the stream.
#[test]
fn data_in_fills_the_callers_buffer() {
    let data: Vec<u8> = (0..1030u32).map(|i| (i % 251) as u8).collect();
    let mut s = session(1, 10);
    let itt = submit(&mut s, read(1030), Caller { id: 1, buf: Some(vec![0; 1030]) });
    sent(&mut s);
    // The first 512 bytes whole, then a 518-byte PDU (2 bytes of padding)
    // of which the header and 100 bytes are there.
    let first = pdu(Message::DataIn(data_in(itt, 0, 0, false)), &data[..512]).encode(Digests::default());
    let second = pdu(Message::DataIn(data_in(itt, 512, 1, true)), &data[512..]).encode(Digests::default());
    let mut buf = BytesMut::from(&first[..]);
    buf.extend_from_slice(&second[..pdu::BHS_LEN + 100]);
    assert!(matches!(s.receive(&mut buf).unwrap(), Received::Direct(d) if d.is_done()));
    let Received::Direct(mut d) = s.receive(&mut buf).unwrap() else { panic!() };
    assert!(buf.is_empty());
    assert_eq!(d.left(), 418);
    assert!(done(&mut s).is_empty());
    let rest = &second[pdu::BHS_LEN + 100..];
    let n = s.direct_fill(&mut d, |dst| {
        dst.copy_from_slice(&rest[..dst.len()]);
        Ok::<_, ()>(dst.len())
    });
    assert_eq!((n, d.is_done()), (Ok(418), true));
    // The padding comes next in the stream: dropped, with the PDU behind it.
    let mut buf = BytesMut::from(&rest[418..]);
    assert_eq!(s.next_header_len(), 2 + pdu::BHS_LEN);
    buf.extend_from_slice(&pdu(Message::NopIn(NopIn { ttt: RESERVED_TAG, itt: RESERVED_TAG, exp_cmd_sn: 2, max_cmd_sn: 11, ..Default::default() }), &[]).encode(Digests::default()));
    assert!(matches!(s.receive(&mut buf).unwrap(), Received::Pdu));
    assert!(buf.is_empty());
    match &done(&mut s)[..] {
        [(c, Ok(r))] => {
            assert_eq!(c.buf.as_deref(), Some(&data[..]));
            assert_eq!((r.status, r.received, r.data.len()), (0, 1030, 0));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(s.outstanding(), 0);
}

/// Data-In must continue where the last ended and stay within the read:
/// a gap, a repeat or an overrun ends the connection (a caller's buffer
/// is never left with holes).
#[test]
fn data_in_out_of_order_or_past_the_read_ends_the_connection() {
    for (offset, len, why) in [(512u32, 256usize, "gap"), (0, 1024, "past the read"), (256, 600, "past the read, later")] {
        for with_buf in [true, false] {
            let mut s = session(1, 10);
            let itt = submit(&mut s, read(768), Caller { id: 1, buf: with_buf.then(|| vec![0; 768]) });
            sent(&mut s);
            let mut pdus = vec![pdu(Message::DataIn(data_in(itt, 0, 0, false)), &[1; 256])];
            pdus.push(pdu(Message::DataIn(data_in(itt, offset, 1, false)), &vec![2; len]));
            assert!(feed(&mut s, &pdus).is_err(), "{why}");
            assert!(matches!(&done(&mut s)[..], [(_, Err(TaskError::Disconnected(_)))]), "{why}");
            assert!(s.dead().is_some());
        }
    }
}

/// GOOD with less Data-In than the caller's buffer is an error, not a
/// buffer half old; a command without a buffer gets its data padded.
#[test]
fn short_data_in() {
    let mut s = session(1, 10);
    let a = submit(&mut s, read(1024), Caller { id: 1, buf: Some(vec![7; 1024]) });
    let b = submit(&mut s, read(96), caller(2));
    sent(&mut s);
    feed(&mut s, &[pdu(Message::DataIn(data_in(a, 0, 0, true)), &[1; 512]), pdu(Message::DataIn(data_in(b, 0, 0, true)), &[3; 36])]).unwrap();
    match &done(&mut s)[..] {
        [(_, Err(TaskError::ShortData { got: 512, want: 1024 })), (_, Ok(c))] => {
            assert_eq!(c.received, 36);
            assert_eq!(c.data.len(), 96);
            assert!(c.data[..36].iter().all(|&x| x == 3) && c.data[36..].iter().all(|&x| x == 0));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn r2t_is_answered_with_data_out_of_the_asked_range() {
    // No immediate or unsolicited data: everything goes on R2T.
    let p = SessionParams { immediate_data: false, initial_r2t: true, ..params() };
    let mut s = session_with(p, 1, 10);
    let data: Vec<u8> = (0..2048u32).map(|i| (i * 7) as u8).collect();
    let itt = submit(&mut s, write(&data), caller(1));
    let cmd = sent(&mut s);
    let Message::ScsiCommand(c) = &cmd[0].0 else { panic!() };
    assert!(c.final_ && c.write && cmd[0].1.is_empty() && cmd.len() == 1);
    let r2t = R2t { itt, ttt: 0x55, buffer_offset: 512, desired_length: 1024, exp_cmd_sn: 2, max_cmd_sn: 11, ..Default::default() };
    feed(&mut s, &[pdu(Message::R2t(r2t), &[])]).unwrap();
    let outs = sent(&mut s);
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
    assert!(feed(&mut s, &[pdu(Message::R2t(bad), &[])]).is_err());
}

#[test]
fn immediate_and_unsolicited_data_up_to_first_burst() {
    let p = SessionParams { immediate_data: true, initial_r2t: false, first_burst_length: 1536, ..params() };
    let mut s = session_with(p, 1, 10);
    let data: Vec<u8> = (0..4096u32).map(|i| (i % 253) as u8).collect();
    let itt = submit(&mut s, write(&data), caller(1));
    let pdus = sent(&mut s);
    // Command with 512 immediate bytes (segment limit), then Data-Out to 1536.
    let Message::ScsiCommand(c) = &pdus[0].0 else { panic!() };
    assert!(!c.final_);
    assert_eq!(&pdus[0].1[..], &data[..512]);
    let offs: Vec<(u32, u32, bool)> = pdus[1..]
        .iter()
        .map(|(m, d)| match m {
            Message::DataOut(o) => {
                assert_eq!(&d[..], &data[o.buffer_offset as usize..][..d.len()]);
                (o.buffer_offset, o.data_sn, o.final_)
            }
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(offs, vec![(512, 0, false), (1024, 1, true)]);
    // The rest is asked for: only what was not sent may be.
    let r2t = R2t { itt, ttt: 9, buffer_offset: 1536, desired_length: 2560, exp_cmd_sn: 2, max_cmd_sn: 11, ..Default::default() };
    feed(&mut s, &[pdu(Message::R2t(r2t), &[])]).unwrap();
    let outs = sent(&mut s);
    assert_eq!(outs.iter().map(|(_, d)| d.len()).sum::<usize>(), 2560);
    assert_eq!(&outs[0].1[..], &data[1536..2048]);
    let again = R2t { itt, ttt: 10, buffer_offset: 1024, desired_length: 512, ..Default::default() };
    assert!(feed(&mut s, &[pdu(Message::R2t(again), &[])]).is_err(), "bytes already sent unsolicited");
}

/// A 4 KiB write with ImmediateData=Yes is one PDU (no R2T round trip);
/// payloads the caller handed over leave from where they are, 4 KiB ones
/// (a burst of them handed over in one call) as large ones.
#[test]
fn small_writes_are_one_pdu_and_owned_data_is_not_copied() {
    let p = SessionParams { immediate_data: true, initial_r2t: false, first_burst_length: 256 << 10, max_send_data_segment_length: 256 << 10, ..params() };
    let mut s = session_with(p, 1, 10);
    submit(&mut s, write(&[5u8; 4096]), caller(1));
    let pdus = sent(&mut s);
    assert_eq!(pdus.len(), 1);
    assert!(matches!(&pdus[0].0, Message::ScsiCommand(c) if c.final_ && c.edtl == 4096));
    // Two 4 KiB writes handed over: each BHS in the send buffer, each
    // payload by reference right after its own.
    let small: Vec<Bytes> = (0..2u8).map(|i| Bytes::from(vec![i; 4096])).collect();
    for (i, b) in small.iter().enumerate() {
        submit(&mut s, Command { lun: 0, cdb: [0x8A; 16], read_len: 0, write: Payload::Owned(b.clone()) }, caller(10 + i as u32));
    }
    let (mut out, mut refs) = (Vec::new(), Vec::new());
    s.poll_transmit(&mut out, &mut refs);
    assert_eq!(out.len(), 2 * pdu::BHS_LEN, "the 4 KiB payloads were copied into the send buffer");
    assert_eq!(refs.iter().map(|(at, b)| (*at, b.as_ptr())).collect::<Vec<_>>(), [(pdu::BHS_LEN, small[0].as_ptr()), (2 * pdu::BHS_LEN, small[1].as_ptr())]);
    assert!(!s.has_transmit());
    let big = Bytes::from(vec![6u8; 1 << 20]);
    let itt = submit(&mut s, Command { lun: 0, cdb: [0x8A; 16], read_len: 0, write: Payload::Owned(big.clone()) }, caller(2));
    let (mut out, mut refs) = (Vec::new(), Vec::new());
    s.poll_transmit(&mut out, &mut refs);
    let [(at, seg)] = &refs[..] else { panic!("the immediate data is handed over: {refs:?}") };
    assert_eq!(seg.as_ptr(), big.as_ptr(), "not copied");
    assert_eq!((*at, out.len(), seg.len()), (pdu::BHS_LEN, pdu::BHS_LEN, 256 << 10));
    let r2t = R2t { itt, ttt: 3, buffer_offset: 256 << 10, desired_length: 768 << 10, exp_cmd_sn: 4, max_cmd_sn: 13, ..Default::default() };
    feed(&mut s, &[pdu(Message::R2t(r2t), &[])]).unwrap();
    let (mut out, mut refs) = (Vec::new(), Vec::new());
    s.poll_transmit(&mut out, &mut refs);
    assert_eq!(refs.first().expect("Data-Out handed over").1.as_ptr(), big[256 << 10..].as_ptr());
}

#[test]
fn nop_in_ping_is_answered_with_its_ttt() {
    let mut s = session(3, 10);
    feed(&mut s, &[pdu(Message::NopIn(NopIn { ttt: 0x1234, lun: 0, itt: RESERVED_TAG, exp_cmd_sn: 3, max_cmd_sn: 10, ..Default::default() }), &[])]).unwrap();
    let reply = sent(&mut s);
    let Message::NopOut(o) = &reply[0].0 else { panic!("{reply:?}") };
    assert_eq!((o.ttt, o.itt, o.cmd_sn), (0x1234, RESERVED_TAG, 3));
    // A NOP-In that is not a ping (reserved TTT) gets no answer.
    feed(&mut s, &[pdu(Message::NopIn(NopIn { ttt: RESERVED_TAG, itt: RESERVED_TAG, exp_cmd_sn: 3, max_cmd_sn: 10, ..Default::default() }), &[])]).unwrap();
    assert!(sent(&mut s).is_empty());
}

#[test]
fn timeouts_complete_once_and_keep_the_itt_reserved() {
    let mut s = session(1, 1);
    let t0 = Instant::now();
    let a = s.submit(read(0), caller(1), t0).map_err(|(_, e)| e).unwrap().itt;
    s.submit(read(0), caller(2), t0 + Duration::from_secs(1)).map_err(|(_, e)| e).unwrap();
    sent(&mut s);
    assert_eq!(s.poll_timeout(), Some(t0 + Duration::from_secs(10)));
    s.handle_timeout(t0 + Duration::from_secs(9));
    assert!(done(&mut s).is_empty());
    s.handle_timeout(t0 + Duration::from_secs(10));
    assert!(matches!(&done(&mut s)[..], [(Caller { id: 1, .. }, Err(TaskError::Timeout))]));
    s.handle_timeout(t0 + Duration::from_secs(11));
    // b never left (window of one): it fails as such and is forgotten.
    assert!(matches!(&done(&mut s)[..], [(Caller { id: 2, .. }, Err(TaskError::WindowClosed))]));
    assert_eq!(s.poll_timeout(), None);
    // a's ITT stays taken until the target answers.
    let c = submit(&mut s, read(0), caller(3));
    assert_ne!(c, a);
    // The late answer completes nothing (a was reported), and opens the window for c.
    feed(&mut s, &[response(a, 100, 2, 2)]).unwrap();
    assert!(done(&mut s).is_empty());
    assert_eq!(sent(&mut s).len(), 1);
}

/// A caller that gives up never has its buffer written again: the data of
/// its command is read and dropped, its ITT kept until the answer.
#[test]
fn a_cancelled_read_writes_nothing_more() {
    let mut s = session(1, 10);
    let t = s.submit(read(1024), Caller { id: 1, buf: Some(vec![0; 1024]) }, Instant::now()).map_err(|(_, e)| e).unwrap();
    sent(&mut s);
    let first = pdu(Message::DataIn(data_in(t.itt, 0, 0, false)), &[1; 512]).encode(Digests::default());
    let mut buf = BytesMut::from(&first[..pdu::BHS_LEN + 100]);
    let Received::Direct(mut d) = s.receive(&mut buf).unwrap() else { panic!() };
    s.cancel(t);
    let n = s.direct_fill(&mut d, |dst| {
        assert!(dst.len() <= 64 * 1024, "scratch, not the buffer");
        Ok::<_, ()>(412)
    });
    assert_eq!(n, Ok(412));
    let other = submit(&mut s, read(0), caller(2));
    assert_ne!(other & 0xFFFF, t.itt & 0xFFFF, "the slot is still taken");
    feed(&mut s, &[pdu(Message::DataIn(data_in(t.itt, 512, 1, true)), &[2; 512])]).unwrap();
    assert!(done(&mut s).is_empty(), "nothing to report for a cancelled command");
    assert_eq!(s.outstanding(), 1);
    // Given up on before it was sent: forgotten at once.
    let mut s = session(1, 0);
    let t = s.submit(read(0), caller(3), Instant::now()).map_err(|(_, e)| e).unwrap();
    s.cancel(t);
    feed(&mut s, &[response(RESERVED_TAG - 5, 100, 1, 5)]).unwrap();
    assert!(sent(&mut s).is_empty(), "a cancelled command left when the window opened");
}

#[test]
fn reject_fails_the_command_and_service_response_is_an_error() {
    let mut s = session(1, 10);
    let a = submit(&mut s, read(0), caller(1));
    let b = submit(&mut s, read(0), caller(2));
    let cmds = sent(&mut s);
    // The rejected header rides in the data segment.
    let Message::ScsiCommand(c) = &cmds[0].0 else { panic!() };
    assert_eq!(c.itt, a);
    let hdr = Message::ScsiCommand(c.clone()).encode();
    feed(&mut s, &[pdu(Message::Reject(Reject { reason: 0x04, ..Default::default() }), &hdr.0[..])]).unwrap();
    assert!(matches!(&done(&mut s)[..], [(Caller { id: 1, .. }, Err(TaskError::Rejected(4)))]));
    let r = ScsiResponse { itt: b, response: 1, stat_sn: 100, exp_cmd_sn: 3, max_cmd_sn: 10, ..Default::default() };
    feed(&mut s, &[pdu(Message::ScsiResponse(r), &[])]).unwrap();
    assert!(matches!(&done(&mut s)[..], [(Caller { id: 2, .. }, Err(TaskError::ServiceResponse(1)))]));
}

#[test]
fn sense_data_and_fail_all() {
    let mut s = session(1, 10);
    let a = submit(&mut s, read(0), caller(1));
    submit(&mut s, read(0), caller(2));
    sent(&mut s);
    let r = ScsiResponse { itt: a, status: 2, stat_sn: 100, exp_cmd_sn: 3, max_cmd_sn: 10, ..Default::default() };
    feed(&mut s, &[pdu(Message::ScsiResponse(r), &[0, 3, 0x70, 0, 6, 0xEE])]).unwrap();
    match &done(&mut s)[..] {
        [(_, Ok(c))] => assert_eq!((c.status, &c.sense[..]), (2, &[0x70, 0, 6][..])),
        other => panic!("{other:?}"),
    }
    s.fail_all("gone");
    assert!(matches!(&done(&mut s)[..], [(Caller { id: 2, .. }, Err(TaskError::Disconnected(_)))]));
    assert!(s.submit(read(0), caller(3), Instant::now()).is_err());
}

/// With digests, Data-In is checked whole (the data digest needs all of
/// it) and still lands in the caller's buffer.
#[test]
fn data_in_with_digests() {
    let p = SessionParams { header_digest: true, data_digest: true, ..params() };
    let mut s = session_with(p, 1, 10);
    let itt = submit(&mut s, read(6), Caller { id: 1, buf: Some(vec![0; 6]) });
    assert_eq!(sent(&mut s).len(), 1);
    feed(&mut s, &[pdu(Message::DataIn(data_in(itt, 0, 0, true)), b"abcdef")]).unwrap();
    match &done(&mut s)[..] {
        [(c, Ok(_))] => assert_eq!(c.buf.as_deref(), Some(&b"abcdef"[..])),
        other => panic!("{other:?}"),
    }
}

/// A planned read: the reads in flight in the order they were sent, each
/// taken when its header is the Data-In expected (its payload already in
/// place, whole or in part), refused, with nothing taken, when it is not.
#[test]
fn planned_reads_are_taken_only_when_the_target_answers_in_turn() {
    let mut s = session(1, 10);
    let a = submit(&mut s, read(1024), Caller { id: 1, buf: Some(vec![0; 1024]) });
    let b = submit(&mut s, read(1024), Caller { id: 2, buf: Some(vec![0; 1024]) });
    let c = submit(&mut s, read(1024), Caller { id: 3, buf: Some(vec![0; 1024]) });
    // No buffer of its own: ends the plan.
    submit(&mut s, read(1024), caller(4));
    sent(&mut s);
    let mut lens = Vec::new();
    assert_eq!(s.plan_placed(|b| {
        lens.push(b.len());
        true
    }), 3);
    assert_eq!(lens, [1024; 3]);
    let head = |itt: u32| pdu(Message::DataIn(data_in(itt, 0, 0, true)), &[0; 1024]).encode(Digests::default())[..pdu::BHS_LEN].to_vec();
    // a: whole; then c where b was expected: refused, nothing taken.
    assert!(s.receive_placed(0, &head(a), 1024).is_some_and(|d| d.is_done()));
    assert!(s.receive_placed(1, &head(c), 1024).is_none());
    assert_eq!(s.outstanding(), 3);
    // b in turn, with 100 bytes of its payload there: the rest to fill.
    let mut d = s.receive_placed(1, &head(b), 100).expect("b was expected");
    assert_eq!(d.left(), 924);
    let _ = s.direct_fill(&mut d, |dst| Ok::<_, ()>(dst.len()));
    let ids: Vec<u32> = done(&mut s).into_iter().map(|(c, r)| {
        assert_eq!(r.unwrap().received, 1024);
        c.id
    }).collect();
    assert_eq!(ids, [1, 2]);
    assert_eq!(s.staged_bytes(), 0);
    // The next plan starts at c (a and b answered); a caller's refusal ends it.
    assert_eq!(s.plan_placed(|_| false), 0);
    assert_eq!(s.plan_placed(|_| true), 1);
    // A header for c of another length, or not a Data-In: refused.
    let short = pdu(Message::DataIn(data_in(c, 0, 0, true)), &[0; 512]).encode(Digests::default());
    assert!(s.receive_placed(0, &short[..pdu::BHS_LEN], 0).is_none());
    assert!(s.receive_placed(0, &response(c, 100, 2, 11).encode(Digests::default())[..pdu::BHS_LEN], 0).is_none());
    // Nothing planned with digests on.
    let mut d = session_with(SessionParams { header_digest: true, ..params() }, 1, 10);
    submit(&mut d, read(1024), Caller { id: 5, buf: Some(vec![0; 1024]) });
    assert_eq!(d.plan_placed(|_| true), 0);
}

/// The command header written field by field is the generic encoding's,
/// byte for byte, for every flag, a spread of values in every field and
/// data lengths up to the 24-bit limit; and a session with header digests
/// sends it with the same digest `encode_head_into` gives.
#[test]
fn the_command_header_is_the_generic_encodings() {
    let mut n = 0u64;
    let mut next = || {
        // xorshift: repeatable values that set high and low bits.
        n = n.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        n ^ (n >> 29)
    };
    for flags in 0..16u8 {
        for attr in 0..8u8 {
            for _ in 0..8 {
                let mut cdb = [0u8; 16];
                cdb.iter_mut().for_each(|b| *b = next() as u8);
                let c = ScsiCommand {
                    immediate: flags & 1 != 0,
                    final_: flags & 2 != 0,
                    read: flags & 4 != 0,
                    write: flags & 8 != 0,
                    attr,
                    lun: next(),
                    itt: next() as u32,
                    edtl: next() as u32,
                    cmd_sn: next() as u32,
                    exp_stat_sn: next() as u32,
                    cdb,
                };
                for len in [0usize, 1, 4096, (next() as usize) & 0xFF_FFFF, pdu::MAX_DATA_SEGMENT] {
                    let mut want = Vec::new();
                    pdu::encode_head_into(&Message::ScsiCommand(c.clone()).encode(), len, Digests::default(), &mut want);
                    assert_eq!(&scsi_command_bhs(&c, len)[..], &want[..], "{c:?} len {len}");
                }
            }
        }
    }
    // With header digests: the same bytes on the wire as the generic path.
    let p = SessionParams { header_digest: true, data_digest: true, ..params() };
    let mut s = session_with(p, 7, 100);
    let itt = submit(&mut s, write(&[5u8; 300]), caller(1));
    let (mut out, mut refs) = (Vec::new(), Vec::new());
    s.poll_transmit(&mut out, &mut refs);
    assert!(refs.is_empty());
    let c = ScsiCommand { immediate: false, final_: true, read: false, write: true, attr: 1, lun: 0, itt, edtl: 300, cmd_sn: 7, exp_stat_sn: 100, cdb: [0x8A; 16] };
    let mut want = Vec::new();
    pdu::encode_into(&Message::ScsiCommand(c).encode(), &[5u8; 300], s.digests(), &mut want);
    assert_eq!(out, want);
}

/// What `receive_placed` took from a piece's header through the generic
/// decoding before `placed_data_in`.
fn placed_by_generic_decoding(header: &[u8], itt: u32, len: usize) -> Option<PlacedDataIn> {
    let mut bhs = Bhs::default();
    bhs.0.copy_from_slice(header.get(..pdu::BHS_LEN)?);
    if bhs.opcode_raw() != Opcode::DataIn as u8 || bhs.total_ahs_len() != 0 || bhs.data_segment_len() != len {
        return None;
    }
    let d = DataIn::from_bhs(&bhs);
    if d.itt != itt || d.buffer_offset != 0 {
        return None;
    }
    let status = d.has_status.then_some(DataInStatus { status: d.status, stat_sn: d.stat_sn });
    Some(PlacedDataIn { exp_cmd_sn: d.exp_cmd_sn, max_cmd_sn: d.max_cmd_sn, status })
}

/// The fixed-field reading of a planned piece's header gives the generic
/// decoding's answer for the Data-In a plan expects (with and without
/// status) and for every one-byte change of it (each byte 0, 0xFF, each
/// bit flipped), other tasks and other lengths.
#[test]
fn a_planned_data_in_is_read_as_the_generic_decoding_reads_it() {
    let mut seen = [0usize; 2];
    for &(itt, len) in &[(0u32, 1usize), (0x0001_0002, 512), (0xABCD_0007, 4096), (0xFFFF_FFFE, 0xFF_FFFF)] {
        for status in [false, true] {
            let mut d = data_in(itt, 0, 3, status);
            d.exp_cmd_sn = 0x1122_3344;
            d.max_cmd_sn = 0x5566_7788;
            d.stat_sn = 0x99AA_BBCC;
            d.status = if status { 2 } else { 0 };
            let mut good = Message::DataIn(d).encode().0;
            good[5..8].copy_from_slice(&(len as u32).to_be_bytes()[1..]);
            let mut hs = vec![good];
            for i in 0..pdu::BHS_LEN {
                for v in [0u8, 0xFF] {
                    let mut h = good;
                    h[i] = v;
                    hs.push(h);
                }
                for bit in 0..8 {
                    let mut h = good;
                    h[i] ^= 1 << bit;
                    hs.push(h);
                }
            }
            for h in &hs {
                for (t, l) in [(itt, len), (itt ^ 0x10000, len), (itt, len + 1), (itt, len.saturating_sub(1))] {
                    let want = placed_by_generic_decoding(h, t, l);
                    assert_eq!(placed_data_in(h, t, l), want, "{h:02x?} itt {t:#x} len {l}");
                    seen[want.is_some() as usize] += 1;
                }
            }
            let p = placed_data_in(&good, itt, len).expect("the expected Data-In");
            assert_eq!(p.status.is_some(), status);
        }
    }
    assert!(seen[0] > 1000 && seen[1] > 20, "{seen:?}");
}
