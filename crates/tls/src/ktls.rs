//! Kernel TLS (Linux 4.13 on for sending, 4.17 for receiving; TLS 1.3
//! from 5.1): after the handshake the socket gets the "tls" upper-layer
//! protocol and each direction's key, IV and record sequence number;
//! from then on the socket's bytes are the records' content. Sends keep
//! their shape (sendmsg gathers headers and mapped payloads, sendfile
//! sends from the page cache: the kernel encrypts on the way), and a
//! record of any type but application data makes a plain read fail
//! (EIO), which closes the connection, as post-handshake messages should
//! here.
//!
//! The module is `tls.ko` (CONFIG_TLS); without it attaching fails with
//! ENOENT and the caller falls back to the user-space record layer (see
//! [`crate::secure`]). `/proc/net/tls_stat` counts what the kernel does.

use crate::record::Keys;
use crate::Suite;
use std::io;
use std::os::fd::RawFd;
use zeroize::Zeroize;

// include/uapi/linux/tls.h, include/uapi/linux/tcp.h
const SOL_TLS: libc::c_int = 282;
const TLS_TX: libc::c_int = 1;
const TLS_RX: libc::c_int = 2;
/// The control message naming a received record's content type.
const TLS_GET_RECORD_TYPE: libc::c_int = 2;
const TCP_ULP: libc::c_int = 31;
const TLS_1_3_VERSION: u16 = 0x0304;
const TLS_CIPHER_AES_GCM_128: u16 = 51;
const TLS_CIPHER_AES_GCM_256: u16 = 52;
const TLS_CIPHER_CHACHA20_POLY1305: u16 = 54;

/// `struct tls12_crypto_info_aes_gcm_{128,256}`: the 12-byte IV split as
/// a 4-byte salt and 8 bytes, the next record's sequence number big-endian.
/// (`tls12_crypto_info_chacha20_poly1305` is [`ChachaInfo`].)
#[repr(C)]
struct CryptoInfo<const K: usize> {
    version: u16,
    cipher_type: u16,
    iv: [u8; 8],
    key: [u8; K],
    salt: [u8; 4],
    rec_seq: [u8; 8],
}

impl<const K: usize> CryptoInfo<K> {
    fn new(cipher_type: u16, k: &Keys) -> Self {
        let mut c = CryptoInfo { version: TLS_1_3_VERSION, cipher_type, iv: [0; 8], key: [0; K], salt: [0; 4], rec_seq: k.seq.to_be_bytes() };
        c.salt.copy_from_slice(&k.iv[..4]);
        c.iv.copy_from_slice(&k.iv[4..]);
        c.key.copy_from_slice(&k.key);
        c
    }
}

impl<const K: usize> Drop for CryptoInfo<K> {
    fn drop(&mut self) {
        self.key.zeroize();
        self.salt.zeroize();
        self.iv.zeroize();
    }
}

/// `struct tls12_crypto_info_chacha20_poly1305`: the whole 12-byte IV, no salt.
#[repr(C)]
struct ChachaInfo {
    version: u16,
    cipher_type: u16,
    iv: [u8; 12],
    key: [u8; 32],
    rec_seq: [u8; 8],
}

impl ChachaInfo {
    fn new(k: &Keys) -> Self {
        let mut c = ChachaInfo { version: TLS_1_3_VERSION, cipher_type: TLS_CIPHER_CHACHA20_POLY1305, iv: k.iv, key: [0; 32], rec_seq: k.seq.to_be_bytes() };
        c.key.copy_from_slice(&k.key);
        c
    }
}

impl Drop for ChachaInfo {
    fn drop(&mut self) {
        self.key.zeroize();
        self.iv.zeroize();
    }
}

fn setsockopt<T>(fd: RawFd, level: libc::c_int, name: libc::c_int, v: &T, len: usize) -> io::Result<()> {
    // SAFETY: `v` points to `len` readable bytes for the call's duration.
    let r = unsafe { libc::setsockopt(fd, level, name, v as *const T as *const libc::c_void, len as libc::socklen_t) };
    if r == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// Give the TCP socket `fd` the "tls" upper-layer protocol. ENOENT: the
/// kernel has no TLS (no `tls` module). Nothing is encrypted until
/// [`set_keys`].
pub fn attach(fd: RawFd) -> io::Result<()> {
    setsockopt(fd, libc::SOL_TCP, TCP_ULP, b"tls\0", 4)
}

/// Which way a key goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Send,
    Receive,
}

