//! ONC RPC (RFC 5531) over one TCP connection with many calls in flight:
//! calls are matched to replies by XID, so a caller waits only for its own
//! reply. Record marking (RFC 5531 section 11) is read here; the message
//! bodies are `nfs3_types`' XDR definitions.

use crate::error::{Error, Result};
use nfs3_types::rpc::{accept_stat_data, call_body, msg_body, opaque_auth, reply_body, rpc_msg, RPC_VERSION_2};
use nfs3_types::xdr_codec::{Pack, Unpack};
use std::collections::HashMap;
use std::io::Cursor;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::{mpsc, oneshot};

/// Largest record we accept from a server: a READ reply of the largest
/// transfer size servers offer (1 MiB) plus headers, with room to spare.
const MAX_RECORD: usize = 4 << 20;
/// The last-fragment bit of a record mark.
const LAST_FRAGMENT: u32 = 0x8000_0000;
/// Frames the writer joins into one send while more are queued.
const COALESCE_BYTES: usize = 256 << 10;

type Waiters = Arc<Mutex<Option<HashMap<u32, oneshot::Sender<Result<Vec<u8>>>>>>>;

/// One RPC connection. Cheap to share (`Arc`); it stays usable until the
/// server closes it or an I/O error ends it ([`RpcConn::is_closed`]).
pub struct RpcConn {
    frames: mpsc::UnboundedSender<Vec<u8>>,
    /// Calls waiting for their reply, by XID; None once the connection ended.
    waiters: Waiters,
    xid: AtomicU32,
    closed: Arc<AtomicBool>,
    cred: opaque_auth<'static>,
    peer: SocketAddr,
}

impl RpcConn {
    /// Connect to `addr` within `timeout`. As root, the local port is a
    /// reserved one (below 1024): servers that trust only root clients
    /// (Linux nfsd's default `secure` export option) insist on it.
    pub async fn connect(addr: SocketAddr, cred: opaque_auth<'static>, timeout: Duration) -> Result<RpcConn> {
        let stream = tokio::time::timeout(timeout, connect_tcp(addr))
            .await
            .map_err(|_| Error::Timeout(format!("connecting to {addr}")))??;
        stream.set_nodelay(true)?;
        let (rd, wr) = stream.into_split();
        let (tx, rx) = mpsc::unbounded_channel();
        let waiters: Waiters = Arc::new(Mutex::new(Some(HashMap::new())));
        let closed = Arc::new(AtomicBool::new(false));
        tokio::spawn(write_frames(wr, rx, closed.clone()));
        tokio::spawn(read_replies(rd, waiters.clone(), closed.clone()));
        Ok(RpcConn { frames: tx, waiters, xid: AtomicU32::new(first_xid()), closed, cred, peer: addr })
    }

    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// True once the connection ended: every later call fails at once.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Relaxed)
    }

    /// Call `prog`.`vers`.`proc` with `args` and decode the reply as `R`,
    /// waiting at most `timeout` for it.
    pub async fn call<A: Pack, R: Unpack>(&self, prog: u32, vers: u32, proc: u32, args: &A, timeout: Duration) -> Result<R> {
        let xid = self.xid.fetch_add(1, Relaxed);
        let call = rpc_msg {
            xid,
            body: msg_body::CALL(call_body { rpcvers: RPC_VERSION_2, prog, vers, proc, cred: self.cred.borrow(), verf: opaque_auth::default() }),
        };
        let len = call.packed_size() + args.packed_size();
        let mut frame = Vec::with_capacity(4 + len);
        frame.extend_from_slice(&(LAST_FRAGMENT | len as u32).to_be_bytes());
        call.pack(&mut frame)?;
        args.pack(&mut frame)?;
        let (tx, rx) = oneshot::channel();
        match self.waiters.lock().unwrap().as_mut() {
            Some(w) => w.insert(xid, tx),
            None => return Err(Error::Disconnected(format!("connection to {} closed", self.peer))),
        };
        if self.frames.send(frame).is_err() {
            self.forget(xid);
            return Err(Error::Disconnected(format!("connection to {} closed", self.peer)));
        }
        let reply = match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(r)) => r?,
            Ok(Err(_)) => return Err(Error::Disconnected(format!("connection to {} closed", self.peer))),
            Err(_) => {
                self.forget(xid);
                return Err(Error::Timeout(format!("no reply from {} in {timeout:?}", self.peer)));
            }
        };
        decode_reply(&reply)
    }

    fn forget(&self, xid: u32) {
        if let Some(w) = self.waiters.lock().unwrap().as_mut() {
            w.remove(&xid);
        }
    }

    /// End the connection: the writer stops, the reader sees the close and
    /// fails whatever still waits.
    pub fn close(&self) {
        self.closed.store(true, Relaxed);
        let _ = self.frames.send(Vec::new());
    }
}

