#define _GNU_SOURCE
#include <stdio.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <linux/fs.h>
int main(int c, char **v) {
  for (;;) {
    syscall(SYS_renameat2, AT_FDCWD, v[1], AT_FDCWD, v[2], RENAME_EXCHANGE);
    if (c > 3) usleep(atoi(v[3]));
  }
}
