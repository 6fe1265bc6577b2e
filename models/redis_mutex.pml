/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The Redis mutex protocol of dlock, checked with spin (models/check.sh,
 * `make verify`; what is modelled and what is not: docs/verification.md).
 *
 * Processes:
 *   Client(i)      one dlock client using one lock name: its caller's thread
 *                  (src/core/lock.c: dlock__acquire, dlock_release;
 *                  src/core/wait.c: dlock__acquire_loop;
 *                  src/backends/redis/redis.c: mutex_acquire, mutex_release,
 *                  dlock__redis_watch_close) and its watchdog thread
 *                  (src/core/watchdog.c: renew_batch), as one process.
 *   Subscriber(i)  -DOLD_GRANT and -DSTAMPED_GRANT only: the client's
 *                  subscriber thread (src/backends/redis/redis_watch.c:
 *                  grant) and, under -DSTAMPED_GRANT, its connection.
 *   Clock          time: the server's and the clients' clocks tick together;
 *                  keys expire, deadlines pass.
 *   Mutex          property (1), asserted in every reachable state.
 * The Redis server is the globals below. Each Lua script is an inline that
 * runs in one atomic step, as Redis runs a script without interleaving.
 *
 * The grant rule. By default, the code's rule: release.lua hands the key to
 * the waiter in the hand-off slot for the confirm window only, the "grant"
 * message merely wakes the waiter, and the waiter holds the lock once a try
 * of its own finds its token in the key (acquire.lua then PEXPIREs the full
 * lease), with the lease counted from when that try was sent. With
 * -DOLD_GRANT, the rule before that fix: the key is handed over with PX the
 * waiter's lease, and the grant message itself makes the waiter the holder,
 * with the lease counted from its last busy try. Spin breaks property (1)
 * under the old rule and finds no violation under the code's.
 *
 * -DSTAMPED_GRANT: a rule proposed for a faster hand-off (issue 28), not in
 * the code (docs/verification.md, "A stamped grant"). release.lua hands the
 * key over with PX the waiter's full lease. The subscriber thread
 * (Subscriber(i)) reads its connection in order: the replies to its own
 * commands (SUBSCRIBE, PING) and the messages. Redis runs commands and
 * scripts one at a time and writes each reply and each message when it runs
 * them, so a grant read after the reply to a command was published after
 * that command ran, and so after it was sent. The subscriber stamps each
 * grant with the send time of the last command whose reply it read before
 * the grant, and the waiter takes the grant as its acquisition, with no
 * round trip, the lease counted from that stamp; or it tries as before
 * (the code would when the stamp is too old; the model lets it at any
 * moment). Spin finds no violation; each mutant breaks property (1):
 *   -DGRANT_FROM_ARRIVAL  the lease counted from when the grant was read;
 *   -DGRANT_LATEST_BOUND  from the last reply read when the waiter takes
 *                         the grant (which may have come after the grant);
 *   -DGRANT_SHORT_PX      the key handed over for the confirm window only
 *                         while the waiter takes the grant for its lease.
 *
 * -DLIST_GRANT: the other rule proposed for issue 28 (docs/verification.md,
 * "A grant pushed to a list"), in the code as -DLIST_WINDOW (below) has it
 * since 2026-12-06. release.lua hands
 * the key over with PX the waiter's full lease and pushes the fence to a
 * list of the waiter's own (PREFIX{NAME}:grant:WID, WID fresh for each
 * wait), which only holders of the keys' write rights can touch. The
 * waiter in the slot keeps a BLPOP of it outstanding (its own connection);
 * a BLPOP returns the element if there is one when it arrives or as soon as
 * one is pushed, or nothing at its timeout. The waiter takes a popped grant
 * as its acquisition with the lease counted from the bound: the send time
 * of the last BLPOP answered empty, or, before any, of the wait's first
 * try (no push can come before that try ran: the slot was not its). Each
 * mutant breaks property (1):
 *   -DLIST_FROM_POP       the lease counted from the send time of the BLPOP
 *                         that returned the grant (the element may have
 *                         waited in the list since before it was sent);
 *   -DLIST_SHORT_PX       the key handed over for the confirm window only.
 * -DLIST_WINDOW: the list grant as the code has it (redis_listen.c,
 * 2026-12-06): the key handed over for min(lease, window), and the popped
 * grant believed for as long from the bound; the watchdog's renewals then
 * extend it to the lease. (-DLIST_SHORT_PX is its mutant: the same key, the
 * grant believed for the lease.)
 *
 * -DFAIR: the fair lock (excl_acquire.lua, excl_release.lua, leave.lua)
 * instead of the plain mutex's single hand-off slot: every waiter's try
 * takes or keeps a place at the end of a FIFO queue, each place expiring
 * SLOT_TTL after its last refresh; a free lock goes only to the head of
 * the queue (a try of another, also one without a place, is busy); and a
 * release hands the lock to the head, as release.lua hands it to the slot's
 * waiter. With a list grant (-DLIST_WINDOW, the code since 2026-12-07) the
 * head listens and pops it; without one, the release deletes the key and
 * the head takes it by a try. The list grant's mutants -DLIST_FROM_POP and
 * -DLIST_SHORT_PX must break property (1) here too.
 *
 * Properties (-DPROPS=n checks property n only; the default, 0, all three):
 *   (1) at most one client holds the lock and believes its lease valid
 *       (dlock_lock_lost() would say 0: not marked lost, and its local now
 *       is before its deadline);
 *   (2) fences strictly increase in the order of acquisition: each
 *       acquisition that returns with a valid lease has a higher fence than
 *       every such acquisition before it;
 *   (3) a store that keeps the highest fence it has seen, and refuses lower
 *       ones, accepts no write from a holder that is not the latest it has
 *       seen: no two holders ever write with the same fence.
 */