impl Drop for RpcConn {
    fn drop(&mut self) {
        self.close();
    }
}

fn first_xid() -> u32 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    (t.as_nanos() as u32) ^ std::process::id().rotate_left(16)
}

async fn connect_tcp(addr: SocketAddr) -> std::io::Result<TcpStream> {
    if unsafe { libc::geteuid() } == 0 {
        // Ports 1023 down to 665 (below is commonly left to well-known services).
        for port in (665..1024).rev() {
            let sock = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
            let local: SocketAddr = if addr.is_ipv4() { ([0, 0, 0, 0], port).into() } else { (std::net::Ipv6Addr::UNSPECIFIED, port).into() };
            if sock.bind(local).is_err() {
                continue;
            }
            match sock.connect(addr).await {
                Ok(s) => return Ok(s),
                Err(e) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) || e.raw_os_error() == Some(libc::EADDRINUSE) => continue,
                Err(e) => return Err(e),
            }
        }
    }
    TcpStream::connect(addr).await
}

/// The reply's accepted/denied status checked, the result decoded.
fn decode_reply<R: Unpack>(reply: &[u8]) -> Result<R> {
    let mut cur = Cursor::new(reply);
    let (msg, _) = rpc_msg::unpack(&mut cur)?;
    match msg.body {
        msg_body::REPLY(reply_body::MSG_ACCEPTED(a)) => match a.reply_data {
            accept_stat_data::SUCCESS => Ok(R::unpack(&mut cur)?.0),
            other => Err(Error::Rpc(format!("call not accepted: {other:?}"))),
        },
        msg_body::REPLY(reply_body::MSG_DENIED(r)) => Err(Error::Rpc(format!("call denied: {r:?}"))),
        msg_body::CALL(_) => Err(Error::Rpc("server sent a call, not a reply".into())),
    }
}

/// Sends queued frames in order, joining those already queued into one
/// write. An empty frame is the order to stop.
async fn write_frames(mut wr: OwnedWriteHalf, mut rx: mpsc::UnboundedReceiver<Vec<u8>>, closed: Arc<AtomicBool>) {
    let mut batch = Vec::new();
    while let Some(first) = rx.recv().await {
        if first.is_empty() {
            break;
        }
        let mut stop = false;
        let buf = if rx.is_empty() {
            first
        } else {
            batch.clear();
            batch.extend_from_slice(&first);
            while batch.len() < COALESCE_BYTES {
                match rx.try_recv() {
                    Ok(f) if f.is_empty() => {
                        stop = true;
                        break;
                    }
                    Ok(f) => batch.extend_from_slice(&f),
                    Err(_) => break,
                }
            }
            std::mem::take(&mut batch)
        };
        if let Err(e) = wr.write_all(&buf).await {
            log::debug!("RPC write: {e}");
            break;
        }
        if buf.capacity() <= 2 * COALESCE_BYTES {
            batch = buf;
        }
        if stop {
            break;
        }
    }
    closed.store(true, Relaxed);
    let _ = wr.shutdown().await;
}

