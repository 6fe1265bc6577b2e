/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Passwords out of everything the `dlock` command and its demo print.
 *
 * A URL may hold a password, and a mistyped command line may put one
 * anywhere: `run --url=...` (--url goes before run), `--uri=...`, a URL
 * given where NAME or COMMAND goes. Every message the two print is passed
 * through here, so that no echoed argument shows one.
 */
#ifndef DLOCK_CLI_REDACT_H
#define DLOCK_CLI_REDACT_H

#include <stddef.h>

/*
 * Copy text to out (size bytes, NUL-terminated, cut if need be), with the
 * user information of every URL in it redacted: in "scheme://" followed by
 * anything up to the next white space or control character, whatever comes
 * before the last '@' loses its password, "user:***@" (or "***@" without a
 * ':', where what is given may be a password alone). A URL without an '@'
 * but with "..." (cut short, as the library shows a long lock name) is
 * redacted up to the "...": the '@' may have been cut off. Redact before
 * cutting, never after, for the same reason. Returns the length the whole
 * copy needs, as snprintf.
 */
size_t cli_redact(char *out, size_t size, const char *text);

#endif
