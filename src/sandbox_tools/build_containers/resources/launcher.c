/*
 * sandbox-tools portable launcher: the entry point of the single-file artifact.
 *
 * Statically linked with musl, so it runs in any Linux container: glibc of any age,
 * musl, or no libc at all. The file is:
 *
 *   [this program][payload: LZ4 blocks of the archive][trailer]
 *
 * First run: the archive (a PyInstaller onedir tree plus its own glibc loader and
 * libraries in lib/) is unpacked once into <dir of this file>/runtime-<id>/, every file
 * re-read and checked after writing, then renamed into place (atomic). Unpacking holds
 * an flock on <dir>/.unpack.lock, so racing first runs wait for one another and any
 * staging directory seen while holding it is a crashed run's leftover, swept away.
 * Later runs never unpack; they check that the tree belongs to them (or root) and that
 * nobody else can write to it. Before the injector reuses an install, `verify` compares
 * the tree with the payload entry by entry, without running or following anything of it.
 *
 * The payload is treated as hostile input too (THREAT_MODEL.md): entry names must be
 * relative with no empty, "." or ".." components; every entry is created relative to
 * the staging directory with openat/mkdirat/symlinkat, never following a symlink on
 * the way (O_NOFOLLOW); symlink targets must be relative and stay inside the tree.
 *
 * `exec` is answered here without starting Python: the request is forwarded to the
 * runtime server over its Unix socket (newline-delimited JSON), starting the server
 * (this program, `server` subcommand) only when none runs. The start-up protocol is the
 * one of src/sandbox_tools/runtime/client.py. Every other subcommand runs the Python
 * runtime through the bundled loader with an explicit library path, so nothing of the
 * container's libraries is used and nothing leaks into the runtime's children.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <ftw.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__)
#define LOADER "ld-linux-x86-64.so.2"
#elif defined(__aarch64__)
#define LOADER "ld-linux-aarch64.so.1"
#else
#error "unsupported architecture"
#endif

#define BOOTLOADER "runtime"
#define TRAILER_MAGIC "SBXTPAY1"
#define TRAILER_SIZE 72
#define SERVER_START_TIMEOUT_MS 30000
#define QUICK_POLL_NS 4000000L     /* runtime/client.py, QUICK_POLL_S */
#define QUICK_POLL_FOR_US 2000000L /* QUICK_POLL_FOR_S */
#define SLOW_POLL_NS 50000000L     /* SLOW_POLL_S */
#define MAX_REQUEST_BYTES (64 * 1024 * 1024) /* protocol.MAX_FRAME_BYTES */
#define MAX_ENTRY_NAME 8192
#define TREE_DIFFERS 1 /* `verify`: the unpacked tree is not the payload */

static char self_path[4096];

/* ---- small helpers ------------------------------------------------------------------ */

static void die(const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "sandbox-tools launcher: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(70);
}

static uint64_t le64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static uint32_t le32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* CRC-32 (zlib's polynomial), to check what was unpacked and written. Eight bytes per
 * step ("slicing by 8"): the check runs twice over the whole tree on the first start,
 * and a byte at a time it cost a third of the unpack time. */
static uint32_t crc_table[8][256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int s = 1; s < 8; s++)
            crc_table[s][i] = (crc_table[s - 1][i] >> 8) ^ crc_table[0][crc_table[s - 1][i] & 0xff];
}

