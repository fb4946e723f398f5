/* The least a TCP block target can spend per read or write, on this
 * machine's links.
 *
 * A responder that does nothing but what every NVMe/TCP or iSCSI target
 * must do: for a READ, take a command off the socket and send back a
 * header and the data, copied by the kernel from the volume's page cache
 * (the backing file mapped, as blockwire's mapped reads do); for a WRITE,
 * take the command and its data off the socket, copy the data into the
 * mapped volume and send back a header. It answers everything a receive
 * brought in one sendmsg (a large read's data follows by sendfile, below),
 * with no protocol, no checks and no bookkeeping.
 * Its CPU time per operation is the kernel's part of any target's on the
 * same link, with the same client behaviour (plus, for writes, the one
 * copy into the volume every target makes): the floor against which
 * bench/tcp-floor sets blockwire's figure.
 *
 * Reads of SENDFILE_MIN bytes and more are answered as blockwire's targets
 * answer them (`zero_copy_min`): the header, then the data with sendfile
 * from the volume's page cache (no copy on the sending side). The load
 * generator takes such an answer as blockwire's initiators take a large
 * payload (crates/initiator/src/direct.rs): into a page-aligned buffer,
 * waking at a low-water mark (SO_RCVLOWAT) of half of what is still to
 * come, 32 KiB to 256 KiB. On veth the receiver's TCP work runs in the
 * sender's softirq, so how the client wakes decides whose CPU does it:
 * the floor's client must wake as ours do for its figure to be a floor for
 * theirs (docs/notes/2026-11-25-lab-link-gro.md,
 * docs/notes/2026-11-28-merges-20.md).
 *
 *   tcp-floor serve PORT FILE        one connection, then exit printing
 *                                     "ops N utime_s U stime_s S"
 *   tcp-floor load ADDR PORT QD BS SECONDS SIZE [read|write]
 *                                     keep QD reads (or writes) of BS bytes
 *                                     at random offsets below SIZE
 *                                     outstanding, print
 *                                     "ops N secs T utime_s U stime_s S"
 *
 * Wire format (this program's own): a command is CMD bytes (the size of an
 * NVMe/TCP command capsule), carrying the operation, offset and length,
 * and for a write the data behind it; an answer is HDR bytes (the size of
 * a C2HData header or a completion capsule) followed, for a read, by the
 * data.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define CMD 72
#define HDR 24
#define MAX_BATCH 512
/* Most bytes one receive takes: 512 commands with 4 KiB of write data each. */
#define IN_MAX (MAX_BATCH * (CMD + 4096))
/* Reads this large and larger go out with sendfile (blockwire's
 * `zero_copy_min` default) and are received at a low-water mark. */
#define SENDFILE_MIN (32 * 1024)
/* The low-water mark's bounds: crates/initiator/src/direct.rs's
 * RCVLOWAT_MAX and TAIL. */
#define LOWAT_MAX (256 * 1024)
#define LOWAT_TAIL (32 * 1024)

enum { OP_READ = 0, OP_WRITE = 1 };

struct cmd {
    uint64_t off;
    uint32_t len;
    uint8_t op;
    uint8_t pad[CMD - 13];
} __attribute__((packed));

static void die(const char *what) {
    perror(what);
    exit(1);
}

static void usage_times(double *u, double *s) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    *u = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6;
    *s = ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

static void send_iov(int fd, struct iovec *iov, int n, int flags) {
    while (n > 0) {
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = n > IOV_MAX ? IOV_MAX : n};
        ssize_t w = sendmsg(fd, &m, flags);
        if (w < 0) {
            if (errno == EINTR) continue;
            die("sendmsg");
        }
        while (n > 0 && (size_t)w >= iov->iov_len) {
            w -= iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + w;
            iov->iov_len -= w;
        }
    }
}

static void write_all(int fd, struct iovec *iov, int n) { send_iov(fd, iov, n, 0); }

