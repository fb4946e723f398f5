//! A copy into a memory-backed volume's shared mapping that fails like a
//! system call when the page cannot be had, instead of ending the process.
//!
//! A small write costs a `pwrite` into tmpfs about 2.7x a copy into the
//! file's mapping (6.1-6.2 against 2.3-2.5 µs per random 4 KiB write into a
//! 512 MiB tmpfs file on this machine: the system call, the inode lock and
//! the page cache lookup; docs/notes/2026-11-26-write-path.md). But a
//! store into a shared mapping whose page is gone (the file truncated by
//! someone else, a hole on a full tmpfs, a poisoned page) raises SIGBUS,
//! which would end every session of the process where the `pwrite` fails
//! that one write. So the copy is one instruction (`rep movsb`, the way
//! glibc's memcpy copies a few KiB anyway) whose address the SIGBUS handler
//! knows: a fault there resumes at a landing that returns failure, exactly
//! as the kernel's own user copies use their exception table. Any other
//! SIGBUS goes to the handler that was there before (Rust's stack guard
//! check, or the default action).
//!
//! A second copy, [`copy_streaming`], writes with non-temporal stores
//! (SSE2's `movntdq`, which every x86-64 has): they do not read the
//! destination's cache lines before writing them. A small write into a
//! volume much larger than the cache lands on lines that are not cached,
//! and an ordinary copy (`rep movsb`, glibc's memcpy) first reads each of
//! them from memory: 0.50-0.53 µs per 4 KiB into random places of a
//! 512 MiB tmpfs mapping, 0.33 into 64 MiB, against 0.28 streamed at any
//! size (AMD EPYC Zen 2, 16 MiB L3; docs/notes/2026-11-29-streaming-writes.md).
//! Into a region the cache holds, streaming is the slower (0.28 against
//! 0.10 µs into 1 MiB), so the volume chooses it by its size
//! (`volume::Mapping`). Its fault landing covers the whole loop, since
//! any of its stores may meet the lost page.

#[cfg(target_arch = "x86_64")]
mod imp {
    use std::sync::OnceLock;

    // The copy and its landing, in one place so the handler can tell the
    // faulting instruction by its address. System V: rdi = dst, rsi = src,
    // rdx = len; returns 0, or 1 from the landing (rcx then holds what was
    // not copied).
    std::arch::global_asm!(
        ".pushsection .text.bw_mapped_copy,\"ax\",@progbits",
        ".p2align 4",
        ".globl bw_mapped_copy",
        ".hidden bw_mapped_copy",
        ".type bw_mapped_copy,@function",
        "bw_mapped_copy:",
        "mov rcx, rdx",
        "xor eax, eax",
        ".globl bw_mapped_copy_insn",
        ".hidden bw_mapped_copy_insn",
        "bw_mapped_copy_insn:",
        "rep movsb",
        "ret",
        ".globl bw_mapped_copy_fault",
        ".hidden bw_mapped_copy_fault",
        "bw_mapped_copy_fault:",
        "mov eax, 1",
        "ret",
        ".size bw_mapped_copy, .-bw_mapped_copy",
        ".popsection",
    );