static uint32_t crc32_update(uint32_t crc, const unsigned char *p, size_t n) {
    crc = ~crc;
    while (n >= 8) {
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                             (uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 |
                      (uint32_t)p[7] << 24;
        crc = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^
              crc_table[5][(lo >> 16) & 0xff] ^ crc_table[4][lo >> 24] ^
              crc_table[3][hi & 0xff] ^ crc_table[2][(hi >> 8) & 0xff] ^
              crc_table[1][(hi >> 16) & 0xff] ^ crc_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) crc = crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

static int read_full(int fd, void *buf, size_t n) {
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static int write_full(int fd, const void *buf, size_t n) {
    const unsigned char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* snprintf that refuses to truncate: a cut-off path would name the wrong file. */
static void join(char *out, size_t n, const char *a, const char *b, int blen) {
    int w = snprintf(out, n, "%s/%.*s", a, blen, b);
    if (w < 0 || (size_t)w >= n) die("path too long: %s/%.*s", a, blen, b);
}

/* ---- LZ4 block decoding ------------------------------------------------------------- */

static int lz4_decode(const unsigned char *src, size_t srclen, unsigned char *dst, size_t dstlen) {
    const unsigned char *ip = src, *iend = src + srclen;
    unsigned char *op = dst, *oend = dst + dstlen;
    while (ip < iend) {
        unsigned token = *ip++;
        size_t literals = token >> 4;
        if (literals == 15) {
            unsigned b;
            do {
                if (ip >= iend) return -1;
                b = *ip++;
                literals += b;
            } while (b == 255);
        }
        if (literals > (size_t)(iend - ip) || literals > (size_t)(oend - op)) return -1;
        memcpy(op, ip, literals);
        op += literals;
        ip += literals;
        if (ip >= iend) break; /* the last sequence carries literals only */
        if (iend - ip < 2) return -1;
        size_t offset = (size_t)ip[0] | ((size_t)ip[1] << 8);
        ip += 2;
        if (offset == 0 || offset > (size_t)(op - dst)) return -1;
        size_t length = token & 15;
        if (length == 15) {
            unsigned b;
            do {
                if (ip >= iend) return -1;
                b = *ip++;
                length += b;
            } while (b == 255);
        }
        length += 4;
        if (length > (size_t)(oend - op)) return -1;
        const unsigned char *match = op - offset;
        if (offset >= length) { /* apart: one copy (most matches, and most of the time) */
            memcpy(op, match, length);
            op += length;
        } else {
            while (length--) *op++ = *match++; /* byte by byte: the match overlaps its copy */
        }
    }
    return op == oend ? 0 : -1;
}

/* ---- unpacking ---------------------------------------------------------------------- */

struct trailer {
    uint64_t payload_offset, payload_size, archive_size, archive_crc;
    char tree_id[33];
};

static void read_trailer(int fd, struct trailer *t) {
    unsigned char raw[TRAILER_SIZE];
    off_t end = lseek(fd, 0, SEEK_END);
    if (end < TRAILER_SIZE || lseek(fd, end - TRAILER_SIZE, SEEK_SET) < 0 ||
        read_full(fd, raw, TRAILER_SIZE) != 0 || memcmp(raw, TRAILER_MAGIC, 8) != 0)
        die("%s carries no payload (truncated or not a sandbox-tools artifact)", self_path);
    t->payload_offset = le64(raw + 8);
    t->payload_size = le64(raw + 16);
    t->archive_size = le64(raw + 24);
    t->archive_crc = le64(raw + 32);
    memcpy(t->tree_id, raw + 40, 32);
    t->tree_id[32] = 0;
    if (t->payload_offset + t->payload_size + TRAILER_SIZE != (uint64_t)end)
        die("%s is truncated or corrupted (payload size mismatch)", self_path);
}

#define HUGE_PAGE (2UL << 20)

/* The archive's memory: its size rounded up to whole huge pages. */
static size_t archive_capacity(const struct trailer *t) {
    return ((size_t)t->archive_size + HUGE_PAGE) & ~(HUGE_PAGE - 1);
}

/* The archive, decompressed into memory of its own (release it with release_archive).
 * The payload is mapped rather than read, and the archive's memory asks for huge pages:
 * on a small VM, faulting in 4 KiB pages one by one for the payload's copy and the
 * archive was a large part of the first start's unpack. */
static unsigned char *decompress_archive(int fd, const struct trailer *t) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t skip = (size_t)t->payload_offset % page;
    size_t mapped_len = skip + t->payload_size;
    unsigned char *mapped = mmap(NULL, mapped_len, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd,
                                 (off_t)(t->payload_offset - skip));
    if (mapped == MAP_FAILED) die("cannot map the payload of %s: %s", self_path, strerror(errno));
    const unsigned char *payload = mapped + skip;
    size_t cap = archive_capacity(t);
    unsigned char *archive =
        mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (archive == MAP_FAILED) die("out of memory unpacking %s", self_path);
    madvise(archive, cap, MADV_HUGEPAGE); /* a hint: without it, ordinary pages */
    size_t in = 0, out = 0;
    while (in < t->payload_size) {
        if (t->payload_size - in < 8) die("corrupted payload block header");
        uint32_t raw_len = le32(payload + in), comp_len = le32(payload + in + 4);
        in += 8;
        if (comp_len > t->payload_size - in || raw_len > t->archive_size - out ||
            lz4_decode(payload + in, comp_len, archive + out, raw_len) != 0)
            die("corrupted payload in %s (bad compressed block)", self_path);
        in += comp_len;
        out += raw_len;
    }
    munmap(mapped, mapped_len);
    if (out != t->archive_size || crc32_update(0, archive, out) != t->archive_crc)
        die("corrupted payload in %s (archive checksum mismatch)", self_path);
    return archive;
}

static void release_archive(unsigned char *archive, const struct trailer *t) {
    munmap(archive, archive_capacity(t));
}

/* Re-read what was just written through the same descriptor and check it. */
static int verify_fd(int fd, uint64_t size, uint64_t expected) {
    if (lseek(fd, 0, SEEK_SET) != 0) return -1;
    unsigned char buf[65536];
    uint32_t h = 0;
    uint64_t total = 0;
    ssize_t r;
    while ((r = read(fd, buf, sizeof buf)) > 0) {
        h = crc32_update(h, buf, (size_t)r);
        total += (uint64_t)r;
    }
    return (r == 0 && total == size && h == expected) ? 0 : -1;
}

/* An entry name: relative, no NUL, no empty, "." or ".." component. */
static int safe_name(const char *name, unsigned len) {
    if (len == 0 || name[0] == '/' || memchr(name, 0, len)) return 0;
    unsigned start = 0;
    for (unsigned i = 0; i <= len; i++) {
        if (i < len && name[i] != '/') continue;
        unsigned part = i - start;
        if (part == 0 || (part == 1 && name[start] == '.') ||
            (part == 2 && name[start] == '.' && name[start + 1] == '.'))
            return 0;
        start = i + 1;
    }
    return 1;
}

/* A symlink target: relative, no NUL, and never climbing above the tree's root. */
static int safe_link_target(const char *name, const char *target, size_t len) {
    if (len == 0 || target[0] == '/' || memchr(target, 0, len)) return 0;
    long depth = 0;
    for (const char *p = name; *p; p++)
        if (*p == '/') depth++; /* the link's directory, counted from the root */
    size_t start = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i < len && target[i] != '/') continue;
        size_t part = i - start;
        if (part == 2 && target[start] == '.' && target[start + 1] == '.') {
            if (--depth < 0) return 0;
        } else if (part > 0 && !(part == 1 && target[start] == '.')) {
            depth++;
        }
        start = i + 1;
    }
    return 1;
}

/* The directory holding `rel` (relative to root_fd), opened without following any
 * symlink on the way; *leaf points at the last component. -1 when it cannot be. */
static int open_parent(int root_fd, char *rel, char **leaf) {
    int fd = fcntl(root_fd, F_DUPFD_CLOEXEC, 0);
    char *p = rel;
    while (fd >= 0) {
        char *slash = strchr(p, '/');
        if (!slash) {
            *leaf = p;
            return fd;
        }
        *slash = 0;
        int next = openat(fd, p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        *slash = '/';
        close(fd);
        fd = next;
        p = slash + 1;
    }
    return -1;
}

/* Archive entries: u8 type ('D','F','L'), u32 mode, u16 path length, path, u64 size,
 * u64 CRC-32 of the content, content. */
struct entry {
    char type;
    uint32_t mode;
    const char *name; /* name_len bytes, not NUL-terminated */
    unsigned name_len;
    const unsigned char *content;
    uint64_t length, checksum;
};

/* The entry at *pos, its bounds and name checked; *pos moves past it. */
static void next_entry(const unsigned char *archive, uint64_t size, uint64_t *pos,
                       struct entry *e) {
    uint64_t at = *pos;
    if (size - at < 23) die("corrupted archive entry header");
    e->type = (char)archive[at];
    e->mode = le32(archive + at + 1);
    e->name_len = (unsigned)archive[at + 5] | ((unsigned)archive[at + 6] << 8);
    at += 7;
    if (size - at < e->name_len + 16ULL || e->name_len == 0 || e->name_len >= MAX_ENTRY_NAME)
        die("corrupted archive entry");
    e->name = (const char *)archive + at;
    if (!safe_name(e->name, e->name_len))
        die("refusing archive entry %.*s: not a plain relative path", (int)e->name_len, e->name);
    at += e->name_len;
    e->length = le64(archive + at);
    e->checksum = le64(archive + at + 8);
    at += 16;
    if (e->length > size - at) die("corrupted archive entry size");
    e->content = archive + at;
    *pos = at + e->length;
}

/* Every entry is created relative to root_fd. */
static void extract(const unsigned char *archive, uint64_t size, int root_fd, const char *root) {
    uint64_t pos = 0;
    char name[MAX_ENTRY_NAME], target[4096];
    struct entry e;
    while (pos < size) {
        next_entry(archive, size, &pos, &e);
        memcpy(name, e.name, e.name_len);
        name[e.name_len] = 0;
        char *leaf;
        int dir_fd = open_parent(root_fd, name, &leaf);
        if (dir_fd < 0)
            die("cannot open the directory of %s/%s: %s (a parent is missing or a symlink)",
                root, name, strerror(errno));
        if (e.type == 'D') {
            if (mkdirat(dir_fd, leaf, 0700) != 0) die("mkdir %s/%s: %s", root, name, strerror(errno));
            int fd = openat(dir_fd, leaf, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (fd < 0 || fchmod(fd, e.mode & 0777) != 0 || close(fd) != 0)
                die("chmod %s/%s: %s", root, name, strerror(errno));
        } else if (e.type == 'L') {
            if (e.length >= sizeof target || !safe_link_target(name, (const char *)e.content, e.length))
                die("refusing symlink %s: its target leaves the tree", name);
            memcpy(target, e.content, e.length);
            target[e.length] = 0;
            if (symlinkat(target, dir_fd, leaf) != 0)
                die("symlink %s/%s: %s", root, name, strerror(errno));
        } else if (e.type == 'F') {
            int fd = openat(dir_fd, leaf, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
            if (fd < 0 || write_full(fd, e.content, e.length) != 0 || fchmod(fd, e.mode & 0777) != 0)
                die("cannot write %s/%s: %s", root, name, strerror(errno));
            if (verify_fd(fd, e.length, e.checksum) != 0)
                die("verification of %s/%s failed after writing it (disk full or corrupted?)",
                    root, name);
            if (close(fd) != 0) die("cannot write %s/%s: %s", root, name, strerror(errno));
        } else {
            die("unknown archive entry type %d", e.type);
        }
        close(dir_fd);
    }
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st;
    (void)ftw;
    return flag == FTW_DP ? rmdir(path) : unlink(path);
}

/* Only ever called on our own staging directory; symlinks are removed, never followed. */
static void remove_tree(const char *path) {
    nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void tree_path(char *out, size_t n, const char *dir, const struct trailer *t) {
    snprintf(out, n, "%s/runtime-%s", dir, t->tree_id);
}

/* 1: the tree is complete and ours; 0: not there (yet). Dies when a tree is there but
 * could have been prepared or changed by someone else: it is never run then. */
static int tree_complete(const char *tree, const struct trailer *t) {
    struct stat st;
    if (lstat(tree, &st) != 0) return 0;
    if (!S_ISDIR(st.st_mode) || (st.st_uid != geteuid() && st.st_uid != 0) || (st.st_mode & 022))
        die("%s is not a directory of uid %u or root that only its owner can write; refusing "
            "to run it. Remove it and run again", tree, (unsigned)geteuid());
    char marker[8192], seen[40] = {0};
    join(marker, sizeof marker, tree, ".complete", 9);
    int fd = open(marker, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t r = (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) ? read(fd, seen, 32) : -1;
    close(fd);
    return r == 32 && memcmp(seen, t->tree_id, 32) == 0;
}

static void self_dir(char *out, size_t n) {
    snprintf(out, n, "%s", self_path);
    char *slash = strrchr(out, '/');
    if (slash == out) slash[1] = 0;
    else if (slash) *slash = 0;
}

/* Staging directories left by a run that crashed mid-unpack (called under the lock). */
static void sweep_stale_staging(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[8192];
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "runtime-", 8) != 0 || !strstr(e->d_name, ".tmp.")) continue;
        join(path, sizeof path, dir, e->d_name, (int)strlen(e->d_name));
        /* Only a directory of ours: another user's (planted where it may write, as in a
         * sticky /tmp) is walked by path, and could be swapped for a link under us. */
        struct stat st;
        if (lstat(path, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid()) continue;
        remove_tree(path);
    }
    closedir(d);
}

static int safe_for_us(const char *dir, char *real);

/* Unpack once; returns the tree directory. */
static void ensure_tree(char *tree, size_t n) {
    int fd = open(self_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) die("cannot open %s: %s", self_path, strerror(errno));
    struct trailer t;
    read_trailer(fd, &t);
    char dir[4096], real[PATH_MAX];
    self_dir(dir, sizeof dir);
    /* Where another user could rename or replace what we unpack (a directory others may
     * write, not sticky, or reached through their link), they could run their own
     * loader in our place: refused, saying where to put the runtime instead. */
    if (!safe_for_us(dir, real))
        die("%s can be changed by users other than root and uid %u: the runtime runs only "
            "from a directory that only they can change; install it elsewhere", dir,
            (unsigned)geteuid());
    tree_path(tree, n, dir, &t);
    if (tree_complete(tree, &t)) {
        close(fd);
        return;
    }
    char lock_path[4200];
    join(lock_path, sizeof lock_path, dir, ".unpack.lock", 12);
    int lock_fd = open(lock_path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (lock_fd < 0)
        die("cannot unpack into %s: %s. The runtime unpacks itself next to its executable on "
            "first run; run it once as the owner of that directory (the injector does)",
            dir, strerror(errno));
    while (flock(lock_fd, LOCK_EX) != 0)
        if (errno != EINTR) die("cannot lock %s: %s", lock_path, strerror(errno));
    if (tree_complete(tree, &t)) { /* a racing first run finished while we waited */
        close(lock_fd);
        close(fd);
        return;
    }
    sweep_stale_staging(dir);
    char staging[8192];
    int w = snprintf(staging, sizeof staging, "%s.tmp.XXXXXX", tree);
    if (w < 0 || (size_t)w >= sizeof staging) die("path too long: %s", tree);
    if (!mkdtemp(staging)) die("cannot create a staging directory in %s: %s", dir, strerror(errno));
    int root_fd = open(staging, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (root_fd < 0) die("cannot open %s: %s", staging, strerror(errno));
    crc_init();
    unsigned char *archive = decompress_archive(fd, &t);
    close(fd);
    extract(archive, t.archive_size, root_fd, staging);
    release_archive(archive, &t);
    int mfd = openat(root_fd, ".complete", O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                     0644);
    if (mfd < 0 || write_full(mfd, t.tree_id, 32) != 0 || close(mfd) != 0)
        die("cannot write %s/.complete: %s", staging, strerror(errno));
    if (fchmod(root_fd, 0755) != 0) die("chmod %s: %s", staging, strerror(errno));
    close(root_fd);
    if (rename(staging, tree) != 0) die("cannot move %s into place: %s", tree, strerror(errno));
    close(lock_fd);
}

/* ---- checking an unpacked tree against the payload ------------------------------- */

/* `verify`, run by the injector before it reuses an install. Later runs check only the
 * tree's owner and mode, and the executable is public: an image can ship it beside a
 * tree of its own making (THREAT_MODEL.md, rule 2). So the tree is compared with this
 * executable's payload, whose bytes the injector has verified: every entry of the
 * payload is there with its type, mode, owner and content or link target, nothing else
 * is, and .complete names this build. Nothing of the tree is run, and no link in it is
 * followed: every entry is reached from the tree's directory with O_NOFOLLOW, files are
 * opened only once their type is known (a planted FIFO is never read). Exits 0 when the
 * tree matches or is not there yet (the first run unpacks it), TREE_DIFFERS naming the
 * first difference otherwise. */

static void tree_differs(const char *tree, const char *name, size_t len, const char *why) {
    fprintf(stderr, "sandbox-tools launcher: %s/", tree);
    for (size_t i = 0; i < len && i < 512; i++) /* a planted name may hold anything */
        fputc(name[i] >= 0x20 && name[i] < 0x7f ? name[i] : '?', stderr);
    fprintf(stderr, " differs from the payload: %s\n", why);
    exit(TREE_DIFFERS);
}

/* musl's memcmp goes a byte at a time: it was a third of `verify`'s time. */
static int same_bytes(const unsigned char *a, const unsigned char *b, size_t n) {
    uint64_t x, y;
    for (; n >= 8; a += 8, b += 8, n -= 8) {
        memcpy(&x, a, 8);
        memcpy(&y, b, 8);
        if (x != y) return 0;
    }
    return memcmp(a, b, n) == 0;
}

static int same_content(int fd, const unsigned char *expected, uint64_t length) {
    unsigned char buf[65536];
    uint64_t at = 0;
    for (;;) {
        ssize_t r = read(fd, buf, sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return r == 0 && at == length;
        if ((uint64_t)r > length - at || !same_bytes(buf, expected + at, (size_t)r)) return 0;
        at += (uint64_t)r;
    }
}

/* What differs between the payload entry `e` and dir_fd/leaf; NULL when nothing. */
static const char *entry_difference(int dir_fd, const char *leaf, const struct entry *e,
                                    uid_t owner) {
    static char why[128];
    struct stat st;
    if (fstatat(dir_fd, leaf, &st, AT_SYMLINK_NOFOLLOW) != 0)
        return errno == ENOENT ? "missing" : strerror(errno);
    if (st.st_uid != owner) {
        snprintf(why, sizeof why, "owned by uid %u, the tree by %u", (unsigned)st.st_uid,
                 (unsigned)owner);
        return why;
    }
    if (e->type == 'L') {
        char target[4096];
        if (!S_ISLNK(st.st_mode)) return "not a symlink";
        ssize_t n = readlinkat(dir_fd, leaf, target, sizeof target);
        if (n < 0 || (uint64_t)n != e->length || memcmp(target, e->content, e->length) != 0)
            return "another link target";
        return NULL;
    }
    if (e->type == 'D' && !S_ISDIR(st.st_mode)) return "not a directory";
    if (e->type == 'F' && !S_ISREG(st.st_mode)) return "not a regular file";
    if (e->type != 'D' && e->type != 'F') die("unknown archive entry type %d", e->type);
    if ((st.st_mode & 07777) != (e->mode & 0777)) {
        snprintf(why, sizeof why, "mode %04o, not %04o", (unsigned)(st.st_mode & 07777),
                 (unsigned)(e->mode & 0777));
        return why;
    }
    if (e->type == 'D') return NULL;
    if ((uint64_t)st.st_size != e->length) return "another size";
    int fd = openat(dir_fd, leaf, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return strerror(errno);
    struct stat opened;
    const char *difference = NULL;
    if (fstat(fd, &opened) != 0 || opened.st_dev != st.st_dev || opened.st_ino != st.st_ino)
        difference = "replaced while it was checked";
    else if (fgetxattr(fd, "security.capability", NULL, 0) >= 0)
        difference = "carries file capabilities";
    else if (!same_content(fd, e->content, e->length))
        difference = "another content";
    close(fd);
    return difference;
}

struct indexed {
    const char *name;
    unsigned len;
    char type;
};

static int by_name(const void *a, const void *b) {
    const struct indexed *x = a, *y = b;
    int c = memcmp(x->name, y->name, x->len < y->len ? x->len : y->len);
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

/* Every entry in the tree's directory `path` (path_len bytes; dir_fd is consumed) must be
 * one of the payload's. Only the payload's directories are entered, so the walk is no
 * deeper than the payload, whatever was planted. */
static void no_extra_entries(const char *tree, int dir_fd, char *path, size_t path_len,
                             const struct indexed *index, size_t count) {
    DIR *d = fdopendir(dir_fd);
    if (!d) die("cannot list %s/%.*s: %s", tree, (int)path_len, path, strerror(errno));
    struct dirent *de;
    while ((errno = 0, de = readdir(d)) != NULL) {
        const char *n = de->d_name;
        if (!strcmp(n, ".") || !strcmp(n, "..") || (path_len == 0 && !strcmp(n, ".complete")))
            continue;
        size_t n_len = strlen(n), len = path_len ? path_len + 1 + n_len : n_len;
        if (len >= MAX_ENTRY_NAME) tree_differs(tree, n, n_len, "not in the payload");
        if (path_len) path[path_len] = '/';
        memcpy(path + (path_len ? path_len + 1 : 0), n, n_len);
        struct indexed key = {path, (unsigned)len, 0};
        const struct indexed *found = bsearch(&key, index, count, sizeof *index, by_name);
        if (!found) tree_differs(tree, path, len, "not in the payload");
        if (found->type == 'D') {
            int sub = openat(dirfd(d), n, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub < 0) tree_differs(tree, path, len, "not a directory we can open");
            no_extra_entries(tree, sub, path, len, index, count);
        }
    }
    if (errno) die("cannot list %s/%.*s: %s", tree, (int)path_len, path, strerror(errno));
    closedir(d);
}

static void verify_tree(void) {
    int fd = open(self_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) die("cannot open %s: %s", self_path, strerror(errno));
    struct trailer t;
    read_trailer(fd, &t);
    char dir[4096], tree[8192];
    self_dir(dir, sizeof dir);
    tree_path(tree, sizeof tree, dir, &t);
    struct stat st;
    if (lstat(tree, &st) != 0) {
        if (errno == ENOENT) exit(0);
        die("cannot inspect %s: %s", tree, strerror(errno));
    }
    int root_fd = open(tree, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (root_fd < 0 || fstat(root_fd, &st) != 0) tree_differs(tree, ".", 1, "not a directory");
    if ((st.st_uid != geteuid() && st.st_uid != 0) || (st.st_mode & 07777) != 0755)
        tree_differs(tree, ".", 1, "not a directory of ours or root's of mode 0755");
    uid_t owner = st.st_uid;
    char seen[32];
    int mfd = openat(root_fd, ".complete", O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (mfd < 0 || fstat(mfd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != owner ||
        (st.st_mode & 07022) || st.st_size != 32 || read_full(mfd, seen, 32) != 0 ||
        memcmp(seen, t.tree_id, 32) != 0)
        tree_differs(tree, ".complete", 9, "not this build's marker");
    close(mfd);
    crc_init();
    unsigned char *archive = decompress_archive(fd, &t);
    close(fd);
    size_t count = 0;
    char name[MAX_ENTRY_NAME];
    struct entry e;
    for (uint64_t pos = 0; pos < t.archive_size; count++) {
        next_entry(archive, t.archive_size, &pos, &e);
        memcpy(name, e.name, e.name_len);
        name[e.name_len] = 0;
        char *leaf;
        int dir_fd = open_parent(root_fd, name, &leaf);
        const char *why = dir_fd < 0 ? "a parent is missing or not a directory"
                                     : entry_difference(dir_fd, leaf, &e, owner);
        if (dir_fd >= 0) close(dir_fd);
        if (why) tree_differs(tree, e.name, e.name_len, why);
    }
    struct indexed *index = malloc((count ? count : 1) * sizeof *index);
    if (!index) die("out of memory checking %s", tree);
    size_t i = 0;
    for (uint64_t pos = 0; pos < t.archive_size; i++) {
        next_entry(archive, t.archive_size, &pos, &e);
        index[i] = (struct indexed){e.name, e.name_len, e.type};
    }
    qsort(index, count, sizeof *index, by_name);
    no_extra_entries(tree, root_fd, name, 0, index, count);
    free(index);
    release_archive(archive, &t);
    exit(0);
}

/* ---- running the Python runtime ----------------------------------------------------- */

/* Variables the bundled loader or C library obey that the caller's environment may hold:
 * an engine's exec passes the image's ENV, and the image must not load its code into the
 * runtime (LD_PRELOAD, LD_AUDIT; a locale whose charset needs one of the image's gconv
 * modules). Each is taken away and saved under the name of the launcher's own variable,
 * an underscore and its name, so that the commands the runtime starts get it back
 * (runtime/child_env.py); the runtime itself runs in the C locale. */
static const char *const LOADER_VARIABLES[] = {"LD_PRELOAD", "LD_AUDIT", "LD_DEBUG", "LD_DEBUG_OUTPUT", "LD_PROFILE", "LD_PROFILE_OUTPUT", "GCONV_PATH", "LOCPATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_COLLATE", "LC_MESSAGES", "LC_MONETARY", "LC_NUMERIC", "LC_TIME", "LC_ADDRESS", "LC_IDENTIFICATION", "LC_MEASUREMENT", "LC_NAME", "LC_PAPER", "LC_TELEPHONE"};

static void keep_loader_variables_from_the_runtime(void) {
    for (size_t n = 0; n < sizeof LOADER_VARIABLES / sizeof *LOADER_VARIABLES; n++) {
        char saved[64];
        snprintf(saved, sizeof saved, "%s_%s", "SANDBOX_TOOLS_SELF", LOADER_VARIABLES[n]);
        const char *value = getenv(LOADER_VARIABLES[n]);
        if (value) setenv(saved, value, 1);
        else unsetenv(saved);
        unsetenv(LOADER_VARIABLES[n]);
    }
    setenv("LC_ALL", "C", 1); /* built into the C library: no file of the image is read */
}

static void run_python(int argc, char **argv) {
    char tree[8192], loader[8300], boot[8300], libpath[17000];
    ensure_tree(tree, sizeof tree);
    snprintf(loader, sizeof loader, "%s/lib/" LOADER, tree);
    snprintf(boot, sizeof boot, "%s/" BOOTLOADER, tree);
    snprintf(libpath, sizeof libpath, "%s/lib:%s/_internal", tree, tree);
    /* The bootloader would re-execute itself after exporting LD_LIBRARY_PATH, bypassing
     * the bundled loader; tell it that it is already the restarted process. */
    setenv("_PYI_ARCHIVE_FILE", boot, 1);
    setenv("_PYI_PARENT_PROCESS_LEVEL", "-1", 1);
    setenv("_PYI_LINUX_PROCESS_NAME", "sandbox-tools", 1);
    setenv("SANDBOX_TOOLS_SELF", self_path, 1);
    keep_loader_variables_from_the_runtime();
    char **args = calloc((size_t)argc + 8, sizeof(char *));
    if (!args) die("out of memory");
    int i = 0;
    args[i++] = loader;
    args[i++] = "--library-path";
    args[i++] = libpath;
    args[i++] = "--inhibit-cache";
    args[i++] = "--argv0";
    args[i++] = boot;
    args[i++] = boot;
    for (int a = 1; a < argc; a++) args[i++] = argv[a];
    args[i] = NULL;
    execv(loader, args);
    die("cannot run %s: %s", loader, strerror(errno));
}

/* ---- the `exec` fast path ----------------------------------------------------------- */

/* The request's top-level "id", echoed in our own error responses as the Python CLI does:
 * a plain integer, or a string of printable ASCII without escapes; otherwise null. */
static char request_id[128] = "null";
/* Whether the request has an "id" member at all: without one it is a notification, which
 * the server answers with nothing, and `exec` then prints nothing (inspect_ai's
 * exec_notification treats any output as a failure). */
static int request_has_id = 0;

static const char *skip_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')) p++;
    return p;
}

static const char *skip_string(const char *p, const char *end) { /* p at the opening quote */
    for (p++; p < end; p++) {
        if (*p == '\\') p++;
        else if (*p == '"') return p + 1;
    }
    return NULL;
}

static const char *skip_value(const char *p, const char *end) {
    int depth = 0;
    while (p < end) {
        if (*p == '"') {
            if (!(p = skip_string(p, end))) return NULL;
            if (depth == 0) return p;
            continue;
        }
        if (*p == '{' || *p == '[') depth++;
        else if (*p == '}' || *p == ']') {
            if (depth == 0) return p;
            if (--depth == 0) return p + 1;
        } else if (depth == 0 && (*p == ',')) return p;
        p++;
    }
    return p;
}

/* The top-level "id" of the JSON object in p[0..len): 0 if it has none, 1 if it is a
 * plain integer or a string of printable ASCII without escapes (copied to `out`, as its
 * JSON text), 2 if it is anything else. */
static int find_id(const char *p, size_t len, char *out, size_t out_size) {
    const char *end = p + len;
    p = skip_ws(p, end);
    if (p >= end || *p++ != '{') return 0;
    while ((p = skip_ws(p, end)) < end && *p == '"') {
        const char *key = p;
        if (!(p = skip_string(p, end))) return 0;
        int is_id = p - key == 4 && memcmp(key, "\"id\"", 4) == 0;
        p = skip_ws(p, end);
        if (p >= end || *p++ != ':') return 0;
        p = skip_ws(p, end);
        const char *value = p;
        if (!(p = skip_value(p, end))) return is_id ? 2 : 0;
        if (is_id) {
            size_t n = (size_t)(p - value);
            while (n > 0 && (value[n - 1] == ' ' || value[n - 1] == '\t')) n--;
            int ok = n > 0 && n < out_size;
            int quoted = ok && value[0] == '"';
            for (size_t i = 0; ok && i < n; i++) {
                char c = value[i];
                ok = quoted ? (c >= 0x20 && c < 0x7f && c != '\\' && (c != '"' || i == 0 || i == n - 1))
                            : ((c >= '0' && c <= '9') || (c == '-' && i == 0));
            }
            if (ok && !quoted) { /* JSON's integers: no lone "-", no leading zero */
                size_t digits = value[0] == '-';
                ok = n > digits && (value[digits] != '0' || n == digits + 1);
            }
            if (!ok || (quoted && (n < 2 || value[n - 1] != '"'))) return 2;
            memcpy(out, value, n);
            out[n] = 0;
            return 1;
        }
        p = skip_ws(p, end);
        if (p < end && *p == ',') p++;
    }
    return 0;
}

static void remember_request_id(const char *p, size_t len) {
    char found[sizeof request_id];
    int kind = find_id(p, len, found, sizeof found);
    request_has_id = kind != 0;
    if (kind == 1) memcpy(request_id, found, sizeof found);
}

/* Where FAIL goes instead of answering and exiting: the `stdio` bridge answers each
 * request with the reason and keeps serving. */
static jmp_buf *failure_jump;

static void json_error(const char *message) {
    /* A JSON-RPC error response; the message is escaped by hand. */
    if (failure_jump) longjmp(*failure_jump, 1); /* the message is in err_buf */
    printf("{\"jsonrpc\":\"2.0\",\"id\":%s,\"error\":{\"code\":-32098,\"message\":\"",
           request_id);
    for (const unsigned char *p = (const unsigned char *)message; *p; p++) {
        if (*p == '"' || *p == '\\') printf("\\%c", *p);
        else if (*p < 0x20) printf("\\u%04x", *p);
        else putchar(*p);
    }
    fputs("\"}}\n", stdout);
    fflush(stdout);
    exit(0);
}

static char err_buf[16384];
#define FAIL(...) do { snprintf(err_buf, sizeof err_buf, __VA_ARGS__); json_error(err_buf); } while (0)

/* Whether a directory may hold what we make: ours or root's, and nobody else may rename
 * or replace its entries (not writable by others, unless sticky). */
static int dir_safe(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) return 0;
    if (st.st_uid != 0 && st.st_uid != geteuid()) return 0;
    return !(st.st_mode & 022) || (st.st_mode & S_ISVTX);
}

/* Whether nobody but root and us can change what `dir` names: every directory on the way
 * is dir_safe, and every link on the way is root's or ours, in such a directory (an
 * image's TMPDIR may be the agent's link, repointed at will). Its real path goes to
 * `real`. runtime/paths.py has the same rule. */
static int safe_for_us(const char *dir, char *real) {
    char rest[2 * PATH_MAX], current[PATH_MAX] = "/";
    if (dir[0] != '/' || strlen(dir) >= PATH_MAX) return 0;
    snprintf(rest, sizeof rest, "%s", dir);
    if (!dir_safe("/")) return 0;
    for (int hops = 0;;) {
        char *part = rest;
        while (*part == '/') part++;
        if (!*part) break;
        char *next = strchr(part, '/');
        size_t len = next ? (size_t)(next - part) : strlen(part);
        char name[NAME_MAX + 1], candidate[PATH_MAX];
        if (len > NAME_MAX) return 0;
        memcpy(name, part, len);
        name[len] = 0;
        memmove(rest, part + len, strlen(part + len) + 1);
        if (strcmp(name, ".") == 0) continue;
        if (strcmp(name, "..") == 0) {
            char *slash = strrchr(current, '/');
            if (slash == current) current[1] = 0;
            else *slash = 0;
            continue;
        }
        int w = snprintf(candidate, sizeof candidate, "%s/%s", strcmp(current, "/") ? current : "", name);
        if (w < 0 || (size_t)w >= sizeof candidate) return 0;
        struct stat st;
        if (lstat(candidate, &st) != 0) return 0;
        if (S_ISLNK(st.st_mode)) {
            if (++hops > 40 || (st.st_uid != 0 && st.st_uid != geteuid())) return 0;
            char target[PATH_MAX], joined[2 * PATH_MAX];
            ssize_t n = readlink(candidate, target, sizeof target - 1);
            if (n <= 0) return 0;
            target[n] = 0;
            if (target[0] == '/') snprintf(current, sizeof current, "/");
            if ((size_t)snprintf(joined, sizeof joined, "%s/%s", target, rest) >= sizeof joined) return 0;
            snprintf(rest, sizeof rest, "%s", joined);
            continue;
        }
        if (!dir_safe(candidate)) return 0;
        snprintf(current, sizeof current, "%s", candidate);
    }
    snprintf(real, PATH_MAX, "%s", current);
    return 1;
}

/* The default server directory is keyed by this build's tree id: a client only ever
 * talks to a server of its own build, never to another version's, a stale one, or one
 * another runtime of the same uid left in a shared directory. It lies beside the
 * executable when that directory is ours alone (an install by root, run by root), so
 * that no other user can prepare it first; otherwise in the first of $TMPDIR, /tmp,
 * /var/tmp and /dev/shm where no other user can replace what we make (an image may set
 * TMPDIR to a directory the agent owns), where a directory someone else made is refused.
 * main() exports it, so the Python side (bridge, server) uses exactly this directory.
 * -1 when there is no such place. */
static int server_dir(char *out, size_t n) {
    const char *configured = getenv("SANDBOX_TOOLS_DIR");
    if (configured && *configured) {
        snprintf(out, n, "%s", configured);
        return 0;
    }
    int fd = open(self_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) die("cannot open %s: %s", self_path, strerror(errno));
    struct trailer t;
    read_trailer(fd, &t);
    close(fd);
    char home[4096], real[PATH_MAX];
    snprintf(home, sizeof home, "%s", self_path);
    char *slash = strrchr(home, '/');
    struct stat st;
    if (slash && slash != home && (size_t)(slash - home) < 64) {
        *slash = 0;
        if (lstat(home, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == geteuid() &&
            !(st.st_mode & 022) && access(home, W_OK) == 0 && safe_for_us(home, real)) {
            snprintf(out, n, "%s/.run-%u-%.16s", home, (unsigned)geteuid(), t.tree_id);
            return 0;
        }
    }
    const char *tmpdir = getenv("TMPDIR");
    const char *candidates[] = {tmpdir && *tmpdir ? tmpdir : "/tmp", "/tmp", "/var/tmp", "/dev/shm"};
    for (size_t i = 0; i < sizeof candidates / sizeof *candidates; i++) {
        if (safe_for_us(candidates[i], real)) {
            snprintf(out, n, "%s/sandbox-tools-%u-%.16s", strcmp(real, "/") ? real : "",
                     (unsigned)geteuid(), t.tree_id);
            return 0;
        }
    }
    return -1;
}

#define NO_SERVER_DIR                                                                        \
    "no place for the runtime server's directory that only root and this user can change " \
    "(tried $TMPDIR, /tmp, /var/tmp, /dev/shm); set SANDBOX_TOOLS_DIR to a directory of "    \
    "your own"

/* The caller's working directory, as a protocol.CWD_OPTION line (empty if it has none
 * that can travel): a job started without `cwd` begins there. */
static size_t cwd_option(char *out, size_t n) {
    char cwd[4097];
    if (!getcwd(cwd, sizeof cwd) || strchr(cwd, '\n') || strchr(cwd, '\r')) return 0;
    int w = snprintf(out, n, "#cwd %s\n", cwd);
    return (w > 0 && (size_t)w < n) ? (size_t)w : 0;
}

static void mkdirs_parent(const char *path) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p == '/') {
            *p = 0;
            mkdir(buf, 0755);
            *p = '/';
        }
    }
}

static void ensure_private_dir(const char *dir) {
    if (mkdir(dir, 0700) != 0) {
        if (errno == ENOENT) {
            mkdirs_parent(dir);
            if (mkdir(dir, 0700) != 0 && errno != EEXIST)
                FAIL("cannot create server directory %s: %s", dir, strerror(errno));
        } else if (errno != EEXIST) {
            FAIL("cannot create server directory %s: %s; set SANDBOX_TOOLS_DIR to a writable "
                 "directory", dir, strerror(errno));
        }
    }
    struct stat st;
    if (lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        FAIL("server directory %s exists but is not a directory (or is a symlink)", dir);
    if (st.st_uid != geteuid())
        FAIL("server directory %s is owned by uid %u, not by us (uid %u); refusing to use it. "
             "Set SANDBOX_TOOLS_DIR to a directory of our own", dir, (unsigned)st.st_uid,
             (unsigned)geteuid());
    if ((st.st_mode & 077) && chmod(dir, 0700) != 0)
        FAIL("cannot make server directory %s private: %s", dir, strerror(errno));
}

/* -1: nothing to connect to; -2: refused to trust what is there; >= 0: connected. */
static int try_connect(const char *sock_path) {
    struct stat st;
    if (lstat(sock_path, &st) != 0) return -1;
    if (!S_ISSOCK(st.st_mode) || st.st_uid != geteuid())
        FAIL("%s is not a socket owned by uid %u; refusing to talk to it. Remove it or point "
             "SANDBOX_TOOLS_DIR elsewhere", sock_path, (unsigned)geteuid());
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s", sock_path);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int server_running(const char *dir) {
    char lock[4200];
    snprintf(lock, sizeof lock, "%s/server.lock", dir);
    int fd = open(lock, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    int held = flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    close(fd);
    return held;
}

static void spawn_server(const char *dir) {
    char log_path[4200];
    snprintf(log_path, sizeof log_path, "%s/server.log", dir);
    pid_t pid = fork();
    if (pid < 0) FAIL("cannot start the runtime server: fork: %s", strerror(errno));
    if (pid == 0) {
        setsid();
        signal(SIGPIPE, SIG_DFL); /* the stdio bridge ignores it; the server's children must not */
        int null_fd = open("/dev/null", O_RDONLY);
        int log_fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (null_fd >= 0) dup2(null_fd, 0);
        if (log_fd >= 0) {
            dup2(log_fd, 1);
            dup2(log_fd, 2);
        }
        for (int fd = 3; fd < 1024; fd++) close(fd);
        char *args[] = {self_path, "server", "--dir", (char *)dir, NULL};
        execv(self_path, args);
        _exit(127);
    }
}

/* The start lock while this process holds it: a failure that the `stdio` bridge
 * survives must release it, or every other client would wait for it forever. */
static int held_start_lock = -1;

static void release_start_lock(void) {
    if (held_start_lock >= 0) close(held_start_lock);
    held_start_lock = -1;
}

static int connect_or_start(const char *dir, const char *sock_path) {
    int fd = try_connect(sock_path);
    if (fd >= 0) return fd;
    char lock_path[4200];
    snprintf(lock_path, sizeof lock_path, "%s/start.lock", dir);
    int lock_fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lock_fd < 0) FAIL("cannot open %s: %s", lock_path, strerror(errno));
    held_start_lock = lock_fd;
    while (flock(lock_fd, LOCK_EX) != 0 && errno == EINTR) {
    }
    fd = try_connect(sock_path);
    if (fd >= 0) {
        release_start_lock();
        return fd;
    }
    if (!server_running(dir)) {
        unlink(sock_path); /* nobody serves this directory: whatever is left is stale */
        char tree[8192];
        ensure_tree(tree, sizeof tree);
        spawn_server(dir);
    }
    /* Often while a start may still be quick (about 0.1 s from an unpacked tree), rarely
     * after: a step of 50 ms from the start made a first answer wait up to 50 ms past the
     * server being ready (runtime/client.py polls the same way). */
    struct timespec delay = {0, 1000000};
    long waited_us = 0;
    while (waited_us < SERVER_START_TIMEOUT_MS * 1000L) {
        fd = try_connect(sock_path);
        if (fd >= 0) {
            release_start_lock();
            return fd;
        }
        nanosleep(&delay, NULL);
        waited_us += delay.tv_nsec / 1000;
        long cap = waited_us < QUICK_POLL_FOR_US ? QUICK_POLL_NS : SLOW_POLL_NS;
        delay.tv_nsec = delay.tv_nsec * 2 < cap ? delay.tv_nsec * 2 : cap;
        /* Reap a server that failed at once, so it does not linger as a zombie. */
        waitpid(-1, NULL, WNOHANG);
    }
    release_start_lock();
    FAIL("the runtime server did not start within %d s; see its log at %s/server.log",
         SERVER_START_TIMEOUT_MS / 1000, dir);
    return -1;
}

/* The server's directory and socket path, or -1 with the reason in err_buf (no place
 * for the directory; a socket path too long for sockaddr_un). */
static int locate_server(char *dir, size_t dir_size, char *sock_path, size_t sock_size) {
    if (server_dir(dir, dir_size) != 0) {
        snprintf(err_buf, sizeof err_buf, "%s", NO_SERVER_DIR);
        return -1;
    }
    int n = snprintf(sock_path, sock_size, "%s/server.sock", dir);
    if (n < 0 || (size_t)n >= sock_size ||
        (size_t)n >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
        snprintf(err_buf, sizeof err_buf, "server directory %s is too long for a Unix socket "
                 "path; set SANDBOX_TOOLS_DIR to a shorter directory", dir);
        return -1;
    }
    return 0;
}

static char *read_request(int argc, char **argv, size_t *len) {
    if (argc > 2) {
        *len = strlen(argv[2]);
        char *copy = malloc(*len + 2);
        if (!copy) FAIL("out of memory");
        memcpy(copy, argv[2], *len);
        return copy;
    }
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap);
    if (!buf) FAIL("out of memory");
    for (;;) {
        /* Keep room for a useful read and the two bytes the caller appends. */
        if (cap - n < 4096) {
            if (cap >= MAX_REQUEST_BYTES) FAIL("request larger than %d bytes", MAX_REQUEST_BYTES);
            cap *= 2;
            buf = realloc(buf, cap);
            if (!buf) FAIL("out of memory");
        }
        ssize_t r = read(0, buf + n, cap - n - 2);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        n += (size_t)r;
    }
    *len = n;
    return buf;
}

static void exec_request(int argc, char **argv) {
    size_t len;
    char *request = read_request(argc, argv, &len);
    int blank = 1;
    for (size_t i = 0; i < len; i++) {
        if (request[i] == '\n' || request[i] == '\r') request[i] = ' '; /* one frame per line */
        if (request[i] != ' ' && request[i] != '\t') blank = 0;
    }
    if (blank) {
        fputs("{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32700,\"message\":"
              "\"Parse error: empty request\"}}\n", stdout);
        exit(0);
    }
    request[len++] = '\n';
    remember_request_id(request, len);
    char dir[4096], sock_path[4200];
    if (locate_server(dir, sizeof dir, sock_path, sizeof sock_path) != 0) json_error(err_buf);
    ensure_private_dir(dir);
    int fd = connect_or_start(dir, sock_path);
    /* A caller whose exec output is capped (inspect_ai) says so; the server then holds a
     * larger response and answers with its first piece (protocol.RESPONSE_LIMIT_OPTION). */
    const char *limit = getenv("INSPECT_SANDBOX_JSON_RPC_RESPONSE_MAX_BYTES");
    size_t limit_len = limit ? strlen(limit) : 0;
    int limit_ok = limit_len > 0 && limit_len < 19;
    for (size_t i = 0; limit_ok && i < limit_len; i++) limit_ok = limit[i] >= '0' && limit[i] <= '9';
    if (limit_ok) {
        char option[64];
        int n = snprintf(option, sizeof option, "#max-response-bytes %s\n", limit);
        if (write_full(fd, option, (size_t)n) != 0)
            FAIL("cannot send the request to the runtime server: %s", strerror(errno));
    }
    char cwd_line[4200];
    size_t cwd_len = cwd_option(cwd_line, sizeof cwd_line);
    if (cwd_len && write_full(fd, cwd_line, cwd_len) != 0)
        FAIL("cannot send the request to the runtime server: %s", strerror(errno));
    if (write_full(fd, request, len) != 0)
        FAIL("cannot send the request to the runtime server: %s", strerror(errno));
    /* One request per connection: the half-close lets the server finish and close, so a
     * notification (which gets no response) ends at once instead of waiting forever. */
    shutdown(fd, SHUT_WR);
    size_t cap = 65536, n = 0;
    char *response = malloc(cap);
    if (!response) FAIL("out of memory");
    for (;;) {
        if (n == cap) {
            cap *= 2;
            response = realloc(response, cap);
            if (!response) FAIL("out of memory");
        }
        ssize_t r = read(fd, response + n, cap - n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        char *newline = memchr(response + n, '\n', (size_t)r);
        n += (size_t)r;
        if (newline) {
            n = (size_t)(newline - response) + 1;
            break;
        }
    }
    close(fd);
    if (n == 0 && !request_has_id) exit(0); /* a notification, delivered: no response */
    if (n == 0 || response[n - 1] != '\n')
        FAIL("the runtime server sent no response; see %s/server.log", dir);
    write_full(1, response, n);
    exit(0);
}

/* ---- the `stdio` channel ------------------------------------------------------------- */

/* `stdio` is answered here as well: requests from stdin go to the server over one
 * connection and its responses and messages come back, in both directions at once and
 * in any order, as runtime/cli.py's bridge does where there is no launcher (the staticx
 * format, a checkout). In Python it was a second interpreter's start on every new
 * channel (70-100 ms of a handle's first answer) and, on a first start, a second
 * interpreter competing with the server's for the cores. The server checks every
 * request itself (`exec` forwards them unread too); the bridge only reads each one's
 * "id", so that a request still waiting when the connection is lost gets an error
 * instead of silence, and the next request starts a fresh server. */

#define LOST "connection to the runtime server was lost"
#define RUNTIME_SERVER_LOST "runtime_server_lost" /* protocol.RUNTIME_SERVER_LOST */
#define MAX_WAITING 65536 /* requests in flight the bridge remembers to answer if lost */

struct line_buffer {
    char *data;
    size_t len, cap;
    int oversized; /* the line in progress went past the limit: dropped up to its end */
};

static char refusal[sizeof err_buf]; /* why no server can be reached from here at all */
static struct line_buffer from_server; /* the connection's: what a lost one left is dropped */
static char server_sock_path[4200];
static char server_dir_path[4096];
static int server_fd = -1;
static int stdin_open = 1;
static char **waiting;
static size_t waiting_count;

static void emit(const char *data, size_t n) {
    if (write_full(1, data, n) != 0) exit(0); /* the host is gone: nothing to answer */
}

static void emit_escaped(const char *text) {
    char out[3 * sizeof err_buf];
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)text; *p && n < sizeof out - 8; p++) {
        if (*p == '"' || *p == '\\') {
            out[n++] = '\\';
            out[n++] = (char)*p;
        } else if (*p < 0x20 || *p >= 0x7f) {
            n += (size_t)snprintf(out + n, 8, "\\u%04x", *p);
        } else {
            out[n++] = (char)*p;
        }
    }
    emit(out, n);
}

/* runtime/cli.py's _unavailable: INTERNAL_ERROR, the reason in the message and data. */
static void emit_unavailable(const char *id, const char *reason) {
    char head[256];
    int n = snprintf(head, sizeof head,
                     "{\"jsonrpc\":\"2.0\",\"id\":%s,\"error\":{\"code\":-32098,\"message\":"
                     "\"runtime server unavailable: ", id);
    emit(head, (size_t)n);
    emit_escaped(reason);
    emit("\",\"data\":\"", 10);
    emit_escaped(reason);
    emit("\"}}\n", 4);
}

static void forget_waiting(const char *id) {
    for (size_t i = 0; i < waiting_count; i++) {
        if (strcmp(waiting[i], id) == 0) {
            free(waiting[i]);
            waiting[i] = waiting[--waiting_count];
            return;
        }
    }
}

static void connection_lost(void) {
    if (server_fd >= 0) close(server_fd);
    server_fd = -1;
    from_server.len = 0; /* half a line of the lost server must not start the next one's */
    from_server.oversized = 0;
    for (size_t i = 0; i < waiting_count; i++) {
        emit_unavailable(waiting[i], LOST);
        free(waiting[i]);
    }
    waiting_count = 0;
    if (stdin_open) { /* a subscription to host messages lived on it: the host subscribes again */
        static const char note[] = "{\"jsonrpc\":\"2.0\",\"method\":\"" RUNTIME_SERVER_LOST
                                   "\",\"params\":{\"reason\":\"" LOST "\"}}\n";
        emit(note, sizeof note - 1);
    }
}

/* A connection to the server, started if none runs; -1 with the reason in err_buf. */
static int server_connection(void) {
    if (server_fd >= 0) return server_fd;
    if (refusal[0]) {
        snprintf(err_buf, sizeof err_buf, "%s", refusal);
        return -1;
    }
    jmp_buf failed;
    if (setjmp(failed)) {
        failure_jump = NULL;
        release_start_lock();
        return -1;
    }
    failure_jump = &failed;
    ensure_private_dir(server_dir_path);
    int fd = connect_or_start(server_dir_path, server_sock_path);
    failure_jump = NULL;
    char cwd_line[4200]; /* where jobs started without `cwd` begin */
    size_t cwd_len = cwd_option(cwd_line, sizeof cwd_line);
    if (cwd_len && write_full(fd, cwd_line, cwd_len) != 0) {
        close(fd);
        snprintf(err_buf, sizeof err_buf, "cannot send to the runtime server: %s", strerror(errno));
        return -1;
    }
    server_fd = fd;
    return fd;
}

static void send_request(char *line, size_t len) {
    size_t start = 0;
    while (start < len && (line[start] == ' ' || line[start] == '\t' || line[start] == '\r')) start++;
    if (start == len) return; /* a blank line */
    char id[128];
    int kind = find_id(line, len, id, sizeof id);
    line[len++] = '\n'; /* the buffer keeps room for it */
    for (int attempt = 0; attempt < 2; attempt++) {
        int fd = server_connection();
        if (fd < 0) {
            if (kind == 1) emit_unavailable(id, err_buf);
            else if (kind == 2) emit_unavailable("null", err_buf);
            return;
        }
        int tracked = kind == 1 && waiting_count < MAX_WAITING;
        if (tracked) {
            char *copy = strdup(id);
            if (!copy) die("out of memory");
            waiting[waiting_count++] = copy;
        }
        if (write_full(fd, line, len) == 0) return;
        /* The server is gone: what waited on it is lost; this one is sent again once. */
        if (tracked) free(waiting[--waiting_count]);
        connection_lost();
        snprintf(err_buf, sizeof err_buf, "%s", LOST);
        if (attempt == 1 && kind) emit_unavailable(kind == 1 ? id : "null", err_buf);
    }
}

/* Appends what `fd` has to `b`; each complete line goes to `done`. 0 at the end. */
static int read_lines(int fd, struct line_buffer *b, size_t limit, void (*done)(char *, size_t),
                      void (*too_long)(void)) {
    if (b->cap - b->len < 65536 + 2) {
        size_t cap = b->cap ? b->cap * 2 : 131072;
        char *grown = realloc(b->data, cap);
        if (!grown) die("out of memory");
        b->data = grown;
        b->cap = cap;
    }
    ssize_t r = read(fd, b->data + b->len, b->cap - b->len - 2);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) return 1;
    if (r <= 0) return 0;
    size_t scanned = b->len, start = 0;
    b->len += (size_t)r;
    for (char *nl; (nl = memchr(b->data + scanned, '\n', b->len - scanned));) {
        size_t end = (size_t)(nl - b->data);
        if (b->oversized) b->oversized = 0;
        else done(b->data + start, end - start);
        start = scanned = end + 1;
    }
    if (start) { /* a long line in progress is not moved onto itself at every read */
        memmove(b->data, b->data + start, b->len - start);
        b->len -= start;
    }
    if (b->len > limit) { /* drop what is here; the rest of the line follows */
        if (!b->oversized && too_long) too_long();
        b->oversized = 1;
        b->len = 0;
    }
    if (b->cap > 4 * 131072 && b->len < b->cap / 4) { /* a large line passed: give it back */
        size_t cap = b->len + 131072;
        char *shrunk = realloc(b->data, cap);
        if (shrunk) {
            b->data = shrunk;
            b->cap = cap;
        }
    }
    return 1;
}

static void request_too_long(void) {
    static const char answer[] =
        "{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32600,\"message\":"
        "\"Invalid Request: larger than 67108864 bytes\"}}\n";
    emit(answer, sizeof answer - 1);
}

static void got_response(char *line, size_t len) {
    char id[128];
    if (find_id(line, len, id, sizeof id) == 1) forget_waiting(id);
    line[len++] = '\n';
    emit(line, len);
}

static void stdio_bridge(void) {
    signal(SIGPIPE, SIG_IGN);
    waiting = calloc(MAX_WAITING, sizeof *waiting);
    if (!waiting) die("out of memory");
    if (locate_server(server_dir_path, sizeof server_dir_path, server_sock_path,
                      sizeof server_sock_path) != 0) {
        /* every request gets the reason: the host reads responses, not stderr */
        snprintf(refusal, sizeof refusal, "%s", err_buf);
    }
    /* Connect (and so start the server) before the first request arrives. */
    if (server_connection() < 0) fprintf(stderr, "sandbox-tools runtime: %s\n", err_buf);
    struct line_buffer in = {0};
    for (;;) {
        struct pollfd fds[2] = {{.fd = stdin_open ? 0 : -1, .events = POLLIN},
                                {.fd = server_fd, .events = POLLIN}};
        if (fds[0].fd < 0 && fds[1].fd < 0) break;
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR) continue;
            die("poll: %s", strerror(errno));
        }
        if (fds[1].fd >= 0 && fds[1].revents) {
            /* A frame is at most MAX_REQUEST_BYTES either way (the Python bridge's
             * read_frame): a longer line is no answer, and its server is taken as lost. */
            if (!read_lines(server_fd, &from_server, MAX_REQUEST_BYTES, got_response,
                            NULL) ||
                from_server.oversized) {
                connection_lost();
                continue;
            }
        }
        if (fds[0].fd >= 0 && fds[0].revents) {
            if (!read_lines(0, &in, MAX_REQUEST_BYTES, send_request, request_too_long)) {
                if (in.len && !in.oversized) send_request(in.data, in.len); /* no newline */
                in.len = 0;
                stdin_open = 0;
                /* Half-close: the server answers what it has, then closes its side. */
                if (server_fd >= 0) shutdown(server_fd, SHUT_WR);
            }
        }
    }
    exit(refusal[0] != 0);
}

int main(int argc, char **argv) {
    ssize_t len = readlink("/proc/self/exe", self_path, sizeof self_path - 1);
    if (len > 0) {
        self_path[len] = 0;
    } else if (argv[0] && strchr(argv[0], '/') && realpath(argv[0], self_path)) {
        /* no /proc: fall back to the path we were started by */
    } else {
        die("cannot find my own path (/proc is not mounted and argv[0] has no '/')");
    }
    if (argc >= 2 && strcmp(argv[1], "exec") != 0 && strcmp(argv[1], "unpack") != 0 &&
        strcmp(argv[1], "verify") != 0 && strcmp(argv[1], "stdio") != 0) {
        const char *configured = getenv("SANDBOX_TOOLS_DIR");
        if (!configured || !*configured) { /* the Python side must use our directory */
            char dir[4096];
            if (server_dir(dir, sizeof dir) != 0) die(NO_SERVER_DIR);
            setenv("SANDBOX_TOOLS_DIR", dir, 1);
        }
    }
    if (argc >= 2 && strcmp(argv[1], "exec") == 0) exec_request(argc, argv);
    if (argc == 2 && strcmp(argv[1], "unpack") == 0) { /* the installer, before another user runs us */
        char tree[8192];
        ensure_tree(tree, sizeof tree);
        return 0;
    }
    if (argc == 2 && strcmp(argv[1], "verify") == 0) verify_tree(); /* the installer, before reuse */
    if (argc == 2 && strcmp(argv[1], "stdio") == 0) stdio_bridge();
    run_python(argc, argv);
    return 127;
}
