/*
 * The browser add-on's entry point: a static launcher (no libc needed in the sandbox).
 *
 * It runs the bundled Chromium through the bundled glibc loader, which sits beside the
 * browser: Chromium finds its ICU data and .pak files relative to /proc/self/exe, and
 * that is the loader's path once the loader runs it. The launcher is also the browser's
 * --browser-subprocess-path, so renderer and GPU processes start through it too (a bare
 * relaunch of /proc/self/exe would start the loader without a program). Only the browser
 * process gets our switches (--no-zygote: the zygote forks itself from /proc/self/exe;
 * it needs --no-sandbox). FONTCONFIG_FILE names the bundled fonts.conf unless the
 * caller set one: without a configuration Chromium aborts, even for --dump-dom.
 * The loader searches the tree alone: no library cache of the image's (--inhibit-cache),
 * no preload list and no system directories (the assembly made the loader and every
 * object in the tree so), so a library the image plants never loads into the browser.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__)
#define LOADER "ld-linux-x86-64.so.2"
#elif defined(__aarch64__)
#define LOADER "ld-linux-aarch64.so.1"
#else
#error "unsupported architecture"
#endif
#define BROWSER "chromium-headless-shell"

static char self[PATH_MAX], dir[PATH_MAX];

static char *joined(const char *a, const char *b) {
    size_t size = strlen(a) + strlen(b) + 1;
    char *out = malloc(size);
    if (out == NULL) {
        fputs("chrome launcher: out of memory\n", stderr);
        exit(127);
    }
    snprintf(out, size, "%s%s", a, b);
    return out;
}

int main(int argc, char **argv) {
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) {
        fprintf(stderr, "chrome launcher: cannot read /proc/self/exe: %s\n", strerror(errno));
        return 127;
    }
    self[len] = '\0';
    memcpy(dir, self, (size_t)len + 1);
    char *slash = strrchr(dir, '/');
    if (slash == NULL) return 127;
    slash[1] = '\0';

    setenv("FONTCONFIG_FILE", joined(dir, "fonts.conf"), 0);

    int subprocess = 0;
    for (int i = 1; i < argc; i++)
        if (strncmp(argv[i], "--type=", 7) == 0) subprocess = 1;

    char **args = calloc((size_t)argc + 10, sizeof *args);
    if (args == NULL) return 127;
    int n = 0;
    char *loader = joined(dir, LOADER);
    args[n++] = loader;
    args[n++] = "--inhibit-cache"; /* the image's /etc/ld.so.cache names its libraries */
    args[n++] = "--library-path";
    args[n++] = joined(dir, "lib");
    args[n++] = joined(dir, BROWSER);
    if (!subprocess) {
        args[n++] = "--no-sandbox";
        args[n++] = "--no-zygote";
        args[n++] = joined("--browser-subprocess-path=", self);
    }
    for (int i = 1; i < argc; i++) args[n++] = argv[i];
    args[n] = NULL;
    execv(loader, args);
    fprintf(stderr, "chrome launcher: cannot run %s: %s\n", loader, strerror(errno));
    return 127;
}