    // The streaming copy: rdi = dst (16-byte aligned), rsi = src, rdx =
    // len (a non-zero multiple of 64); returns 0, or 1 from the landing.
    // Every instruction from `_loop` up to `_end` may fault (the stores
    // on the destination's page, the loads on a source in a mapping), so
    // the handler resumes at the landing from any of them; nothing there
    // touches the stack, so the landing's `ret` returns to the caller. The
    // `sfence` orders the streamed stores before whatever follows (the
    // stripe lock's release, the answer sent), as ordinary stores are.
    std::arch::global_asm!(
        ".pushsection .text.bw_mapped_copy_nt,\"ax\",@progbits",
        ".p2align 4",
        ".globl bw_mapped_copy_nt",
        ".hidden bw_mapped_copy_nt",
        ".type bw_mapped_copy_nt,@function",
        "bw_mapped_copy_nt:",
        "xor eax, eax",
        ".globl bw_mapped_copy_nt_loop",
        ".hidden bw_mapped_copy_nt_loop",
        "bw_mapped_copy_nt_loop:",
        "movdqu xmm0, xmmword ptr [rsi]",
        "movdqu xmm1, xmmword ptr [rsi + 16]",
        "movdqu xmm2, xmmword ptr [rsi + 32]",
        "movdqu xmm3, xmmword ptr [rsi + 48]",
        "movntdq xmmword ptr [rdi], xmm0",
        "movntdq xmmword ptr [rdi + 16], xmm1",
        "movntdq xmmword ptr [rdi + 32], xmm2",
        "movntdq xmmword ptr [rdi + 48], xmm3",
        "add rsi, 64",
        "add rdi, 64",
        "sub rdx, 64",
        "jnz bw_mapped_copy_nt_loop",
        ".globl bw_mapped_copy_nt_end",
        ".hidden bw_mapped_copy_nt_end",
        "bw_mapped_copy_nt_end:",
        "sfence",
        "ret",
        ".globl bw_mapped_copy_nt_fault",
        ".hidden bw_mapped_copy_nt_fault",
        "bw_mapped_copy_nt_fault:",
        "sfence",
        "mov eax, 1",
        "ret",
        ".size bw_mapped_copy_nt, .-bw_mapped_copy_nt",
        ".popsection",
    );

    unsafe extern "C" {
        fn bw_mapped_copy(dst: *mut u8, src: *const u8, len: usize) -> u32;
        static bw_mapped_copy_insn: u8;
        static bw_mapped_copy_fault: u8;
        fn bw_mapped_copy_nt(dst: *mut u8, src: *const u8, len: usize) -> u32;
        static bw_mapped_copy_nt_loop: u8;
        static bw_mapped_copy_nt_end: u8;
        static bw_mapped_copy_nt_fault: u8;
    }

    /// The SIGBUS disposition before ours, to pass on faults that are not
    /// the copy's.
    static PREVIOUS: OnceLock<Option<libc::sigaction>> = OnceLock::new();

    extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
        // SAFETY: the kernel hands a SA_SIGINFO handler its ucontext_t.
        let uc = unsafe { &mut *(ctx as *mut libc::ucontext_t) };
        let rip = &mut uc.uc_mcontext.gregs[libc::REG_RIP as usize];
        if *rip as usize == (&raw const bw_mapped_copy_insn) as usize {
            *rip = (&raw const bw_mapped_copy_fault) as i64;
            return;
        }
        if ((&raw const bw_mapped_copy_nt_loop) as usize..(&raw const bw_mapped_copy_nt_end) as usize).contains(&(*rip as usize)) {
            *rip = (&raw const bw_mapped_copy_nt_fault) as i64;
            return;
        }
        match PREVIOUS.get().copied().flatten() {
            Some(p) if p.sa_sigaction != libc::SIG_DFL && p.sa_sigaction != libc::SIG_IGN => {
                if p.sa_flags & libc::SA_SIGINFO != 0 {
                    // SAFETY: a handler installed with SA_SIGINFO has this type.
                    let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = unsafe { std::mem::transmute(p.sa_sigaction) };
                    f(sig, info, ctx);
                } else {
                    // SAFETY: a plain handler has this type.
                    let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(p.sa_sigaction) };
                    f(sig);
                }
            }
            _ => {
                // The default action: put it back and return, so that the
                // faulting instruction runs again and the fault ends the
                // process as it would have without us.
                // SAFETY: sigaction with a zeroed (SIG_DFL) action.
                unsafe {
                    let mut dfl: libc::sigaction = std::mem::zeroed();
                    dfl.sa_sigaction = libc::SIG_DFL;
                    libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
                }
            }
        }
    }

    /// Install the handler once; false if that failed (then no copy may run).
    fn installed() -> bool {
        PREVIOUS
            .get_or_init(|| {
                // SAFETY: installing a SA_SIGINFO handler and keeping the old one.
                unsafe {
                    let mut new: libc::sigaction = std::mem::zeroed();
                    new.sa_sigaction = on_sigbus as *const () as usize;
                    new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                    libc::sigemptyset(&mut new.sa_mask);
                    let mut old: libc::sigaction = std::mem::zeroed();
                    (libc::sigaction(libc::SIGBUS, &new, &mut old) == 0).then_some(old)
                }
            })
            .is_some()
    }

    /// Copy `src` to `dst`; `None` if this cannot copy safely here.
    ///
    /// # Safety
    /// `dst` must be valid for `src.len()` bytes of a mapping (a fault in
    /// it other than SIGBUS is not caught) that nothing else reads as Rust
    /// memory.
    pub unsafe fn copy(dst: *mut u8, src: &[u8]) -> Option<std::io::Result<()>> {
        // SAFETY: the caller's contract.
        unsafe { copy_raw(dst, src.as_ptr(), src.len()) }
    }

    /// Copy `len` bytes from `src` to `dst`, either of which may be in a
    /// mapping (a read of a truncated file's mapping faults alike);
    /// `None` if this cannot copy safely here.
    ///
    /// # Safety
    /// Both must be valid for `len` bytes but for SIGBUS (a fault other
    /// than SIGBUS is not caught), and `dst` must not be read as Rust
    /// memory while the copy runs.
    pub unsafe fn copy_raw(dst: *mut u8, src: *const u8, len: usize) -> Option<std::io::Result<()>> {
        if !installed() {
            return None;
        }
        // SAFETY: the caller's contract; the handler turns SIGBUS into 1.
        Some(outcome(unsafe { bw_mapped_copy(dst, src, len) }))
    }

    /// What the assembly copies return: 0 copied, 1 from a fault landing
    /// (failed as the kernel's copy fails, EFAULT).
    fn outcome(r: u32) -> std::io::Result<()> {
        if r == 0 { Ok(()) } else { Err(std::io::Error::from_raw_os_error(libc::EFAULT)) }
    }

    /// [`copy`] with stores that bypass the cache (see the module's
    /// comment) for the part of `dst` from its first 16-byte boundary on,
    /// in whole 64-byte pieces (all of a block-sized write into a volume's
    /// mapping); the few bytes before and after it, and a copy with fewer
    /// than [`STREAM_MIN`] such bytes, as [`copy`].
    ///
    /// # Safety
    /// As [`copy`].
    pub unsafe fn copy_streaming(dst: *mut u8, src: &[u8]) -> Option<std::io::Result<()>> {
        let head = dst.align_offset(16).min(src.len());
        let middle = (src.len() - head) / 64 * 64;
        if middle < STREAM_MIN {
            // SAFETY: the caller's contract.
            return unsafe { copy(dst, src) };
        }
        if !installed() {
            return None;
        }
        let tail = head + middle;
        // SAFETY (the three copies): each within `dst`'s `src.len()` bytes
        // (the caller's contract); the middle starts 16-byte aligned and
        // is a non-zero multiple of 64 long, as the loop needs; the handler
        // turns SIGBUS into 1. A copy that fails ends it (`?`).
        Some((|| {
            if head > 0 {
                outcome(unsafe { bw_mapped_copy(dst, src.as_ptr(), head) })?;
            }
            outcome(unsafe { bw_mapped_copy_nt(dst.add(head), src.as_ptr().add(head), middle) })?;
            if tail < src.len() {
                outcome(unsafe { bw_mapped_copy(dst.add(tail), src.as_ptr().add(tail), src.len() - tail) })?;
            }
            Ok(())
        })())
    }

    /// The fewest bytes worth streaming: a few lines, so that the fence
    /// and the loop's setup are spread over some stores. Chosen, not
    /// measured: a volume's writes are mostly whole blocks (>= 512).
    const STREAM_MIN: usize = 256;
}

#[cfg(not(target_arch = "x86_64"))]
mod imp {
    /// No fault-tolerant copy on this architecture: callers `pwrite`.
    pub unsafe fn copy(_dst: *mut u8, _src: &[u8]) -> Option<std::io::Result<()>> {
        None
    }
    pub unsafe fn copy_raw(_dst: *mut u8, _src: *const u8, _len: usize) -> Option<std::io::Result<()>> {
        None
    }
    pub unsafe fn copy_streaming(_dst: *mut u8, _src: &[u8]) -> Option<std::io::Result<()>> {
        None
    }
}

