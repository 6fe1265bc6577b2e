/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dlock demo: the payout scenario of the seeds, run for real.
 *
 * The program dlock-demo (demo/program.c) runs it, and `dlock demo ...` runs
 * dlock-demo. The demo is an application of libdlock: it uses only the
 * public API in <dlock/dlock.h>.
 */
#ifndef DLOCK_DEMO_H
#define DLOCK_DEMO_H

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Run a demo. argv[0] is the program's name (not used), argv[1] the
 * scenario ("payout"), the rest its options (see docs/demo.md or
 * `dlock demo --help`).
 *
 * Returns the process exit status: 0 when the run went through and the
 * `fence` mode (if it ran) paid no order twice; 1 when the `fence` mode lost
 * money; 64 for usage errors; 69 when the lock server or redis-server is not
 * available; 70 for any other failure; 130 when interrupted by SIGINT/SIGTERM.
 *
 * The values of --url and --store may hold passwords: they are copied and
 * blanked ('*') in argv, whose text is the process's command line
 * (/proc/PID/cmdline, ps), readable by every user; the copies are wiped
 * before they are freed.
 *
 * Forks one process per instance and, without --url, a redis-server. It
 * installs handlers for SIGINT, SIGTERM and SIGPIPE while it runs and restores
 * the previous ones before returning. Not thread-safe: call it from the main
 * thread of a process that has no other threads.
 */
int dlock_demo_main(int argc, char **argv);

#ifdef __cplusplus
}
#endif

#endif /* DLOCK_DEMO_H */