/* ---- bounds and durations (each may be set with -D) ---------------------- */
#ifndef N
#define N 3          /* clients (at most 4) */
#endif
#ifndef ROUNDS
#define ROUNDS 1     /* acquisitions per client, each with a fresh token */
#endif
#ifndef TMAX
#define TMAX 8       /* time runs from tick 1 to TMAX (0 means "unset") */
#endif
#ifndef PROPS
#define PROPS 0
#endif
#define CHECK(p) (PROPS == 0 || PROPS == p)

/* In ticks; a tick stands for about a second. */
#ifndef LEASE
#define LEASE 3      /* every client's lease_ms */
#endif
#ifndef CONFIRM
#define CONFIRM 2    /* DLOCK__REDIS_HANDOFF_CONFIRM_MS (2000 ms) */
#endif
#ifndef CONN
#define CONN 2       /* what a subscriber's socket holds unread */
#endif
#ifndef PINGS
#define PINGS 1      /* PINGs a subscriber sends, besides its SUBSCRIBEs */
#endif
#ifndef SLOT_TTL
#define SLOT_TTL 2   /* the hand-off entry's PX: 2 * (lease / 4) + 100 ms */
#endif

/* The server's clock may run ahead of the clients' by this many ticks over
 * a lease: the lock key then expires that much early. 0 is what dlock
 * assumes; with 1, spin finds property (1) broken (docs/verification.md). */
#ifndef DRIFT
#define DRIFT 0
#endif

#if defined(GRANT_FROM_ARRIVAL) || defined(GRANT_LATEST_BOUND) || defined(GRANT_SHORT_PX)
#define STAMPED_GRANT
#endif
#if defined(LIST_FROM_POP) || defined(LIST_SHORT_PX) || defined(LIST_WINDOW)
#define LIST_GRANT
#endif

#if (defined(OLD_GRANT) || defined(STAMPED_GRANT) || defined(LIST_GRANT)) && \
    !defined(GRANT_SHORT_PX) && !defined(LIST_SHORT_PX) && !defined(LIST_WINDOW)
#define HANDOFF_PX LEASE                                /* the waiter's lease */
#else
#define HANDOFF_PX (CONFIRM < LEASE -> CONFIRM : LEASE) /* min(lease, window) */
#endif
/* How long a popped grant is believed from its bound. */
#ifdef LIST_WINDOW
#define GRANT_LEASE HANDOFF_PX
#else
#define GRANT_LEASE LEASE
#endif

/* An expiry or deadline: every time after TMAX is alike, so all are kept as
 * TMAX + 1 (fewer states, same behaviour). */
#define AT(x) ((x) > TMAX -> TMAX + 1 : (x))

/* The lock key's expiry for a PX of px ticks set now. */
#define KEY_EXP(px) AT(now + (px) - DRIFT)

/* Tokens; 0 is none. Acquisition r (1-based) of client i has token
 * i * ROUNDS + r: the fresh owner token of each dlock_acquire (token.c),
 * which also stands for the waiter id (WID) of the watch it opens. */
#define CLIENT(tk) (((tk) - 1) / ROUNDS)

