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

    unsafe extern "C" {
        fn bw_mapped_copy(dst: *mut u8, src: *const u8, len: usize) -> u32;
        static bw_mapped_copy_insn: u8;
        static bw_mapped_copy_fault: u8;
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
        let r = unsafe { bw_mapped_copy(dst, src, len) };
        Some(if r == 0 { Ok(()) } else { Err(std::io::Error::from_raw_os_error(libc::EFAULT)) })
    }
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
}

pub(crate) use imp::{copy, copy_raw};

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use std::os::fd::AsRawFd;

    /// A copy into a shared mapping of a file truncated under it fails
    /// (EFAULT) and the process goes on; the bytes before the lost page
    /// are there.
    #[test]
    fn a_copy_into_a_page_that_is_gone_fails_instead_of_ending_the_process() {
        // SAFETY: a plain syscall with a valid C string; File owns the fd.
        let f = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(libc::memfd_create(c"bw-mapped-copy-test".as_ptr(), libc::MFD_CLOEXEC)) };
        f.set_len(3 * 4096).unwrap();
        // SAFETY: a fresh shared mapping of our own file; unmapped below.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), 3 * 4096, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, f.as_raw_fd(), 0) } as *mut u8;
        assert_ne!(p as *mut libc::c_void, libc::MAP_FAILED);
        let data = vec![0xa5u8; 2 * 4096];
        // SAFETY: within the mapping.
        assert!(matches!(unsafe { super::copy(p, &data) }, Some(Ok(()))));
        f.set_len(4096).unwrap();
        // SAFETY: within the mapping; its second and third pages are gone.
        let r = unsafe { super::copy(p, &data) }.expect("x86_64 copies");
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EFAULT));
        let mut back = vec![0u8; 4096];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut back, 0).unwrap();
        assert!(back.iter().all(|&b| b == 0xa5));
        // SAFETY: what was mapped above.
        unsafe { libc::munmap(p as *mut libc::c_void, 3 * 4096) };
    }
}