/* Send `len` bytes of the file `vf` from `off`, as the kernel takes them. */
static void sendfile_all(int c, int vf, off_t off, size_t len) {
    while (len > 0) {
        ssize_t s = sendfile(c, vf, &off, len);
        if (s < 0 && errno == EINTR) continue;
        if (s < 0) die("sendfile");
        if (s == 0) {
            fprintf(stderr, "sendfile: the volume ended early\n");
            exit(1);
        }
        len -= (size_t)s;
    }
}

static int serve(int port, const char *file) {
    int vf = open(file, O_RDWR);
    if (vf < 0) die(file);
    struct stat st;
    if (fstat(vf, &st) < 0) die("fstat");
    char *vol = mmap(NULL, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, vf, 0);
    if (vol == MAP_FAILED) die("mmap");
    int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (bind(ls, (struct sockaddr *)&a, sizeof a) < 0) die("bind");
    if (listen(ls, 1) < 0) die("listen");
    printf("ready\n");
    fflush(stdout);
    int c = accept(ls, NULL, NULL);
    if (c < 0) die("accept");
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    static char in[IN_MAX];
    static char hdr[MAX_BATCH][HDR];
    static struct iovec iov[2 * MAX_BATCH];
    size_t have = 0;
    uint64_t ops = 0;
    double u0, s0;
    usage_times(&u0, &s0);
    for (;;) {
        ssize_t r = recv(c, in + have, sizeof in - have, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        have += r;
        size_t pos = 0, n = 0, k = 0;
        while (n < MAX_BATCH && have - pos >= CMD) {
            struct cmd m;
            memcpy(&m, in + pos, sizeof m);
            if (m.len > (uint64_t)st.st_size || m.off > (uint64_t)st.st_size - m.len ||
                (m.op == OP_WRITE && m.len > sizeof in - CMD)) {
                fprintf(stderr, "command past the end of the volume\n");
                return 1;
            }
            size_t need = CMD + (m.op == OP_WRITE ? m.len : 0);
            if (have - pos < need) break;
            /* a C2HData PDU's type or a response capsule's, for whoever captures it */
            hdr[n][0] = m.op == OP_WRITE ? 5 : 7;
            memcpy(hdr[n] + 8, &m.len, 4);
            iov[k++] = (struct iovec){hdr[n], HDR};
            if (m.op == OP_WRITE) {
                memcpy(vol + m.off, in + pos + CMD, m.len);
            } else if (m.len >= SENDFILE_MIN) {
                /* what is queued, this header last, then the data from the page cache */
                send_iov(c, iov, (int)k, MSG_MORE);
                k = 0;
                sendfile_all(c, vf, (off_t)m.off, m.len);
            } else {
                iov[k++] = (struct iovec){vol + m.off, m.len};
            }
            pos += need;
            n++;
        }
        write_all(c, iov, (int)k);
        ops += n;
        have -= pos;
        memmove(in, in + pos, have);
    }
    double u1, s1;
    usage_times(&u1, &s1);
    printf("ops %llu utime_s %.6f stime_s %.6f\n", (unsigned long long)ops, u1 - u0, s1 - s0);
    return 0;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* The low-water mark for a payload with `need` bytes still to come:
 * crates/initiator/src/direct.rs's `low_water` (half of it, 32 KiB to
 * 256 KiB; all of it below 32 KiB). */
static int low_water(size_t need) {
    if (need <= LOWAT_TAIL) return need ? (int)need : 1;
    size_t h = need / 2;
    return (int)(h < LOWAT_TAIL ? LOWAT_TAIL : h > LOWAT_MAX ? LOWAT_MAX : h);
}

/* Take one large answer off the socket: its header into `hdr`, its data
 * straight into `dst`, waking at the low-water mark. */
static void recv_large(int c, char *hdr, char *dst, size_t len, int *lowat) {
    size_t total = HDR + len, got = 0;
    while (got < total) {
        int want = low_water(total - got);
        if (want != *lowat) {
            if (setsockopt(c, SOL_SOCKET, SO_RCVLOWAT, &want, sizeof want) < 0) die("SO_RCVLOWAT");
            *lowat = want;
        }
        struct iovec v[2];
        int n = 0;
        if (got < HDR) {
            v[n++] = (struct iovec){hdr + got, HDR - got};
            v[n++] = (struct iovec){dst, len};
        } else {
            v[n++] = (struct iovec){dst + (got - HDR), total - got};
        }
        struct msghdr m = {.msg_iov = v, .msg_iovlen = n};
        ssize_t r = recvmsg(c, &m, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) die("recv");
        got += (size_t)r;
    }
}

static int load(const char *addr, int port, int qd, uint32_t bs, double secs, uint64_t size, int op) {
    if (qd < 1 || qd > MAX_BATCH || bs == 0 || size < bs || (op == OP_WRITE && bs > IN_MAX - CMD)) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    int c = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (inet_pton(AF_INET, addr, &a.sin_addr) != 1) die(addr);
    if (connect(c, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    uint64_t blocks = size / bs, rng = 0x9e3779b97f4a7c15ull, ops = 0;
    static struct cmd out[MAX_BATCH];
    static struct iovec v[2 * MAX_BATCH];
    /* What writes send: one block of bytes that are not all zero. */
    char *data = malloc(bs);
    if (!data) die("malloc");
    for (uint32_t i = 0; i < bs; i++) data[i] = (char)(i * 131 + 7);
    size_t answer = HDR + (op == OP_WRITE ? 0 : bs), got = 0;
    size_t cap = answer * 64 > (1 << 20) ? (1 << 20) : answer * 64;
    /* Large reads land in a page-aligned buffer, as fio's and blockwire
     * bench's do (docs/notes/2026-11-27-h51h-seqread.md: on AMD Zen 3 the
     * kernel's copy into a misaligned one costs 3x). */
    int large = op == OP_READ && bs >= SENDFILE_MIN, lowat = 1;
    char *in = NULL, hdr[HDR];
    if (large ? posix_memalign((void **)&in, 4096, bs) != 0 : (in = malloc(cap)) == NULL) die("malloc");
    int outstanding = 0, want = qd;
    double u0, s0, t0 = now(), end = t0 + secs;
    usage_times(&u0, &s0);
    for (;;) {
        if (want > 0) {
            int k = 0;
            for (int i = 0; i < want; i++) {
                rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
                memset(&out[i], 0, sizeof out[i]);
                out[i].off = (rng % blocks) * bs;
                out[i].len = bs;
                out[i].op = (uint8_t)op;
                v[k++] = (struct iovec){&out[i], sizeof out[i]};
                if (op == OP_WRITE) v[k++] = (struct iovec){data, bs};
            }
            write_all(c, v, k);
            outstanding += want;
            want = 0;
        }
        if (outstanding == 0) break;
        int done = 1;
        if (large) {
            recv_large(c, hdr, in, bs, &lowat);
        } else {
            ssize_t r = recv(c, in, cap, 0);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) die("recv");
            got += r;
            done = (int)(got / answer);
            got %= answer;
        }
        ops += done;
        outstanding -= done;
        if (now() < end) want = done;
    }
    double t1 = now(), u1, s1;
    usage_times(&u1, &s1);
    shutdown(c, SHUT_WR);
    printf("ops %llu secs %.6f utime_s %.6f stime_s %.6f\n", (unsigned long long)ops, t1 - t0, u1 - u0, s1 - s0);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "serve")) return serve(atoi(argv[2]), argv[3]);
    if ((argc == 8 || argc == 9) && !strcmp(argv[1], "load")) {
        int op = argc == 9 && !strcmp(argv[8], "write") ? OP_WRITE : OP_READ;
        if (argc == 9 && op == OP_READ && strcmp(argv[8], "read")) {
            fprintf(stderr, "load: the operation is read or write, not %s\n", argv[8]);
            return 2;
        }
        return load(argv[2], atoi(argv[3]), atoi(argv[4]), (uint32_t)strtoul(argv[5], NULL, 0), atof(argv[6]),
                    strtoull(argv[7], NULL, 0), op);
    }
    fprintf(stderr, "usage: tcp-floor serve PORT FILE | tcp-floor load ADDR PORT QD BS SECONDS SIZE [read|write]\n");
    return 2;
}