mtype = { OK, BUSY, FAIL };   /* a script's reply as the client sees it;
                               * FAIL: none came back */

/* ---- the Redis server ----------------------------------------------------- */
byte now = 1;          /* the clock, the server's and every client's */
byte key;              /* dlock:{NAME}: the owner token, 0 when absent */
byte key_exp;          /* its PX expiry (absolute tick) */
byte counter;          /* dlock:{NAME}:fence: only ever INCR'd */
byte slot;             /* dlock:{NAME}:next: the waiter's token, 0 when absent */
byte slot_exp;
#ifdef FAIR
/* dlock:{NAME}:queue and :queue-exp: the waiters' places in arrival order
 * (q[0] heads it, 0 ends it) and their expiries. N + 1 places: a client's
 * stale place from an earlier round (a leave that never ran) may still be
 * there beside every client's current one. */
#define QLEN (N + 1)
byte q[QLEN];
byte q_exp[QLEN];
byte jj;               /* scratch, as j */
#endif

/* ---- the release channel and the subscriber connections --------------------
 * "released", and "grant" under the code's rule, are wake-ups only, and a
 * waiter's sleep may end at any moment anyway (see watch_wait in Client): a
 * wake-up, early, late or lost, makes no step possible that was not possible
 * without it, so the model keeps no state for them. Under -DOLD_GRANT and
 * -DSTAMPED_GRANT a grant carries authority (a fence, and a lease): a
 * PUBLISH reaches the clients subscribed at that moment, in order with the
 * replies to their subscriber's own commands, then waits in the
 * subscriber's socket until the subscriber thread reads it (a delay of any
 * number of ticks) or is dropped (loss). */
bool subscribed[N];    /* a waiter of client i is registered (watch begin..end) */
#ifdef STAMPED_GRANT
mtype = { PONG, GRANT };
chan conn[N] = [CONN] of { mtype, byte, byte }; /* PONG: sent; GRANT: fence, WID */
byte bound[N];         /* the subscriber's bound: the send time of the last
                        * command whose reply it read (0: none yet) */
byte gr_f[N];          /* waiter->granted: the fence of a grant read, */
byte gr_b[N];          /* ... and its stamp */
#endif
#ifdef LIST_GRANT
byte lst[N];           /* the list of client i's current wait: the fence
                        * pushed (0: empty). A push for a wait that ended
                        * lands in a list nobody reads again: dropped. */
#endif
#ifdef OLD_GRANT
byte m_grant[N];       /* FENCE of a "grant WID FENCE" for client i, unhandled */
byte granted[N];       /* waiter->granted (the old redis_watch.c) */
#endif

/* ---- what the clients believe ------------------------------------------- */
bool hold[N];          /* dlock_acquire returned OK; dlock_release not called */
bool lost[N];          /* lost_reason: a renewal found the key not ours */
byte dl[N];            /* deadline_ms; 0 once passed */
byte tok_of[N];        /* the token of client i's current acquisition */

#define believes(i) (hold[i] && !lost[i] && now < dl[i])

/* ---- ghosts for properties (2) and (3) ----------------------------------- */
byte last_fence;       /* the fence of the latest acquisition returned valid */
byte store_max;        /* the store's highest fence seen */
byte store_tok;        /* the holder (token) that wrote with it */

byte j;                /* scratch, used inside atomic steps only, left 0 */

/* ---- publishing ----------------------------------------------------------- */

#define publish_released() skip

/* PUBLISH "grant WID FENCE PX": the message goes to the client whose
 * waiter is WID, if it is subscribed; the subscriber of another client finds
 * no such waiter. A full socket or a dropped connection loses it. */
#if defined(STAMPED_GRANT)
inline publish_grant(w, fence)
{
    if
    :: subscribed[CLIENT(w)] && nfull(conn[CLIENT(w)]) -> conn[CLIENT(w)]!GRANT(fence, w)
    :: !subscribed[CLIENT(w)] || full(conn[CLIENT(w)])
    fi
}
#elif defined(OLD_GRANT)
inline publish_grant(w, fence)
{
    if
    :: subscribed[CLIENT(w)] && tok_of[CLIENT(w)] == w -> m_grant[CLIENT(w)] = fence
    :: else
    fi
}
#elif defined(LIST_GRANT)
/* RPUSH PREFIX{NAME}:grant:WID FENCE (the key's master runs it with the
 * script: nothing is lost or reordered on the way into the list). */
