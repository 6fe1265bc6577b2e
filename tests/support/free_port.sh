# SPDX-License-Identifier: BSD-3-Clause
# free_port: a free loopback port below the kernel's ephemeral range, so that
# no outgoing connection takes it before a server binds it (as
# tests/support/test.c picks them). Sourced by the shell tests
# (tests/cli/lib.sh, tests/examples/async_examples.sh).
free_port() {
    python3 -c '
import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
while True:
    s = socket.socket()
    try:
        p = random.randrange(10000, max(low, 12000))
        s.bind(("127.0.0.1", p))
        print(p)
        break
    except OSError:
        pass
    finally:
        s.close()'
}
