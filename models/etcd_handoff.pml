/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dlock's etcd lock: the queue of waiter keys, the waiter's promote and the
 * spare-lease hand-off, checked with spin (models/check.sh, `make verify`;
 * what is modelled and what is not: docs/verification.md; the protocol:
 * docs/etcd.md, "Spare leases" and "Acquire, wait, release";
 * src/backends/etcd/etcd_queue.c, etcd_lease.c (the lease source),
 * etcd_spare.c).
 *
 * Processes:
 *   Client(i)  one dlock client taking one lock name, once (ROUNDS): the
 *              first try (try_once: on a spare of the pool, fresh or kept
 *              alive in the same round trip, or on a lease granted for it),
 *              then, when busy, the wait (a key on a short lease, its
 *              create revision the place in the queue), the wake-up's
 *              promote onto a spare (move_txn with "our key, at our
 *              revision, and no key ahead"), or the check and the promote
 *              onto a lease granted for it; holding: renewals, release.
 *   Thread     the backend's spare thread: grants a spare when the pool is
 *              empty, keeps it alive, drops one about to run out.
 *   Clock      time, one clock for etcd's leader and every client; a lease
 *              runs out on the server at its expiry and takes its keys.
 *   Mutex      property (1), asserted in every reachable state.
 * Every request is sent, run and answered in one step (a delay is its
 * sender pausing before sending; the lease is counted from the moment the
 * client noted before sending, so a later run only lengthens the server's
 * lease); a client may pause between any two of its steps, for any number
 * of ticks. A waiter's try may come at any moment (a watch event, a
 * keepalive's wake-up, a spurious one): a superset of the code's wake-ups.
 *
 * Properties (-DPROPS=n: check property n only; default 0: both):
 *   (1) at most one client holds the lock and believes its lease valid
 *       (acquire returned OK, not released, now before its deadline);
 *   (2) fences strictly increase in the order of acquisition: an
 *       acquisition that returns OK has a fence (its key's create revision)
 *       above that of every acquisition that returned OK before it.
 *
 * Switches that must break a property (check.sh expects a counterexample),
 * one per guard of the code:
 *   -DNO_FIRST_CMP   the wake-up's move onto a spare without the compare
 *                    over the directory ("no key ahead of mine"), (1);
 *   -DNO_REV_CMP     the move (onto a spare, or onto a granted lease)
 *                    without "our key still has the create revision we
 *                    queued at": a key gone with its short lease is put
 *                    again, at the end of the queue, (1) and (2);
 *   -DFROM_CALL      a spare confirmed within the window taken by the txn
 *                    alone, the lease counted from the acquire instead of
 *                    the spare's last confirmation (ok_ms), (1);
 *   -DBACK_AT_RELEASE  a release gives its spare back alive as of the
 *                    release, not as of its last keepalive, (1);
 *   -DPROMOTE_NO_KA  the promote onto a spare without the spare's keepalive
 *                    in the same round trip, the lease counted from the try,
 *                    (1).
 * -DSESSION models the session lease instead (etcd_session.c: the
 * auto-renewed locks of a client share one lease of their TTL): the
 * client's "spare" is never taken out of its slot, backs its key while
 * the client's other locks (not modelled, one name here) keep it alive at
 * any moment (the Thread's keepalives), a release deletes the key alone
 * and leaves the lease as it is, and the holder's renewal confirms it. The
 * switches -DFROM_CALL (the acquire counted from the call, not the session
 * lease's last confirmation) and -DBACK_AT_RELEASE (a release counts the
 * session lease alive as of the release) must break (1) with it too.
 * And changes that must not (check.sh expects no violation): -DFRESH=k the
 * confirmation window (a twentieth of the TTL in the code) widened, up to
 * past the TTL; -DREVOKE_EARLY the waiter's short lease revoked before the
 * move instead of after it, off the hand-off's path. Neither is a safety
 * guard (docs/verification.md says why).
 */

/* ---- bounds and durations (each may be set with -D) ---------------------- */
#ifndef N
#define N 2          /* clients (2 or 3) */
#endif
#ifndef ROUNDS
#define ROUNDS 2     /* acquisitions of client 0; the others make one */
#endif
#ifndef RMAX
#define RMAX 9       /* revisions: a client that would queue past it gives up
                      * (bounds the loop of a key lost and queued again) */
#endif
#ifndef TMAX
#define TMAX 5       /* ticks */
#endif
#ifndef TTL
#define TTL 2        /* the acquisition's lease, in ticks; lease_ms is the
                      * TTL exactly (no rounding up: the tightest case) */
#endif
#ifndef WTTL
#define WTTL 1       /* the waiter's short lease (WAIT_TTL_S), shorter than
                      * TTL, so that a waiter that is first is promoted */
#endif
#ifndef FRESH
#define FRESH 1      /* the confirmation window: a spare confirmed alive this
                      * many ticks ago or less is taken by the txn alone */
#endif
#ifndef PROPS
#define PROPS 0
#endif
#define CHECK(p) (PROPS == 0 || PROPS == p)

/* ---- etcd ----------------------------------------------------------------- */
/* Leases: each client's short lease (its ID derived from the token), its
 * spare (the pool holds one per client here) and the lease granted for an
 * acquisition (try_once without a spare, or the promote's grant). */
#define SHORT(i) (i)
#define SPARE(i) (N + (i))
#define OWN(i) (2 * N + (i))
#define NL (3 * N)
#define LTTL(l) ((l) < N -> WTTL : TTL)

byte now;
byte rev;            /* the store's revision */
byte kc[N];          /* client i's key dlock/NAME/<id>: its create revision,
                      * 0 when absent */
byte kl[N];          /* the lease it is on */
byte lexp[NL];       /* a lease's expiry on the leader's clock; 0: none */

/* ---- the clients' pools (etcd_spare.c): one spare per client ------------- */
/* Taking the spare: out of the pool; a session lease stays in its slot. */
#ifdef SESSION
#define TAKE_SPARE(i) skip
#define IS_SESSION 1
#else
#define TAKE_SPARE(i) sp_in[i] = 0; sp_used[i] = 1
#define IS_SESSION 0
#endif
bool sp_in[N];       /* the pool has the spare */
byte sp_ok[N];       /* when the request that last found it alive was sent */
bool sp_used[N];     /* a key of an acquisition is on it: not the pool's */

/* ---- what the clients believe -------------------------------------------- */
bool hold[N];
byte dl[N];          /* the deadline: the lease counted from its start */
byte last_fence;     /* ghost: the fence of the last acquisition that
                      * returned OK */
#define believes(i) (hold[i] && now < dl[i])

/* A lease revoked or run out: its keys go with it. */
inline drop_lease(l)
{
    lexp[l] = 0;
    for (j : 0 .. N - 1) {
        if
        :: kc[j] != 0 && kl[j] == l ->
            printf("t=%d c%d's key (revision %d) goes with its lease\n", now, j, kc[j]);
            kc[j] = 0
        :: else
        fi
    }
    j = 0
}

/* A keepalive: the leader sets the expiry to now + TTL if the lease lives. */
inline keepalive(l, alive)
{
    if
    :: lexp[l] != 0 -> lexp[l] = now + LTTL(l); alive = 1
    :: else -> alive = 0
    fi
}

/* The move's compares (move_txn): our key at the create revision we
 * queued at; with first, no key of the directory below it. */
#ifdef NO_REV_CMP
#define REV_OK(i) true
#else
#define REV_OK(i) (kc[i] == myrev)
#endif
#ifdef NO_FIRST_CMP
#define FIRST_OK(c) true
#else
#define FIRST_OK(c) ((c) == 0)
#endif

/* How many keys of others the directory holds (all, or those ahead of r). */
inline others(i, c)
{
    c = 0;
    for (j : 0 .. N - 1) {
        if
        :: j != i && kc[j] != 0 -> c++
        :: else
        fi
    }
    j = 0
}
inline ahead(i, r, c)
{
    c = 0;
    for (j : 0 .. N - 1) {
        if
        :: j != i && kc[j] != 0 && kc[j] < r -> c++
        :: else
        fi
    }
    j = 0
}

/* An acquisition returns OK: property (2). */
inline won(f)
{
    printf("t=%d c%d holds the lock: fence %d, deadline %d\n", now, i, f, dl[i]);
    assert(!CHECK(2) || f > last_fence);   /* property (2) */
    last_fence = f
}

/* ---- a client -------------------------------------------------------------- */
proctype Client(byte i)
{
    byte round;
    byte myrev;        /* the create revision we queued at (the fence) */
    byte sent;         /* when the core noted the time of this try */
    byte lease;        /* the lease our held key is on */
    byte okh;          /* when a request that found it alive was last sent */
    byte c;
    byte j;
    bool alive;
    bool onspare;      /* held on a spare: the release gives it back */
    bool pend;         /* the short lease's revoke, off the hand-off's path */

idle:
    if
    :: round < (i == 0 -> ROUNDS : 1) -> round++
    :: else -> goto end_done
    fi;

    /* try once: the first try of dlock_acquire, never behind a queue */
    atomic {
        sent = now;
        if
        :: sp_in[i] && now >= sp_ok[i] + TTL ->
            sp_in[i] = 0    /* about to run out: dropped, left to expire */
        :: else
        fi;
        if
        :: sp_in[i] && now - sp_ok[i] <= FRESH && lexp[SPARE(i)] != 0 ->
            /* try_once on a spare of the lease source (dlock__etcd_lease_txn),
             * confirmed within the window: the txn alone */
            others(i, c);
            if
            :: c == 0 ->
                TAKE_SPARE(i);
                rev++; kc[i] = rev; kl[i] = SPARE(i); myrev = rev;
                lease = SPARE(i); onspare = 1; okh = sp_ok[i];
#ifdef FROM_CALL
                hold[i] = 1; dl[i] = sent + TTL;
#else
                hold[i] = 1; dl[i] = sp_ok[i] + TTL;   /* from ok_ms */
#endif
                won(myrev);
                goto held
            :: else         /* busy: the spare stays in the pool */
            fi
        :: sp_in[i] && now - sp_ok[i] > FRESH && lexp[SPARE(i)] != 0 ->
            /* an older spare: the txn and its keepalive at once */
            keepalive(SPARE(i), alive);
            sp_ok[i] = now;
            others(i, c);
            if
            :: c == 0 ->
                TAKE_SPARE(i);
                rev++; kc[i] = rev; kl[i] = SPARE(i); myrev = rev;
                lease = SPARE(i); onspare = 1; okh = sent;
                hold[i] = 1; dl[i] = sent + TTL;
                won(myrev);
                goto held
            :: else
            fi
        :: else ->
            /* no spare, or it ran out (DLOCK__ETCD_LEASE_GONE): a lease
             * of its own, granted now, kept only if the txn put the key */
            if
            :: sp_in[i] && lexp[SPARE(i)] == 0 -> sp_in[i] = 0
            :: else
            fi;
            others(i, c);
            if
            :: c == 0 ->
                lexp[OWN(i)] = now + TTL;
                rev++; kc[i] = rev; kl[i] = OWN(i); myrev = rev;
                lease = OWN(i); onspare = 0;
                hold[i] = 1; dl[i] = sent + TTL;
                won(myrev);
                goto held
            :: else
            fi
        fi;
        printf("t=%d c%d: busy, it waits\n", now, i);
        c = 0
    }

queue:
    /* the short lease and our key on it, at the end of the queue */
    atomic {
        if
        :: rev >= RMAX -> goto idle    /* gives up */
        :: else
        fi;
        lexp[SHORT(i)] = now + WTTL;
        rev++; kc[i] = rev; kl[i] = SHORT(i); myrev = rev;
        printf("t=%d c%d queues at revision %d\n", now, i, myrev)
    }
    do
    :: /* a wake-up with a spare ready: the check and the move in one txn
        * (move with first, in try_queued), beside the spare's keepalive */
        atomic {
            sp_in[i] && now < sp_ok[i] + TTL && lexp[SPARE(i)] != 0 ->
            sent = now;
#ifdef REVOKE_EARLY
            drop_lease(SHORT(i));
#endif
#ifndef PROMOTE_NO_KA
            keepalive(SPARE(i), alive);
            sp_ok[i] = now;
#endif
            ahead(i, myrev, c);
            if
            :: REV_OK(i) && FIRST_OK(c) ->
                if
                :: kc[i] == 0 -> rev++; kc[i] = rev   /* put again: a new key */
                :: else
                fi;
                kl[i] = SPARE(i);
                TAKE_SPARE(i);
                lease = SPARE(i); onspare = 1; okh = sp_ok[i];
                hold[i] = 1; dl[i] = sent + TTL;
#ifndef REVOKE_EARLY
                pend = 1;     /* dlock__etcd_revoke_later */
#endif
                won(myrev);
                c = 0;
                goto held
            :: else ->        /* not moved: the spare goes back, renewed */
                printf("t=%d c%d: woken, not first\n", now, i)
            fi;
            c = 0;
            if
            :: kc[i] != myrev -> goto requeue
            :: else
            fi
        }
    :: /* a wake-up without a spare, or the short lease's keepalive (every
        * third of it, which is the same request as far as the key goes):
        * the keepalive and the read-only check, at once */
        atomic {
            sent = now;
            keepalive(SHORT(i), alive);
            if
            :: !alive || kc[i] != myrev -> goto requeue
            :: else
            fi;
            ahead(i, myrev, c);
            if
            :: c == 0 -> c = 0; goto promote
            :: else -> c = 0
            fi
        }
    :: /* giving up: revoke the short lease, the key with it */
        atomic {
            drop_lease(SHORT(i));
            printf("t=%d c%d gives up\n", now, i);
            goto idle
        }
    od;

requeue:
    atomic {
        printf("t=%d c%d: its key is gone, it queues again\n", now, i);
        lexp[SHORT(i)] = 0;
        goto queue
    }

promote:
    /* (the client may pause here) the holder's lease, granted now, and the
     * move guarded by our create revision; then the short lease revoked,
     * off the path, as after the move onto a spare */
    atomic {
        lexp[OWN(i)] = now + TTL;
        if
        :: REV_OK(i) ->
            if
            :: kc[i] == 0 -> rev++; kc[i] = rev   /* put again: a new key */
            :: else
            fi;
            kl[i] = OWN(i);
            pend = 1;         /* dlock__etcd_revoke_later */
            lease = OWN(i); onspare = 0;
            hold[i] = 1; dl[i] = sent + TTL;
            won(myrev);
            goto held
        :: else ->           /* DLOCK_ELOST: the grant revoked, queue again */
            lexp[OWN(i)] = 0;
            goto requeue
        fi
    }

held:
    do
    :: /* the watchdog's renewal: a keepalive of the lease */
        atomic {
            keepalive(lease, alive);
#ifdef SESSION
            if
            :: alive && lease == SPARE(i) -> sp_ok[i] = now   /* session_seen */
            :: else
            fi;
#endif
            if
            :: alive && kc[i] != 0 && kl[i] == lease ->
                dl[i] = now + TTL; okh = now
            :: else ->
                dl[i] = 0;    /* lost: on_lost */
                printf("t=%d c%d: its lease is gone, the lock lost\n", now, i)
            fi
        }
    :: /* the short lease's revoke, off the path, at any later moment */
        atomic { pend -> drop_lease(SHORT(i)); pend = 0 }
    :: break
    od;
    atomic {
        /* release */
        if
#ifdef SESSION
        :: onspare ->
            /* one delete of our key, by name; the session lease stays as
             * it is, kept alive by the client's other locks */
            if
            :: kc[i] != 0 && kl[i] == lease -> kc[i] = 0
            :: else
            fi;
#ifdef BACK_AT_RELEASE
            sp_ok[i] = now;
#endif
            printf("t=%d c%d releases: deletes its key\n", now, i)
#endif
        :: !IS_SESSION && onspare && kc[i] != 0 && kl[i] == lease ->
            /* one delete of our key; prev_kv says it was on the spare:
             * the spare goes back to the pool, alive as of okh */
            kc[i] = 0;
            sp_used[i] = 0; sp_in[i] = 1;
#ifdef BACK_AT_RELEASE
            sp_ok[i] = now;
#else
            sp_ok[i] = okh;
#endif
            printf("t=%d c%d releases; the spare goes back, alive as of %d\n", now, i, sp_ok[i])
        :: else ->
            drop_lease(lease);
            sp_used[i] = 0;
            printf("t=%d c%d releases: revokes its lease\n", now, i)
        fi;
        if
        :: pend -> drop_lease(SHORT(i)); pend = 0
        :: else
        fi;
        hold[i] = 0; dl[i] = 0; onspare = 0; lease = 0; okh = 0;
        myrev = 0; sent = 0; alive = 0;
        goto idle
    }

end_done:
    skip
}

/* The backend's spare thread, for every client: grants a spare when the
 * pool is empty, keeps the spare alive (its own keepalive, or one riding in
 * the watchdog's request), drops one that ran out. */
proctype Thread(byte i)
{
end_spin:
    do
    :: atomic {
        !sp_in[i] && !sp_used[i] && lexp[SPARE(i)] == 0 ->
        lexp[SPARE(i)] = now + TTL; sp_ok[i] = now; sp_in[i] = 1
       }
#if defined(SPARE_KEEPALIVE) || defined(SESSION)
    /* (a session lease: the renewals of the client's other locks) */
    :: atomic {
        sp_in[i] && lexp[SPARE(i)] != 0 && sp_ok[i] != now ->
        lexp[SPARE(i)] = now + TTL; sp_ok[i] = now
       }
#endif
    od
}

/* Time: one clock. A lease runs out at its expiry, and its keys go. */
active proctype Clock()
{
    byte l;
    byte j;
end_tick:
    do
    :: atomic {
        now < TMAX ->
        now++;
        for (l : 0 .. NL - 1) {
            if
            :: lexp[l] != 0 && now >= lexp[l] ->
                printf("t=%d lease %d runs out\n", now, l);
                drop_lease(l)
            :: else
            fi
        }
        l = 0
       }
    od
}

#define BEL(i) (believes(i) -> 1 : 0)
#if N == 2
#define BELIEVERS (BEL(0) + BEL(1))
#else
#define BELIEVERS (BEL(0) + BEL(1) + BEL(2))
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
            run Thread(k)
        }
        k = 0
    }
}