inline publish_grant(w, fence)
{
    if
    :: subscribed[CLIENT(w)] && tok_of[CLIENT(w)] == w -> lst[CLIENT(w)] = fence
    :: else
    fi
}
#else
#define publish_grant(w, fence) skip
#endif

/* ---- the Lua scripts ------------------------------------------------------
 * Keys whose PX has run out are gone already (the Clock deletes them on the
 * tick they expire), so "key == 0" is SET NX succeeding and "key == t" is
 * GET returning the caller's token. */

#ifdef FAIR
/* Drop the place at index j (the later ones move up). */
inline q_drop()
{
    jj = j;
    do
    :: jj < QLEN - 1 -> q[jj] = q[jj + 1]; q_exp[jj] = q_exp[jj + 1]; jj++
    :: else -> q[jj] = 0; q_exp[jj] = 0; break
    od;
    jj = 0
}

/* ZREM queue t, ZREM queue-exp t (and HDEL queue-grant t). */
inline q_remove(t)
{
    j = 0;
    do
    :: j < QLEN && q[j] == t -> q_drop(); break
    :: j < QLEN && q[j] != t -> j++
    :: j >= QLEN -> break
    od;
    j = 0
}

/* A waiter's place: taken at the end, or its expiry refreshed. */
inline q_enqueue(t)
{
    j = 0;
    do
    :: j < QLEN && (q[j] == 0 || q[j] == t) -> q[j] = t; q_exp[j] = AT(now + SLOT_TTL); break
    :: j < QLEN && q[j] != 0 && q[j] != t -> j++
    :: j >= QLEN -> break
    od;
    j = 0
}

/* excl_acquire.lua, kind 'fair'. The waiter's id stands for its token. */
inline acquire_lua(t, entry, res, f)
{
    if
    :: key == 0 && (q[0] == 0 || (entry && q[0] == t)) ->
        key = t; key_exp = KEY_EXP(LEASE);
        counter++; f = counter;
        q_remove(t);
        res = OK;
        printf("t=%d c%d excl_acquire.lua: free and its turn, fence %d, key expires at %d\n",
               now, CLIENT(t), f, key_exp)
    :: key == t ->
        /* Its hold found (a hand-over to confirm, or a retry): the lease
         * extended (dlock_pexpire_max), the hold's fence. */
        key_exp = KEY_EXP(LEASE); f = counter;
        res = OK;
        printf("t=%d c%d excl_acquire.lua: the hold is ours, PEXPIRE to %d, fence %d\n",
               now, CLIENT(t), key_exp, f)
    :: else ->
        printf("t=%d c%d excl_acquire.lua: busy (held by c%d, or not its turn)\n", now,
               CLIENT(t), CLIENT(key));
        if
        :: entry -> q_enqueue(t)
        :: else
        fi;
        res = BUSY
    fi
}

/* excl_release.lua, kind 'fair': the lock to the head of the queue. */
inline release_lua(t)
{
    if
#ifdef LIST_GRANT
    :: key == t && q[0] != 0 ->
        key = q[0]; key_exp = KEY_EXP(HANDOFF_PX);
        counter++;
        publish_grant(key, counter);
        q_remove(key);
        printf("t=%d c%d excl_release.lua: hands the key to the head c%d, fence %d, expires at %d\n",
               now, CLIENT(t), CLIENT(key), counter, key_exp)
    :: key == t && q[0] == 0 ->
#else
    :: key == t ->                    /* the head is named on the channel */
#endif
        key = 0; key_exp = 0;
        printf("t=%d c%d excl_release.lua: DEL key\n", now, CLIENT(t))
    :: else
    fi
}

/* leave.lua: the place goes, and a lock handed over after the waiter's
 * last try is given back. */
inline mutex_leave_lua(t)
{
    q_remove(t);
    if
    :: key == t -> key = 0; key_exp = 0
    :: else
    fi
}

/* The Clock drops the places whose expiry has passed. */
inline q_expire()
{
    j = 0;
    do
    :: j < QLEN && q[j] != 0 && now >= q_exp[j] -> q_drop()
    :: j < QLEN && !(q[j] != 0 && now >= q_exp[j]) -> j++
    :: j >= QLEN -> break
    od;
    j = 0
}
#else
/* acquire.lua. t: the owner token (ARGV[1]); entry: set for a waiter's try,
 * which passes its hand-off entry "WID TOKEN LEASE" (ARGV[3]), here named by
 * its token. Out: res and the fence f. */
