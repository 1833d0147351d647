/* Preloaded inside gVisor sandboxes (sandbox-kernel).
 *
 * The runsc shipped by Debian 12 (release 20221219) rejects statx() flags it
 * does not know with EINVAL, among them AT_NO_AUTOMOUNT (0x800), which GNU
 * coreutils 9 passes on every call: `ls`, `stat`, `cp -a` then fail with
 * "Invalid argument".  Nothing automounts inside a sandbox, so the flag is a
 * no-op there; this wrapper clears it and calls the real syscall.
 */
#define _GNU_SOURCE
#include <sys/syscall.h>
#include <unistd.h>

struct statx;

int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *buf) {
    return (int)syscall(SYS_statx, dirfd, path, flags & ~0x800, mask, buf);
}