/// Hand one direction's keys to the kernel (after [`attach`]).
pub fn set_keys(fd: RawFd, dir: Direction, k: &Keys) -> io::Result<()> {
    let name = match dir {
        Direction::Send => TLS_TX,
        Direction::Receive => TLS_RX,
    };
    match k.suite {
        Suite::Aes128GcmSha256 => {
            let c = CryptoInfo::<16>::new(TLS_CIPHER_AES_GCM_128, k);
            setsockopt(fd, SOL_TLS, name, &c, std::mem::size_of_val(&c))
        }
        Suite::Aes256GcmSha384 => {
            let c = CryptoInfo::<32>::new(TLS_CIPHER_AES_GCM_256, k);
            setsockopt(fd, SOL_TLS, name, &c, std::mem::size_of_val(&c))
        }
        Suite::Chacha20Poly1305Sha256 => {
            let c = ChachaInfo::new(k);
            setsockopt(fd, SOL_TLS, name, &c, std::mem::size_of_val(&c))
        }
    }
}

/// A record of another type than application data that made a plain read
/// of a kTLS socket fail (EIO: the kernel hands such a record only to a
/// read with a control buffer, and keeps it for one): its content type
/// and the start of its content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldRecord {
    pub kind: u8,
    pub head: Vec<u8>,
}

impl HeldRecord {
    /// Why the connection ends, for the log. Linux's kTLS receive (up to
    /// 6.12) cannot take new keys after a KeyUpdate (TLS 1.3 rekey came to
    /// kTLS with the "tls: implement key updates for TLS1.3" series, after
    /// 6.12), and neither record layer here does KeyUpdate.
    pub fn describe(&self) -> String {
        use crate::record::alert_name;
        match (self.kind, self.head.as_slice()) {
            (22, [24, _, _, _, req, ..]) => format!(
                "the peer sent a TLS KeyUpdate (request_update {req}) after the handshake: KeyUpdate is not supported on kTLS receive (this kernel's kTLS cannot take the new keys, and blockwire does not rekey), so the connection is closed"
            ),
            (22, [t, ..]) => format!("the peer sent a post-handshake TLS message of type {t} over kTLS: not supported (no KeyUpdate, no renegotiation), so the connection is closed"),
            (21, [_, 0, ..]) => "the peer ended TLS (close_notify)".to_string(),
            (21, [level, desc, ..]) => format!("the peer sent TLS alert {desc} ({}, level {level}) over kTLS", alert_name(*desc)),
            (k, _) => format!("the kernel's TLS received a record of content type {k} ({} bytes) where application data belongs", self.head.len()),
        }
    }
}

/// After a read of the kTLS socket `fd` failed with EIO: the record that
/// made it fail, read now with a control buffer (without waiting). None
/// when there is none (the EIO was another failure).
pub fn held_record(fd: RawFd) -> io::Result<Option<HeldRecord>> {
    let mut data = [0u8; 64];
    let mut iov = libc::iovec { iov_base: data.as_mut_ptr().cast(), iov_len: data.len() };
    // u64s: cmsghdr's alignment.
    let mut control = [0u64; 8];
    // SAFETY: a zeroed msghdr is valid (no name, no iov, no control yet).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: msg points to the buffers above, alive for the call.
    let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::WouldBlock { Ok(None) } else { Err(e) };
    }
    let mut kind = None;
    // SAFETY: the CMSG_* walk stays within msg_control as the kernel filled it.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == SOL_TLS && (*c).cmsg_type == TLS_GET_RECORD_TYPE {
                kind = Some(*libc::CMSG_DATA(c));
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok(kind.map(|kind| HeldRecord { kind, head: data[..n as usize].to_vec() }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layouts the kernel copies (`sizeof` of its structs: 40, 56 and 56).
    #[test]
    fn crypto_info_layouts_are_the_kernels() {
        assert_eq!(std::mem::size_of::<CryptoInfo<16>>(), 40);
        assert_eq!(std::mem::size_of::<CryptoInfo<32>>(), 56);
        assert_eq!(std::mem::size_of::<ChachaInfo>(), 56);
        let k = Keys::from_secret(Suite::Aes128GcmSha256, &[1; 32]);
        let mut k2 = Keys::from_secret(Suite::Aes128GcmSha256, &[1; 32]);
        k2.seq = 0x0102030405060708;
        let c = CryptoInfo::<16>::new(TLS_CIPHER_AES_GCM_128, &k2);
        assert_eq!(c.salt, k.iv[..4]);
        assert_eq!(c.iv, k.iv[4..]);
        assert_eq!(c.rec_seq, [1, 2, 3, 4, 5, 6, 7, 8]);
    }

    #[test]
    fn held_records_say_what_they_were() {
        let d = |kind, head: &[u8]| HeldRecord { kind, head: head.to_vec() }.describe();
        assert!(d(22, &[24, 0, 0, 1, 1]).contains("KeyUpdate (request_update 1)"), "{}", d(22, &[24, 0, 0, 1, 1]));
        assert!(d(22, &[24, 0, 0, 1, 0]).contains("KeyUpdate is not supported on kTLS receive"));
        assert!(d(22, &[1, 0, 0, 4]).contains("type 1"));
        assert_eq!(d(21, &[1, 0]), "the peer ended TLS (close_notify)");
        assert!(d(21, &[2, 20]).contains("bad_record_mac"));
        assert!(d(20, &[1]).contains("content type 20"));
    }
}