inline acquire_lua(t, entry, res, f)
{
    if
    :: key == 0 ->
        /* SET NX PX lease, then INCR: never a lock without a fence */
        key = t; key_exp = KEY_EXP(LEASE);
        counter++; f = counter;
        if
        :: entry && slot == t -> slot = 0; slot_exp = 0   /* DEL our entry */
        :: else
        fi;
        res = OK;
        printf("t=%d c%d acquire.lua: SET NX, fence %d, key expires at %d\n",
               now, CLIENT(t), f, key_exp)
    :: key == t ->
        /* GET == own token: a hand-off to confirm (or a retry). PEXPIRE the
         * full lease; the fence is the counter's (no fence was issued since
         * ours: the key has been ours since). The counter never goes away
         * in the model, so the floor fallback is not needed. */
        key_exp = KEY_EXP(LEASE); f = counter;
        res = OK;
        printf("t=%d c%d acquire.lua: key is ours, PEXPIRE to %d, fence %d\n",
               now, CLIENT(t), key_exp, f)
    :: else ->
        /* busy: take the hand-off slot if free, refresh it if ours */
        printf("t=%d c%d acquire.lua: busy (the key is c%d's)\n", now, CLIENT(t), CLIENT(key));
        if
        :: entry && slot == 0 ->
            slot = t; slot_exp = AT(now + SLOT_TTL);
            printf("t=%d c%d takes the hand-off slot\n", now, CLIENT(t))
        :: entry && slot == t -> slot_exp = AT(now + SLOT_TTL)
        :: else
        fi;
        res = BUSY
    fi
}

/* release.lua: compare-and-delete, or the hand-over to the slot's waiter. */
inline release_lua(t)
{
    if
    :: key == t && slot != 0 ->
        /* SET key to the waiter's token PX min(lease, confirm window)
         * (the old rule: PX lease), INCR, PUBLISH "grant WID FENCE" */
        key = slot; key_exp = KEY_EXP(HANDOFF_PX);
        counter++;
        publish_grant(key, counter);
        slot = 0; slot_exp = 0;
        printf("t=%d c%d release.lua: hands the key to c%d, fence %d, expires at %d; grant published\n",
               now, CLIENT(t), CLIENT(key), counter, key_exp)
    :: key == t && slot == 0 ->
        key = 0; key_exp = 0;
        publish_released();
        printf("t=%d c%d release.lua: DEL key\n", now, CLIENT(t))
    :: else                           /* not ours: returns 0, touches nothing */
    fi
}

/* mutex_leave.lua: a waiter gives up. */
inline mutex_leave_lua(t)
{
    if
    :: slot == t -> slot = 0; slot_exp = 0
    :: else
    fi;
    if
    :: key == t ->                    /* a hand-off it had not confirmed */
        key = 0; key_exp = 0;
        publish_released()
    :: else
    fi
}

#endif /* FAIR */

/* renew.lua, for one lock of the batch: compare-and-PEXPIRE. */
inline renew_lua(t, res)
{
    if
    :: key == t -> key_exp = KEY_EXP(LEASE); res = OK
    :: else -> res = BUSY             /* 0: no longer ours */
    fi
}

/* ---- requests and replies --------------------------------------------------
 * A request is sent; Redis runs the script some time later; the reply comes
 * back some time after that. With -DDELAY these are three steps, and time
 * may pass and other processes act between them (LATER marks the places).
 * By default they are one step, which loses no violation of the properties:
 * a request's delay is, to everyone else, the same as its sender pausing
 * before it sends (and the lease it counts from the send is then longer,
 * not shorter), and a reply's delay only makes the client believe what the
 * reply tells later (a renewal whose 0 is still on its way is, until it
 * arrives, a renewal never sent). So every client believes at least as long
 * in the one-step model as in the delayed one. check.sh runs both. */
#ifdef DELAY
#define LATER }; atomic {
#else
#define LATER ;
#endif

/* The server runs the request and the reply arrives; or it runs it and the
 * reply is lost (a timeout, a dropped connection); or it never runs it. The
 * client hears FAIL in the last two cases. (A request that runs only after
 * its client has given up on it is not modelled: docs/verification.md.) */
#define RPC(script, res) \
    if \
    :: true -> script \
    :: true -> script; res = FAIL \
    :: res = FAIL \
    fi

/* A renewal that never runs is the same as one not sent, and the watchdog
 * may also not renew: so it runs, and its reply arrives or is lost. */
#define RPC_RUNS(script, res) \
    if \
    :: true -> script \
    :: true -> script; res = FAIL \
    fi

