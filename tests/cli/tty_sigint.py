"""Helper of tty.sh: ^C typed on a terminal reaches COMMAND once.

The terminal sends SIGINT to its whole foreground process group, dlock and
COMMAND alike; dlock must not forward that one again. Runs
`dlock run NAME -- python3 <counter>` on a new pseudo-terminal, types ^C once
COMMAND is ready, and exits with dlock's exit status, which is COMMAND's:
the number of SIGINTs it got (1 is right), or 100+ when something else went
wrong. argv: dlock binary, URL, lock name.
"""
import os
import pty
import select
import sys
import time

COUNTER = r'''
import signal, sys, time
got = []
signal.signal(signal.SIGINT, lambda s, f: got.append(time.monotonic()))
print("ready", flush=True)
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    # After the first SIGINT, give a (wrongly) forwarded second one time to
    # arrive; a slow machine can only hide a double delivery, never fake one.
    if got and time.monotonic() > got[0] + 0.5:
        break
    time.sleep(0.01)
sys.exit(len(got) if got else 101)
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