/// Reads records and hands each to the call waiting for its XID; when the
/// connection ends, every waiting call fails.
async fn read_replies(mut rd: OwnedReadHalf, waiters: Waiters, closed: Arc<AtomicBool>) {
    let why = loop {
        let record = match read_record(&mut rd).await {
            Ok(r) => r,
            Err(e) => break e,
        };
        if record.len() < 4 {
            break Error::Rpc("short RPC record".into());
        }
        let xid = u32::from_be_bytes(record[..4].try_into().unwrap());
        let waiter = waiters.lock().unwrap().as_mut().and_then(|w| w.remove(&xid));
        match waiter {
            Some(tx) => {
                let _ = tx.send(Ok(record));
            }
            // A reply to a call that timed out and was given up.
            None => log::debug!("RPC reply for unknown XID {xid:#x}"),
        }
    };
    closed.store(true, Relaxed);
    let pending = waiters.lock().unwrap().take().unwrap_or_default();
    let why = why.to_string();
    for (_, tx) in pending {
        let _ = tx.send(Err(Error::Disconnected(why.clone())));
    }
}

async fn read_record(rd: &mut OwnedReadHalf) -> Result<Vec<u8>> {
    let mut record = Vec::new();
    loop {
        let mut mark = [0u8; 4];
        match rd.read_exact(&mut mark).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(Error::Disconnected("server closed the connection".into())),
            Err(e) => return Err(e.into()),
        }
        let mark = u32::from_be_bytes(mark);
        let len = (mark & !LAST_FRAGMENT) as usize;
        if record.len() + len > MAX_RECORD {
            return Err(Error::Rpc(format!("RPC record over {MAX_RECORD} bytes")));
        }
        let start = record.len();
        record.resize(start + len, 0);
        rd.read_exact(&mut record[start..]).await?;
        if mark & LAST_FRAGMENT != 0 {
            return Ok(record);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nfs3_types::rpc::{accepted_reply, reply_body};
    use tokio::net::TcpListener;

    /// A record: mark, then the XDR of `msg` and `body`.
    fn record(xid: u32, body: u32) -> Vec<u8> {
        let msg = rpc_msg { xid, body: msg_body::REPLY(reply_body::MSG_ACCEPTED(accepted_reply { verf: opaque_auth::default(), reply_data: accept_stat_data::SUCCESS })) };
        let mut out = vec![0; 4];
        msg.pack(&mut out).unwrap();
        body.pack(&mut out).unwrap();
        let len = (out.len() - 4) as u32;
        out[..4].copy_from_slice(&(LAST_FRAGMENT | len).to_be_bytes());
        out
    }

    /// Two calls in flight; the server answers the second first, the first in
    /// two fragments: each call gets its own reply.
    #[tokio::test]
    async fn replies_out_of_order_reach_their_calls() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut xids = vec![];
            for _ in 0..2 {
                let mut mark = [0u8; 4];
                s.read_exact(&mut mark).await.unwrap();
                let mut call = vec![0; (u32::from_be_bytes(mark) & !LAST_FRAGMENT) as usize];
                s.read_exact(&mut call).await.unwrap();
                let xid = u32::from_be_bytes(call[..4].try_into().unwrap());
                let arg = u32::from_be_bytes(call[call.len() - 4..].try_into().unwrap());
                xids.push((xid, arg));
            }
            s.write_all(&record(xids[1].0, xids[1].1 * 10)).await.unwrap();
            let first = record(xids[0].0, xids[0].1 * 10);
            let (head, tail) = first[4..].split_at(8);
            s.write_all(&(head.len() as u32).to_be_bytes()).await.unwrap();
            s.write_all(head).await.unwrap();
            s.write_all(&(LAST_FRAGMENT | tail.len() as u32).to_be_bytes()).await.unwrap();
            s.write_all(tail).await.unwrap();
            s
        });
        let c = RpcConn::connect(addr, opaque_auth::default(), Duration::from_secs(5)).await.unwrap();
        let t = Duration::from_secs(5);
        let (a, b) = tokio::join!(c.call::<u32, u32>(1, 1, 1, &7, t), c.call::<u32, u32>(1, 1, 1, &9, t));
        assert_eq!((a.unwrap(), b.unwrap()), (70, 90));
        // The server goes: a waiting call fails at once, later calls too.
        drop(server.await.unwrap());
        let r = c.call::<u32, u32>(1, 1, 1, &1, t).await;
        assert!(matches!(r, Err(Error::Disconnected(_))), "{r:?}");
        assert!(c.is_closed());
    }
}
