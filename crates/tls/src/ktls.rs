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
}
