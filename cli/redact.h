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
 * secrets of every URL in it redacted: in "scheme://" followed by anything
 * up to the next white space or control character, whatever comes before
 * the last '@' loses its password, "user:***@" (or "***@" without a ':',
 * where what is given may be a password alone), and so does the value of
 * each query parameter whose name ends in "password", "passwd", "secret",
 * "token" or "key" (password=, sentinel_password=, sslpassword=,
 * key_secret=; any case): "?password=***&db=2", as the library's messages. A URL without an '@'
 * but with "..." (cut short, as the library shows a long lock name) is
 * redacted up to the "...": the '@' may have been cut off. Redact before
 * cutting, never after, for the same reason. Returns the length the whole
 * copy needs, as snprintf.
 */
size_t cli_redact(char *out, size_t size, const char *text);

/*
 * Copy text to out (size bytes, NUL-terminated) as a terminal may show it:
 * each byte of a control character (C0, DEL, C1, the Unicode line
 * separators and bidirectional controls) and each byte that is not part of
 * valid UTF-8 as "\xNN", a backslash as "\\", every other character (é
 * too) as it is. A name or a server's text can then neither move the
 * cursor, retitle the window (ESC ] 0 ; ... BEL) nor forge a line of
 * output. Only whole units are copied: a cut never leaves half an escape or
 * half a character. Returns the length the whole copy needs, as snprintf.
 */
size_t cli_escape(char *out, size_t size, const char *text);

/*
 * cli_redact, then cli_escape: what every line of text the command prints
 * does with a name, a holder's host or label, an argument it echoes, or a
 * server's or the library's text. (JSON output escapes by JSON's rules.)
 */
size_t cli_printable(char *out, size_t size, const char *text);

#endif
