#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# ^C on a terminal: COMMAND gets the SIGINT once (from the terminal, which
# signals the whole foreground process group), not a second time from dlock.
# The pseudo-terminal comes from Python's pty module (python3 is among the
# packages scripts/deps.sh installs).
. "$(dirname "$0")/lib.sh"

command -v python3 >/dev/null || { fail "python3 is not installed"; finish; }
# 41: COMMAND counted one SIGINT (40 + count); any Python error exits 1.
expect 41 "^C reaches COMMAND exactly once" \
    python3 "$(dirname "$0")/tty_sigint.py" "$DLOCK" "$URL" "$(name c)"
finish