/* A request whose reply changes nothing (release, leave): it runs or not. */
#define SEND(script) \
    if \
    :: true -> script \
    :: skip \
    fi

/* ---- a client ----------------------------------------------------------- */

/* The end of dlock__acquire: dlock__lock_start(l, lease_from_ms), the lease
 * counted from when the try that won (or confirmed) the lock was sent.
 * Property (2) is checked here. */
#define become_holder(i, t, sent, f) become_holder_for(i, t, sent, LEASE, f)
inline become_holder_for(i, t, sent, lease, f)
{
    hold[i] = 1; lost[i] = 0;
    dl[i] = (sent + lease > now -> AT(sent + lease) : 0);
    printf("t=%d c%d holds the lock: fence %d, deadline %d\n", now, i, f, dl[i]);
    if
    :: CHECK(2) && believes(i) ->
        assert(f > last_fence);       /* property (2) */
        last_fence = f
    :: else
    fi
}

/* dlock__redis_watch_end: the waiter leaves the subscriber's list, and
 * messages still on their way find nobody to wake. */
inline watch_end(i)
{
    subscribed[i] = 0;
#if defined(STAMPED_GRANT)
    gr_f[i] = 0; gr_b[i] = 0
#elif defined(LIST_GRANT)
    lst[i] = 0
#elif defined(OLD_GRANT)
    m_grant[i] = 0; granted[i] = 0
#endif
}

