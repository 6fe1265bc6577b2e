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

/* The one writer of the thread's message (dlock__fail in the library). */
int dlock_backend_fail(int code, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(last_message, sizeof(last_message), fmt, ap);
    va_end(ap);
    return code;
}

const char *dlock_version(void)
{
    return DLOCK_VERSION;
}
