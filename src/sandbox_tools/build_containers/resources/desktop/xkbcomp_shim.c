/*
 * Preloaded into the desktop's X server only. The server compiles its keymap with
 *
 *   execl("/bin/sh", "sh", "-c", "\"/usr/bin/xkbcomp\" -w 1 \"-R...\" -xkm \"-\" ...", NULL)
 *
 * (xkbcomp's path is compiled into it). That one command is run here as the tree's
 * `desktop xkbcomp ARG...` instead: the image may have no shell, and its shell and its
 * xkbcomp are not ours to run. The command's words are split as the server writes them
 * (double quotes around words, no escapes); a command of any other shape, or with a
 * character a shell would read as more than a quote, goes to execl as it was asked.
 *
 * The tree is found from /proc/self/exe: the server runs as the tree's loader.
 *
 * The compiled keymap goes to /tmp/server-<display>.xkm, a name any user of the
 * sandbox can take first (the compiler then fails, and the server with it). Where
 * SANDBOX_TOOLS_DESKTOP_KEYMAPS names a directory (the desktop's private one), that file
 * is there instead: the compiler's output argument, and the server's fopen and unlink of
 * that name, are all moved to it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PREFIX "\"/usr/bin/xkbcomp\" "
#define MAX_WORDS 64
#define KEYMAPS_VARIABLE "SANDBOX_TOOLS_DESKTOP_KEYMAPS"
#define KEYMAP_PREFIX "/tmp/server-"
#define KEYMAP_SUFFIX ".xkm"

/* The private place of the server's compiled keymap `path`, or `path` itself. */
static const char *keymap(const char *path, char *moved, size_t size) {
    const char *directory = getenv(KEYMAPS_VARIABLE);
    size_t length = strlen(path), prefix = strlen(KEYMAP_PREFIX), suffix = strlen(KEYMAP_SUFFIX);
    if (directory == NULL || directory[0] != '/' || length <= prefix + suffix ||
        strncmp(path, KEYMAP_PREFIX, prefix) != 0 ||
        strcmp(path + length - suffix, KEYMAP_SUFFIX) != 0)
        return path;
    for (size_t i = prefix; i < length - suffix; i++)
        if (path[i] < '0' || path[i] > '9') return path;
    int written = snprintf(moved, size, "%s/%s", directory, path + strlen("/tmp/"));
    return written > 0 && (size_t)written < size ? moved : path;
}

FILE *fopen(const char *path, const char *mode) {
    static FILE *(*real)(const char *, const char *);
    if (real == NULL) real = (FILE * (*)(const char *, const char *)) dlsym(RTLD_NEXT, "fopen");
    char moved[PATH_MAX];
    return real(keymap(path, moved, sizeof moved), mode);
}

int unlink(const char *path) {
    static int (*real)(const char *);
    if (real == NULL) real = (int (*)(const char *))dlsym(RTLD_NEXT, "unlink");
    char moved[PATH_MAX];
    return real(keymap(path, moved, sizeof moved));
}

/* The words of `command` after xkbcomp's own, into words[2...]; 0 if it is not of the
 * shape the server writes. */
static int split(char *command, char **words) {
    int n = 2;
    char *in = command + strlen(PREFIX), *out = in;
    while (*in != '\0') {
        while (*in == ' ') in++;
        if (*in == '\0') break;
        if (n >= MAX_WORDS - 1) return 0;
        words[n++] = out;
        int quoted = 0;
        for (; *in != '\0' && (quoted || *in != ' '); in++) {
            if (*in == '"') {
                quoted = !quoted;
                continue;
            }
            if (strchr("\\$`'|&;<>()*?[]{}~#\n", *in) != NULL && !quoted) return 0;
            if (strchr("\\$`\n", *in) != NULL) return 0;
            *out++ = *in;
        }
        if (quoted) return 0;
        if (*in == ' ') in++;
        *out++ = '\0';
    }
    words[n] = NULL;
    return n;
}

int execl(const char *path, const char *arg, ...) {
    char *argv[MAX_WORDS];
    int argc = 0;
    va_list ap;
    va_start(ap, arg);
    for (const char *a = arg; a != NULL && argc < MAX_WORDS - 1; a = va_arg(ap, const char *))
        argv[argc++] = (char *)a;
    va_end(ap);
    argv[argc] = NULL;
    if (argc == MAX_WORDS - 1) {
        errno = E2BIG;
        return -1;
    }
    if (strcmp(path, "/bin/sh") == 0 && argc == 3 && strcmp(argv[1], "-c") == 0 &&
        strncmp(argv[2], PREFIX, strlen(PREFIX)) == 0) {
        char tree[PATH_MAX];
        ssize_t len = readlink("/proc/self/exe", tree, sizeof tree - 1);
        char *command = strdup(argv[2]);
        char *words[MAX_WORDS];
        if (len > 0 && command != NULL && split(command, words)) {
            tree[len] = '\0';
            char *slash = strrchr(tree, '/');
            if (slash != NULL && (size_t)(slash - tree) + sizeof "/desktop" <= sizeof tree) {
                strcpy(slash + 1, "desktop");
                words[0] = "desktop";
                words[1] = "xkbcomp";
                char moved[PATH_MAX];
                for (int i = 2; words[i] != NULL; i++) {
                    const char *mapped = keymap(words[i], moved, sizeof moved);
                    if (mapped != words[i] && (words[i] = strdup(mapped)) == NULL) return -1;
                }
                execv(tree, words);
                return -1;
            }
        }
        free(command);
    }
    return execv(path, argv);
}