proctype Client(byte i)
{
    byte t;            /* the owner token of the current acquisition */
    byte round;
    byte sent;         /* when the request in hand was sent (client clock) */
    byte f;            /* the fence */
    bool leave;        /* w->leave: the server may hold our entry or a hand-off */
    mtype res;
#if defined(STAMPED_GRANT) || defined(LIST_GRANT)
    byte b;            /* the lease's start of a grant taken */
#endif
#ifdef LIST_GRANT
    byte bb;           /* the bound: when the last BLPOP answered empty, or
                        * the wait's first try, was sent (0: no try yet) */
    byte bs;           /* when the outstanding BLPOP was sent */
#endif
#ifdef OLD_GRANT
    byte es;           /* w->entry_sent_ms: when the last busy try was sent */
#endif

idle:
    if
    :: round < ROUNDS ->
        round++;
        t = i * ROUNDS + round;
        tok_of[i] = t
    :: else -> goto end_done
    fi;

    /* dlock__acquire_loop: the first try, without a watch (no hand-off
     * entry); lease_from_ms = now */
    atomic {
        sent = now
    LATER
        RPC(acquire_lua(t, 0, res, f), res)
    LATER
        if
        :: res == OK -> become_holder(i, t, sent, f); sent = 0; res = 0; goto held
        :: res == FAIL -> goto give_back    /* outcome unknown */
        :: res == BUSY -> sent = 0; res = 0
        fi
    }
    if
    :: goto wait       /* wait_ms > 0 */
    :: goto idle       /* wait_ms == 0: DLOCK_EBUSY */
    fi;

give_back:
    /* the loop's give_back (lock.c) after an unknown outcome: release.lua
     * by owner token */
    atomic { sent = 0; res = 0; f = 0; SEND(release_lua(t)) }
    goto idle;

wait:
    /* watch_again: watch_begin subscribes, and the loop tries again at once.
     * The SUBSCRIBE's reply (sent and run now) is in the connection ahead of
     * every grant published after it. When the modelled socket is full the
     * reply is not kept, as when the channel was subscribed already and no
     * SUBSCRIBE is sent: a real socket would keep it, so the model leaves
     * out the runs where that reply would make a later grant's stamp newer
     * (a limit of the bound CONN, docs/verification.md). */
    atomic {
        subscribed[i] = 1;
#ifdef STAMPED_GRANT
        if
        :: nfull(conn[i]) -> conn[i]!PONG(now, 0)
        :: full(conn[i])
        fi
#endif
    }
try:
    /* one turn of dlock__acquire_loop: lease_from_ms = now, then
     * mutex_acquire with the watch */
    atomic {
        sent = now;
#if defined(STAMPED_GRANT)
        /* mutex_acquire: a grant the subscriber read is taken without a
         * round trip, the lease counted from its stamp, if that leaves any
         * of the lease (the code would ask for half of it); otherwise the
         * try below confirms it. */
        if
        :: gr_f[i] != 0 ->
            f = gr_f[i];
#ifdef GRANT_LATEST_BOUND
            b = bound[i];
#else
            b = gr_b[i];
#endif
            gr_f[i] = 0; gr_b[i] = 0;
            if
            :: b != 0 && b + LEASE > now ->
                leave = 0;
                printf("t=%d c%d takes the grant it was sent (fence %d), lease from t=%d\n",
                       now, i, f, b);
                watch_end(i);
                become_holder(i, t, b, f);
                sent = 0; b = 0;
                goto held
            :: else -> f = 0; b = 0
            fi
        :: else
        fi;
#elif defined(OLD_GRANT)
        /* the old redis_acquire: a grant the subscriber has seen is taken as
         * it is, and the old wait_for_lock counts the lease from the last
         * busy try */
        if
        :: granted[i] != 0 ->
            f = granted[i]; leave = 0;
            sent = (es != 0 && es < sent -> es : sent);
            printf("t=%d c%d takes the grant it was sent (fence %d), lease from t=%d\n",
                   now, i, f, sent);
            watch_end(i); es = 0;
            become_holder(i, t, sent, f);
            sent = 0;
            goto held
        :: else
        fi;
#endif
#ifdef LIST_GRANT
        if
        :: bb == 0 -> bb = sent
        :: else
        fi;
#endif
        leave = 1      /* from here the server may hold our entry or a hand-off */
    LATER
        RPC(acquire_lua(t, 1, res, f), res)
    LATER
        if
        :: res == OK ->
            leave = 0; watch_end(i);
            become_holder(i, t, sent, f);
            sent = 0; res = 0;
#ifdef LIST_GRANT
            bb = 0;
#endif
#ifdef OLD_GRANT
            es = 0;
#endif
            goto held
        :: res == FAIL -> goto leave_
        :: res == BUSY
        fi;
#ifdef OLD_GRANT
        es = sent;     /* the old code: w->entry_sent_ms = sent */
#endif
        sent = 0; res = 0; f = 0
    }
    /* watch_wait: the sleep ends at a wake-up, or at a timeout bounded by
     * the holder's PTTL + 1, lease / 4 and wait_ms: it may end at any
     * moment, and so wake-ups (grant, released) add no behaviour. */
    if
    :: goto try
    :: goto leave_     /* wait_ms ran out: DLOCK_ETIMEOUT */
#ifdef LIST_GRANT
    :: goto blpop      /* the waiter holds the slot, or may: it listens */
#endif
    fi;

#ifdef LIST_GRANT
blpop:
    /* BLPOP the list, sent and arrived (a request's delay is its sender's
     * pause, as for the scripts). It answers an element there now or pushed
     * while it blocks; or nothing at its timeout, at any moment. */
    atomic { bs = now }
    if
    :: atomic {
        lst[i] != 0 ->
        f = lst[i]; lst[i] = 0;
#ifdef LIST_FROM_POP
        b = bs;
#else
        b = bb;
#endif
        bs = 0;
        if
        :: b + GRANT_LEASE > now ->  /* the reply arrives: the grant is taken */
            leave = 0;
            printf("t=%d c%d pops the grant (fence %d), lease from t=%d\n", now, i, f, b);
            watch_end(i);
            become_holder_for(i, t, b, GRANT_LEASE, f);
            b = 0; bb = 0;
            goto held
        :: true ->                /* lost (the connection broke), or too old:
                                   * a try confirms it as the code does today */
            f = 0; b = 0
        fi
       }
    :: atomic {                  /* nothing came before its timeout */
        lst[i] == 0 -> bb = bs; bs = 0
       }
    fi;
    if
    :: goto try
    :: goto blpop
    :: goto leave_
    fi;
#endif

leave_:
    /* dlock__redis_watch_close: mutex_leave.lua if leave is set, then
     * watch_end; the acquisition fails */
    atomic {
        sent = 0; res = 0; f = 0;
        if
        :: leave -> SEND(mutex_leave_lua(t)); leave = 0
        :: else
        fi;
        watch_end(i);
#ifdef LIST_GRANT
        bb = 0;
#endif
#ifdef OLD_GRANT
        es = 0
#endif
    }
    goto idle;

held:
    do
    :: /* The caller's write reaches the store, with its fence. Any holder
        * writes, also one whose lease has run out: the store must refuse a
        * stale write by itself. The write carries only (fence, token), so
        * when it lands is all that matters: at any moment while held. */
        atomic {
            if
            :: f >= store_max ->
                assert(!CHECK(3) || f > store_max || store_tok == t);  /* (3) */
                store_max = f; store_tok = t;
                printf("t=%d c%d writes with fence %d: accepted\n", now, i, f)
            :: else ->
                printf("t=%d c%d writes with fence %d: refused\n", now, i, f)
            fi
        }
    :: /* the watchdog (renew_batch), at any moment: renew.lua; on 1,
        * dlock__lock_start(l, sent) */
        atomic {
            sent = now
        LATER
            RPC_RUNS(renew_lua(t, res), res)
        LATER
            if
            :: res == OK -> dl[i] = (sent + LEASE > now -> AT(sent + LEASE) : 0)
            :: res == BUSY -> lost[i] = 1   /* on_lost: not ours any more */
            :: res == FAIL                  /* tries again; lost once past the deadline */
            fi;
            sent = 0; res = 0
        }
    :: /* dlock_release: the handle is done with, then release.lua */
        atomic {
            hold[i] = 0; lost[i] = 0; dl[i] = 0
        LATER
            SEND(release_lua(t));
            f = 0
        }
        goto idle
    od;

end_done:
    skip
}

