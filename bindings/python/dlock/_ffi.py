# SPDX-License-Identifier: BSD-3-Clause
"""The C API of libdlock as cffi sees it (ABI mode: no compiler at install).

The declarations are include/dlock/dlock.h's, written out (cffi cannot read
the header's macros); tests/test_binding.py compiles the header and checks
every struct's size and field offsets against these.
"""
import ctypes.util
import os
import subprocess

import cffi

CDEF = """
const char *dlock_strerror(int code);
const char *dlock_error_message(void);
const char *dlock_version(void);

typedef struct dlock_client dlock_client;
typedef struct dlock_lock dlock_lock;

typedef void (*dlock_log_cb)(int level, const char *message, void *payload);
typedef struct {
    int phase;
    uint64_t id;
    const char *call;
    const char *name;
    size_t count;
    int64_t duration_us;
    int result;
} dlock_trace_event;
typedef void (*dlock_trace_cb)(const dlock_trace_event *ev, void *payload);

typedef struct {
    unsigned version;
    int64_t connect_timeout_ms;
    int64_t command_timeout_ms;
    const char *key_prefix;
    const char *client_name;
    dlock_log_cb log;
    void *log_payload;
    int log_level;
    dlock_trace_cb trace;
    void *trace_payload;
    unsigned flags;
} dlock_client_options;

int dlock_client_options_init(dlock_client_options *opts, unsigned version);
int dlock_client_open(dlock_client **out, const char *url, const dlock_client_options *opts);
void dlock_client_free(dlock_client *client);
void dlock_client_interrupt(dlock_client *client);
const char *dlock_client_backend(const dlock_client *client);

typedef void (*dlock_lost_cb)(dlock_lock *lock, int reason, void *payload);

typedef struct {
    unsigned version;
    int64_t wait_ms;
    int64_t lease_ms;
    int auto_renew;
    dlock_lost_cb on_lost;
    void *payload;
    int kind;
    const char *owner;
    int reentrant;
    int permits;
    const char *label;
} dlock_acquire_options;

int dlock_acquire_options_init(dlock_acquire_options *opts, unsigned version);
int dlock_acquire(dlock_lock **out, dlock_client *client, const char *name,
                  const dlock_acquire_options *opts);
uint64_t dlock_lock_fence(const dlock_lock *lock);
const char *dlock_lock_name(const dlock_lock *lock);
int dlock_lock_extend(dlock_lock *lock, int64_t lease_ms);
int dlock_lock_check(dlock_lock *lock);
int dlock_lock_lost(const dlock_lock *lock);
int64_t dlock_lock_valid_ms(const dlock_lock *lock);
int dlock_release(dlock_lock *lock);
int dlock_lock_kind(const dlock_lock *lock);
int dlock_lock_downgrade(dlock_lock *lock);
int dlock_semaphore_set_permits(dlock_client *client, const char *name, int permits);
int dlock_acquire_multi(dlock_lock **out, dlock_client *client, const char *const *names,
                        size_t n, const dlock_acquire_options *opts);
size_t dlock_lock_count(const dlock_lock *lock);
const char *dlock_lock_name_at(const dlock_lock *lock, size_t i);
uint64_t dlock_lock_fence_at(const dlock_lock *lock, size_t i);
int dlock_campaign(dlock_lock **out, dlock_client *client, const char *name,
                   const char *identity, const dlock_acquire_options *opts);
int dlock_resign(dlock_lock *leader);

typedef struct {
    int held;
    uint64_t fence;
    int64_t ttl_ms;
    char identity[257];
} dlock_leader_info;
int dlock_leader(dlock_leader_info *out, dlock_client *client, const char *name);

typedef struct {
    int held;
    uint64_t fence;
    int64_t ttl_ms;
    int has_holder;
    char host[256];
    int64_t pid;
    int64_t start_ms;
    char label[129];
    int holders;
    int kind;
} dlock_lock_info;
int dlock_status(dlock_lock_info *out, dlock_client *client, const char *name);

typedef struct dlock_request_handle dlock_request_handle;
typedef void (*dlock_acquire_cb)(int rc, dlock_lock *lock, void *arg);
typedef void (*dlock_done_cb)(int rc, void *arg);
int dlock_acquire_async(dlock_request_handle **out, dlock_client *client, const char *name,
                        const dlock_acquire_options *opts, dlock_acquire_cb cb, void *arg);
int dlock_release_async(dlock_request_handle **out, dlock_lock *lock, dlock_done_cb cb,
                        void *arg);
int dlock_extend_async(dlock_request_handle **out, dlock_lock *lock, int64_t lease_ms,
                       dlock_done_cb cb, void *arg);
int dlock_request_cancel(dlock_request_handle *req);
int dlock_async_fd(dlock_client *client);
int64_t dlock_async_timeout_ms(dlock_client *client);
int dlock_async_process(dlock_client *client);
"""

CLIENT_OPTIONS_VERSION = 4
CLIENT_NO_THREADS = 1  # DLOCK_CLIENT_NO_THREADS
ACQUIRE_OPTIONS_VERSION = 2
WAIT_FOREVER = -1

ffi = cffi.FFI()
ffi.cdef(CDEF)


def _candidates():
    """Where libdlock may be: $DLOCK_LIBRARY, pkg-config's libdir, the
    loader's search path."""
    env = os.environ.get("DLOCK_LIBRARY")
    if env:
        yield env
        return
    try:
        libdir = subprocess.run(["pkg-config", "--variable=libdir", "dlock"],
                                capture_output=True, text=True, check=True).stdout.strip()
        if libdir:
            yield os.path.join(libdir, "libdlock.so.0")
            yield os.path.join(libdir, "libdlock.so")
    except (OSError, subprocess.CalledProcessError):
        pass
    found = ctypes.util.find_library("dlock")
    if found:
        yield found
    yield "libdlock.so.0"


def _load():
    tried = []
    for path in _candidates():
        try:
            # Global: the backend modules dlock loads (zk.so, postgres.so,
            # mysql.so) find the library's calls among the process's.
            return ffi.dlopen(path, ffi.RTLD_NOW | ffi.RTLD_GLOBAL)
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
    raise ImportError(
        "dlock: cannot load libdlock, the C library this package binds: tried "
        + "; ".join(tried)
        + ". Install it (the libdlock0 Debian package, or `make install`), or set "
        "DLOCK_LIBRARY to the path of libdlock.so.")


lib = _load()
