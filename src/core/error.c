/* SPDX-License-Identifier: BSD-3-Clause */
#include <stdarg.h>
#include <stdio.h>

#include "core/error.h"

/* One table for the codes and their text (see DLOCK_ERRNO_MAP). */
const char *dlock_strerror(int code)
{
    switch (code) {
#define DLOCK_STRERROR_GEN(name, value, text)                                                     \
    case DLOCK_##name:                                                                             \
        return text;
        DLOCK_ERRNO_MAP(DLOCK_STRERROR_GEN)
#undef DLOCK_STRERROR_GEN
    default:
        return "unknown error";
    }
}

static _Thread_local char last_message[512];

const char *dlock_error_message(void)
{
    return last_message;
}

void dlock__clear_error(void)
{
    last_message[0] = '\0';
}

/*
 * The one writer of the thread's message (dlock__fail in the library).
 * Messages carry what servers say (a Redis error reply, etcd's
 * grpc_message), and a hostile or broken server could put terminal escape
 * sequences, carriage returns or newlines there, for a program to print
 * to a terminal or a log: every control character (below 0x20, and DEL)
 * becomes '?', so dlock_error_message() never holds one.
 */
int dlock_backend_fail(int code, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(last_message, sizeof(last_message), fmt, ap);
    va_end(ap);
    for (char *p = last_message; *p != '\0'; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = '?';
    return code;
}

const char *dlock_version(void)
{
    return DLOCK_VERSION;
}