#if defined(STAMPED_GRANT)
/* The subscriber thread and its connection. It sends a PING now and then
 * (PINGS a client in the model); Redis runs it, and the reply takes its
 * place in the connection behind what was written before it (grants
 * published earlier) and ahead of what is written after. (A PING sent
 * before a grant and run after it is the same, to the rule, as one sent
 * after it: its reply comes after the grant.) The thread reads the
 * connection in order: a reply moves its bound to when that PING was sent;
 * a grant for its current waiter is stamped with the bound (redis_watch.c:
 * grant). */
proctype Subscriber(byte i)
{
    mtype kind;
    byte v, w, pings;
end_loop:
    do
    :: atomic {
        subscribed[i] && pings < PINGS && nfull(conn[i]) ->
        conn[i]!PONG(now, 0);
        pings++
       }
    :: atomic {
        conn[i]?kind(v, w) ->
        if
        :: kind == PONG -> bound[i] = v
        :: kind == GRANT && subscribed[i] && tok_of[i] == w ->
            gr_f[i] = v;
#ifdef GRANT_FROM_ARRIVAL
            gr_b[i] = now;
#else
            gr_b[i] = bound[i];
#endif
            printf("t=%d c%d's subscriber reads the grant, fence %d, stamped %d\n",
                   now, i, v, gr_b[i])
        :: else
        fi;
        kind = 0; v = 0; w = 0
       }
    od
}
#elif defined(OLD_GRANT)
/* The old subscriber thread, grant(): it handles a grant late, or never. */
proctype Subscriber(byte i)
{
end_loop:
    do
    :: atomic {
        m_grant[i] != 0 ->
        if
        :: granted[i] = m_grant[i];   /* waiter->granted = FENCE, never cleared */
           printf("t=%d c%d's subscriber handles the grant, fence %d\n", now, i, m_grant[i])
        :: skip                       /* lost */
        fi;
        m_grant[i] = 0
       }
    od
}
#endif

/* Time: one tick for the server and every client alike. */
active proctype Clock()
{
end_tick:
    do
    :: atomic {
        now < TMAX ->
        now++;
        if
        :: key != 0 && now >= key_exp ->
            printf("t=%d the key of c%d expires\n", now, CLIENT(key));
            key = 0; key_exp = 0
        :: else
        fi;
#ifdef FAIR
        q_expire();
#else
        if
        :: slot != 0 && now >= slot_exp -> slot = 0; slot_exp = 0
        :: else
        fi;
#endif
        for (j : 0 .. N - 1) {
            if
            :: dl[j] != 0 && now >= dl[j] -> dl[j] = 0
            :: else
            fi
        }
        j = 0
       }
    od
}

/* Property (1), in every reachable state. */
#define BEL(i) (believes(i) -> 1 : 0)
#if N == 2
#define BELIEVERS (BEL(0) + BEL(1))
#elif N == 3
#define BELIEVERS (BEL(0) + BEL(1) + BEL(2))
#else
#define BELIEVERS (BEL(0) + BEL(1) + BEL(2) + BEL(3))
#endif

active proctype Mutex()
{
end_check:
    do
    :: assert(!CHECK(1) || BELIEVERS <= 1)   /* property (1) */
    od
}

init
{
    byte k;
    atomic {
        for (k : 0 .. N - 1) {
            run Client(k);
#if defined(STAMPED_GRANT) || defined(OLD_GRANT)
            run Subscriber(k)
#endif
        }
        k = 0
    }
}
