/*
 * The desktop add-on's entry point: a static launcher (no libc needed in the sandbox).
 *
 *   desktop PROGRAM [ARG...]   PROGRAM: Xvfb, xkbcomp, xdotool, twm or xterm
 *   desktop shell              the user's shell ($SHELL, else /bin/sh), outside the tree
 *
 * Each program is the tree's own (bin/), run through the tree's glibc loader (its argv[0]
 * its absolute path: xterm refuses to start with any other), which
 * searches the tree alone: no library cache of the image's (--inhibit-cache), no preload
 * list and no system directories (the assembly made the loader and every object in the
 * tree so), so a library the image plants never loads into the desktop. The programs'
 * data is the tree's too: Xlib's locale tables (XLOCALEDIR), glibc's C.UTF-8 (LOCPATH),
 * the fonts (FONTCONFIG_FILE), xterm's resources (XFILESEARCHPATH), the keymaps (Xvfb's
 * -xkbdir), twm's configuration (-f).
 *
 * Xvfb compiles its keymap by running `/bin/sh -c '"/usr/bin/xkbcomp" ...'`, a path
 * compiled into it; the tree's xkbcomp-shim.so, preloaded into Xvfb only, runs that one
 * command as `desktop xkbcomp ...` instead, so no shell of the image's is needed or used.
 *
 * `shell` is what the terminal runs: the tree's variables are taken away first, so that
 * what the user starts from it is the image's own program in the image's own setting.
 *
 * A program started by the runtime server (SANDBOX_TOOLS_DESKTOP_PARENT names it, and it
 * is our parent) is killed by the kernel when the server ends (PR_SET_PDEATHSIG, kept
 * across exec), so a server killed without its shutdown leaves no X server running; the
 * window manager and the terminal end with their display.
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <sys/prctl.h>
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

static const char *const PROGRAMS[] = {"Xvfb", "xkbcomp", "xdotool", "twm", "xterm"};
#define PARENT_VARIABLE "SANDBOX_TOOLS_DESKTOP_PARENT"
static const char *const TREE_VARIABLES[] = {"XLOCALEDIR", "LOCPATH", "FONTCONFIG_FILE",
                                             "XFILESEARCHPATH", PARENT_VARIABLE};
#define COUNT(a) (sizeof(a) / sizeof(a)[0])
#define EXTRA_ARGS 16

static char self[PATH_MAX], dir[PATH_MAX];

static char *joined(const char *a, const char *b) {
    size_t size = strlen(a) + strlen(b) + 1;
    char *out = malloc(size);
    if (out == NULL) {
        fputs("desktop: out of memory\n", stderr);
        exit(127);
    }
    snprintf(out, size, "%s%s", a, b);
    return out;
}

static int usage(void) {
    fputs("usage: desktop Xvfb|xkbcomp|xdotool|twm|xterm [ARG...] | desktop shell\n", stderr);
    return 2;
}

/* Ended with the runtime server that started us, if it did (not when the agent runs the
 * launcher from the terminal, where the variable is inherited but the parent is not it). */
static void end_with_the_server(void) {
    const char *named = getenv(PARENT_VARIABLE);
    if (named == NULL) return;
    char *end;
    long server = strtol(named, &end, 10);
    if (*end != '\0' || server <= 1 || getppid() != (pid_t)server) return;
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != (pid_t)server) _exit(1);
}

static int shell(void) {
    for (size_t i = 0; i < COUNT(TREE_VARIABLES); i++) unsetenv(TREE_VARIABLES[i]);
    const char *chosen = getenv("SHELL");
    if (chosen == NULL || chosen[0] != '/' || access(chosen, X_OK) != 0) chosen = "/bin/sh";
    const char *name = strrchr(chosen, '/') + 1;
    execl(chosen, name, (char *)NULL);
    fprintf(stderr, "desktop: cannot run the shell %s: %s\n", chosen, strerror(errno));
    return 127;
}

int main(int argc, char **argv) {
    if (argc < 2) return usage();
    if (strcmp(argv[1], "shell") == 0) return argc == 2 ? shell() : usage();
    const char *program = NULL;
    for (size_t i = 0; i < COUNT(PROGRAMS); i++)
        if (strcmp(argv[1], PROGRAMS[i]) == 0) program = PROGRAMS[i];
    if (program == NULL) return usage();
    end_with_the_server();

    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) {
        fprintf(stderr, "desktop: cannot read /proc/self/exe: %s\n", strerror(errno));
        return 127;
    }
    self[len] = '\0';
    memcpy(dir, self, (size_t)len + 1);
    char *slash = strrchr(dir, '/');
    if (slash == NULL) return 127;
    slash[1] = '\0';

    setenv("XLOCALEDIR", joined(dir, "share/locale"), 1);
    setenv("LOCPATH", joined(dir, "locale"), 1);
    setenv("FONTCONFIG_FILE", joined(dir, "fonts.conf"), 1);
    setenv("XFILESEARCHPATH", joined(dir, "app-defaults/%N"), 1);

    char **args = calloc((size_t)argc + EXTRA_ARGS, sizeof *args);
    if (args == NULL) return 127;
    int n = 0;
    char *loader = joined(dir, LOADER);
    args[n++] = loader;
    args[n++] = "--inhibit-cache"; /* the image's /etc/ld.so.cache names its libraries */
    args[n++] = "--library-path";
    args[n++] = joined(dir, "lib");
    if (strcmp(program, "Xvfb") == 0) {
        args[n++] = "--preload";
        args[n++] = joined(dir, "lib/xkbcomp-shim.so");
    }
    args[n++] = joined(joined(dir, "bin/"), program);
    if (strcmp(program, "Xvfb") == 0) {
        args[n++] = "-xkbdir";
        args[n++] = joined(dir, "share/xkb");
        args[n++] = "-fp";
        args[n++] = "built-ins";
    } else if (strcmp(program, "twm") == 0) {
        args[n++] = "-f";
        args[n++] = joined(dir, "twmrc");
    }
    for (int i = 2; i < argc; i++) args[n++] = argv[i];
    args[n] = NULL;
    execv(loader, args);
    fprintf(stderr, "desktop: cannot run %s: %s\n", loader, strerror(errno));
    return 127;
}
