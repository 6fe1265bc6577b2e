# SPDX-License-Identifier: BSD-3-Clause
"""Helper of tty.sh: ^C typed on a terminal reaches COMMAND once.

The terminal sends SIGINT to its whole foreground process group, dlock and
COMMAND alike; dlock must not forward that one again. Runs
`dlock run NAME -- python3 <counter>` on a new pseudo-terminal, types ^C once
COMMAND is ready, and exits with dlock's exit status, which is COMMAND's:
40 + the number of SIGINTs it got (41 is right: a code no Python error gives,
where an uncaught exception exits 1), or 100+ when something else went
wrong. argv: dlock binary, URL, lock name.
"""
import os
import pty
import select
import sys
import time

COUNTER = r'''
import os, select, signal, sys, time
# Count deliveries, not handler runs: Python runs a handler once for several
# signals that arrived between two bytecodes, but its wakeup fd gets a byte
# for each one the process received.
r, w = os.pipe()
os.set_blocking(w, False)
signal.set_wakeup_fd(w)
signal.signal(signal.SIGINT, lambda s, f: None)
print("ready", flush=True)
got, first = 0, None
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    # After the first SIGINT, give a (wrongly) forwarded second one time to
    # arrive; a slow machine can only hide a double delivery, never fake one.
    if first is not None and time.monotonic() > first + 0.5:
        break
    if select.select([r], [], [], 0.01)[0]:
        n = os.read(r, 64).count(bytes([signal.SIGINT]))
        got += n
        if n and first is None:
            first = time.monotonic()
sys.exit(40 + got if got else 101)
'''


def main():
    dlock, url, name = sys.argv[1:4]
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(dlock, [dlock, "--url", url, "run", name, "--",
                         sys.executable, "-c", COUNTER])
    out = b""
    deadline = time.monotonic() + 60
    typed = False
    while time.monotonic() < deadline:
        r, _, _ = select.select([fd], [], [], 0.05)
        if r:
            try:
                data = os.read(fd, 4096)
            except OSError:  # EIO: the terminal's other side is closed
                break
            if not data:
                break
            out += data
        if not typed and b"ready" in out:
            os.write(fd, b"\x03")
            typed = True
    else:
        os.kill(pid, 9)
    _, status = os.waitpid(pid, 0)
    sys.stdout.write(out.decode(errors="replace").replace("\r", ""))
    sys.exit(os.waitstatus_to_exitcode(status) if typed else 102)


main()
