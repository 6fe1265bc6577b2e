/* SPDX-License-Identifier: BSD-3-Clause */
/* The Lua scripts beside this file, embedded at build time with their SHA1
 * (scripts/embed_lua.cmake) so that they run with EVALSHA. */
#ifndef DLOCK_REDIS_SCRIPTS_H
#define DLOCK_REDIS_SCRIPTS_H

#include <stddef.h>

typedef struct {
    const char *name;
    const char *body;
    size_t len;
    const char *sha1; /* 40 hex digits */
} dlock__redis_script;

extern const dlock__redis_script dlock__redis_script_acquire;
extern const dlock__redis_script dlock__redis_script_release;
extern const dlock__redis_script dlock__redis_script_mutex_leave;
extern const dlock__redis_script dlock__redis_script_extend;
extern const dlock__redis_script dlock__redis_script_status;

/* The lock family (redis_family.c); family_renew renews every kind. */
extern const dlock__redis_script dlock__redis_script_excl_acquire;
extern const dlock__redis_script dlock__redis_script_excl_release;
extern const dlock__redis_script dlock__redis_script_leave;
extern const dlock__redis_script dlock__redis_script_rw_acquire;
extern const dlock__redis_script dlock__redis_script_rw_release;
extern const dlock__redis_script dlock__redis_script_sem_acquire;
extern const dlock__redis_script dlock__redis_script_sem_release;
extern const dlock__redis_script dlock__redis_script_sem_permits;
extern const dlock__redis_script dlock__redis_script_family_renew;
extern const dlock__redis_script dlock__redis_script_leader_get;
extern const dlock__redis_script dlock__redis_script_multi_acquire;
extern const dlock__redis_script dlock__redis_script_fair_keep;

#endif