pub(crate) use imp::{copy, copy_raw, copy_streaming};

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use std::os::fd::AsRawFd;

    type Copy = unsafe fn(*mut u8, &[u8]) -> Option<std::io::Result<()>>;

    /// A shared mapping of `pages` pages of a fresh memory file.
    fn mapped(pages: usize) -> (std::fs::File, *mut u8) {
        // SAFETY: a plain syscall with a valid C string; File owns the fd.
        let f = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(libc::memfd_create(c"bw-mapped-copy-test".as_ptr(), libc::MFD_CLOEXEC)) };
        f.set_len((pages * 4096) as u64).unwrap();
        // SAFETY: a fresh shared mapping of our own file; the tests unmap it.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), pages * 4096, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, f.as_raw_fd(), 0) } as *mut u8;
        assert_ne!(p as *mut libc::c_void, libc::MAP_FAILED);
        (f, p)
    }

    /// A copy into a shared mapping of a file truncated under it fails
    /// (EFAULT) and the process goes on; the bytes before the lost page
    /// are there. Both copies: the streaming one's fault may come from
    /// any store of its loop.
    fn a_copy_into_a_lost_page_fails(copy: Copy) {
        let (f, p) = mapped(3);
        // From 8 bytes into a buffer: a source that is not aligned.
        let buf = vec![0xa5u8; 2 * 4096 + 8];
        let data = &buf[8..];
        // SAFETY: within the mapping.
        assert!(matches!(unsafe { copy(p, data) }, Some(Ok(()))));
        f.set_len(4096).unwrap();
        // SAFETY: within the mapping; its second and third pages are gone.
        let r = unsafe { copy(p, data) }.expect("x86_64 copies");
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EFAULT));
        let mut back = vec![0u8; 4096];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut back, 0).unwrap();
        assert!(back.iter().all(|&b| b == 0xa5));
        // SAFETY: what was mapped above.
        unsafe { libc::munmap(p as *mut libc::c_void, 3 * 4096) };
    }

    #[test]
    fn a_copy_into_a_page_that_is_gone_fails_instead_of_ending_the_process() {
        a_copy_into_a_lost_page_fails(super::copy);
    }

    #[test]
    fn a_streaming_copy_into_a_page_that_is_gone_fails_instead_of_ending_the_process() {
        a_copy_into_a_lost_page_fails(super::copy_streaming);
    }

    /// The streaming copy writes exactly its bytes, whatever the source's
    /// and the destination's alignment and the length (the unaligned head
    /// and the tail short of 64 bytes copied plainly, a short copy wholly).
    #[test]
    fn a_streaming_copy_writes_exactly_its_bytes() {
        let (f, p) = mapped(2);
        let src: Vec<u8> = (0..8192 + 64).map(|i| (i * 7 + i / 251) as u8).collect();
        for (at, from, len) in [(0, 0, 4096), (64, 3, 4096), (512, 1, 1024), (16, 5, 64), (1, 0, 100), (32, 9, 130), (4096, 0, 4096 - 48), (7, 2, 4096), (9, 0, 300), (48, 1, 4000)] {
            let before = vec![0x5au8; 8192];
            std::os::unix::fs::FileExt::write_all_at(&f, &before, 0).unwrap();
            // SAFETY: at + len is within the two mapped pages.
            assert!(matches!(unsafe { super::copy_streaming(p.add(at), &src[from..from + len]) }, Some(Ok(()))));
            let mut back = vec![0u8; 8192];
            std::os::unix::fs::FileExt::read_exact_at(&f, &mut back, 0).unwrap();
            assert!(back[..at].iter().all(|&b| b == 0x5a), "before {at}");
            assert_eq!(&back[at..at + len], &src[from..from + len], "at {at} from {from} len {len}");
            assert!(back[at + len..].iter().all(|&b| b == 0x5a), "after {at}+{len}");
        }
        // SAFETY: what was mapped above.
        unsafe { libc::munmap(p as *mut libc::c_void, 2 * 4096) };
    }
}
