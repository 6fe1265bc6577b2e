/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dlock's Redlock fence, checked with spin (models/check.sh, `make verify`;
 * what is modelled and what is not: docs/verification.md, the proof:
 * docs/redlock.md "Why the fence increases").
 *
 * Processes:
 *   Client(i)   one dlock client using one lock name over NODES independent
 *               Redis masters (src/backends/redlock/): acquire in one round
 *               (two when the granting nodes' values differ), write to a
 *               fenced store while it holds, renew, release.
 *   Nodes       time, as the nodes see it: a key expires on its node's own
 *               clock, and nothing ties that clock to any other (a node's
 *               clock may run fast, stop, or jump), so a key may expire at
 *               any moment after it was set. -DFORGET: the restart.
 * The nodes are the globals below. Each script is an inline that runs in one
 * atomic step, as Redis runs a script without interleaving.
 *
 * The protocol (docs/redlock.md), per acquisition attempt, every request to
 * every node in any order, each run and answered, run with its reply lost,
 * or never run; and once a quorum answered yes, the client may stop
 * waiting: the requests not run yet are late, and each runs at any later
 * moment (its reply unread) or never, but before the next request to that
 * node (one connection per node: the release runs after it):
 *   round 1  SET NX PX lease on dlock:{NAME}, and in the same step raise the
 *            node's high-water mark dlock:{NAME}:fence by one, answering the
 *            new mark (if the key holds our own token already: PEXPIRE, and
 *            the mark as it is). Held if a quorum granted and the time since
 *            round 1 was sent is below the lease. F = max(the values the
 *            granting nodes answered). If a quorum of them answered F, the
 *            acquisition succeeds with F at once (one round).
 *   round 2  otherwise, on the nodes that granted: high-water =
 *            max(high-water, F) if dlock:{NAME} still holds our token. The
 *            acquisition succeeds if a quorum confirmed; otherwise (and when
 *            round 1 failed) it releases on every node and fails (or tries
 *            again).
 *   holding  writes to the store with F; renewals (compare-and-PEXPIRE on
 *            every node; with a quorum renewed, SET again where the key is
 *            gone); release (compare-and-delete on every node).
 *
 * Switches that must break the fence (check.sh expects a counterexample):
 *   -DNO_UNANIMITY  no quorum check and no round 2: F = the maximum of the
 *                values the granting nodes answered, always in one round:
 *                the per-node counter and the maximum over the majority,
 *                which is not monotonic.
 *   -DFORGET     a node restarts once and forgets its high-water mark (and
 *                its key): no appendfsync always, or a disk lost.
 *   -DNO_CONFIRM_CHECK  round 2 (confirm.lua) raises the mark and answers 1
 *                without checking that the key still holds our token.
 * With -DOWNERS (owner ids, src/backends/redlock/redlock.c reentry_fence;
 * docs/redlock.md "Reentrancy"), the re-entry's fence rule:
 *   -DTENURE_ANY  the tenure T is reused although a granting node's value is
 *                above it (condition (b) dropped);
 *   -DTENURE_ONE  one node vouching for T is enough (a quorum, (a), dropped).
 * And one that does not (the full wait of the code before issue 13's speed
 * work, to compare): -DWAIT_ALL, every request answered before deciding.
 * Two that only shrink the search, for the larger checks: -DIN_ORDER (a
 * round's requests reach the nodes in a fixed order) and -DNO_LOSS (every
 * request is run and answered).
 *
 * Properties (-DPROPS=n checks property n only; the default, 0, both):
 *   (2) fences strictly increase in the order of acquisition: an acquisition
 *       that succeeds has a fence higher than that of every acquisition that
 *       had succeeded before it began (before its round 1 was sent), and no
 *       two acquisitions that succeed ever have the same fence;
 *   (3) a store that keeps the highest fence it has seen, and refuses lower
 *       ones, accepts no write from a holder that is not the latest it has
 *       seen: no two holders ever write with the same fence.
 * (The numbers are those of models/redis_mutex.pml. Its property (1), mutual
 * exclusion, is not checked here: it rests on the clocks, which are free in
 * this model, and holders that overlap are exactly what the fence is for.)
 */

/* ---- bounds and durations (each may be set with -D) ---------------------- */
#ifndef CLIENTS
#define CLIENTS 2    /* clients (2 or 3) */
#endif
#ifndef ROUNDS
#define ROUNDS 1     /* acquisitions per client, each with a fresh token */
#endif
#ifndef ATTEMPTS
#define ATTEMPTS 1   /* attempts per acquisition, with the same token */
#endif
#ifndef RETRIERS
#define RETRIERS CLIENTS  /* clients 0 .. RETRIERS - 1 get ATTEMPTS attempts,
                           * the others one */
#endif
#ifndef RENEWS
#define RENEWS 1     /* renewals per hold, at most */
#endif
#ifndef PROPS
#define PROPS 0
#endif
#define CHECK(p) (PROPS == 0 || PROPS == p)

#define NODES 3      /* the redlock:// URL's N */
#define QUORUM 2     /* N / 2 + 1 */
#define ALL 7        /* a bit per node */

/* Tokens; 0 is none. Acquisition r (1-based) of client i has token
 * i * ROUNDS + r. */
#define CLIENT(tk) (((tk) - 1) / ROUNDS)

/* -DOWNERS: owner ids, every acquisition reentrant. The last client is
 * owner 2, the others are handles of owner 1 (each with its own token, as
 * each dlock_acquire has). The key holds the owner id, and holds[] the
 * handles' holds with the fence recorded for each (acquire.lua, confirm.lua,
 * release.lua, renew.lua, reset.lua with an owner id). */
#ifdef OWNERS
#define OWNER_OF(c) ((c) == CLIENTS - 1 -> 2 : 1)
#define VAL(tk) OWNER_OF(CLIENT(tk))
#define TOKENS 4               /* tokens 1 .. 3 */
#ifdef TENURE_ANY
#define NOT_BELOW(x, y) true
#else
#define NOT_BELOW(x, y) ((x) >= (y))
#endif
#define HELD(n, tk) ((hp[n] >> (tk)) & 1)
/* Owner 1's handles nest, as a reentrant caller's do: its second
 * acquisition (a new token) is made while the first is held, and both write;
 * owner 2 acquires once. */
#define ROUNDS_OF(c) ((c) < CLIENTS - 1 -> ROUNDS : 1)
#else
#define VAL(tk) (tk)
#define ROUNDS_OF(c) ROUNDS
#endif

mtype = { OK, BUSY, FAIL };   /* a script's reply as the client sees it;
                               * FAIL: none came back */

/* ---- the nodes ------------------------------------------------------------ */
byte key[NODES];       /* dlock:{NAME}: the owner token, 0 when absent */
byte hw[NODES];        /* dlock:{NAME}:fence: the high-water mark */
#ifdef OWNERS
byte hp[NODES];        /* dlock:{NAME}:holds: a bit per token holding */
byte hf[NODES * TOKENS];  /* the fence recorded for each hold (0: none) */
#endif
#ifdef FORGET
bool forgot;           /* the one restart that loses data has happened */
#endif

/* ---- ghosts for properties (2) and (3) ----------------------------------- */
#ifdef OWNERS
/* Per owner (1, 2): a re-entry reuses its owner's fence, which is the rule;
 * properties (2) and (3) are about different owners. */
byte done_max[3];
int issued[3];
#define DONE_MAX(t) done_max[3 - VAL(t)]   /* the other owner's */
#define ISSUED_OTHER(t) issued[3 - VAL(t)]
#define ISSUED(t) issued[VAL(t)]
#define DONE_MINE(t) done_max[VAL(t)]
#else
byte done_max;         /* the highest fence of an acquisition that succeeded */
int issued;            /* a bit per fence of an acquisition that succeeded */
#define DONE_MAX(t) done_max
#define ISSUED_OTHER(t) issued
#define ISSUED(t) issued
#define DONE_MINE(t) done_max
#endif
byte store_max;        /* the store's highest fence seen */
byte store_tok;        /* the holder (token, or owner id) that wrote with it */

/* ---- the scripts ----------------------------------------------------------
 * A key whose PX ran out on its node's clock is gone already (Nodes deletes
 * it), so "key[n] == 0" is SET NX succeeding. */

/* Round 1 on node n for token t: SET NX PX and raise the high-water mark
 * (or PEXPIRE our own key and leave the mark), answering the mark. Out:
 * res, h. */
inline round1_lua(n, t, res, h, ten)
{
    if
    :: key[n] == 0 ->
        key[n] = VAL(t);    /* PX lease */
        hw[n]++;       /* in the same step */
        h = hw[n]; res = OK;
#ifdef OWNERS
        hp[n] = 1 << t;     /* the old holds dropped, ours with fence 0 */
        hf[n * TOKENS + t] = 0;
#endif
        printf("c%d round 1 on node %d: granted, high-water now %d\n", CLIENT(t), n, h)
    :: key[n] == VAL(t) ->  /* PEXPIRE: a retry, or (owner) a re-entry */
        h = hw[n]; res = OK;
#ifdef OWNERS
        /* tenure: the highest fence recorded for the owner's holds */
        ten = 0;
        for (k : 0 .. TOKENS - 1) {
            if
            :: HELD(n, k) && hf[n * TOKENS + k] > ten -> ten = hf[n * TOKENS + k]
            :: else
            fi
        }
        k = 0;
        if
        :: !HELD(n, t) -> hp[n] = hp[n] | (1 << t); hf[n * TOKENS + t] = 0
        :: else
        fi;
        printf("c%d round 1 on node %d: the owner's already, high-water %d, tenure %d\n", CLIENT(t), n, h, ten)
#else
        printf("c%d round 1 on node %d: ours already, high-water %d\n", CLIENT(t), n, h)
#endif
    :: else ->
        res = BUSY;
        printf("c%d round 1 on node %d: busy\n", CLIENT(t), n)
    fi
}

/* Round 2 on node n: raise the high-water mark to f if the key is ours. */
inline round2_lua(n, t, f, res)
{
    if
#ifdef NO_CONFIRM_CHECK
    :: true ->
#elif defined(OWNERS)
    :: key[n] == VAL(t) && HELD(n, t) ->
        hf[n * TOKENS + t] = f;
#else
    :: key[n] == t ->
#endif
        if
        :: hw[n] < f -> hw[n] = f
        :: else
        fi;
        res = OK;
        printf("c%d round 2 on node %d: high-water now %d\n", CLIENT(t), n, hw[n])
    :: else ->
        res = BUSY;
        printf("c%d round 2 on node %d: the key is not ours\n", CLIENT(t), n)
    fi
}

/* Release: compare-and-delete on every node. It is one step here: a
 * release that reaches only some nodes, or reaches them one by one, leaves
 * states that the keys' expiry (Nodes, at any moment) reaches too. */
#ifdef OWNERS
/* release.lua with an owner id: our hold goes; the key when no hold is left */
inline release_one(n, t)
{
    if
    :: key[n] == VAL(t) && HELD(n, t) ->
        hp[n] = hp[n] & ~(1 << t); hf[n * TOKENS + t] = 0;
        if
        :: hp[n] == 0 -> key[n] = 0
        :: else
        fi
    :: else
    fi
}
#else
inline release_one(n, t)
{
    if
    :: key[n] == t -> key[n] = 0
    :: else
    fi
}
#endif

inline release_all(t)
{
    release_one(0, t);
    release_one(1, t);
    release_one(2, t)
}

/* A renewal: compare-and-PEXPIRE on every node (the PEXPIRE changes
 * nothing here, as a key may expire at any moment anyway); if a quorum
 * answered 1, SET the key again (NX PX) on the nodes that answered that it
 * was gone, each of these requests run or not. One step: the replies are
 * taken at one moment. */
#ifdef OWNERS
#define OURS(n, t) (key[n] == VAL(t) && HELD(n, t))
/* reset.lua with an owner id: the key set again where it is gone (the old
 * holds dropped), and our hold with no fence (HSETNX 0) where the owner's
 * key is there without it. */
inline reset_one(n, t)
{
    if
    :: key[n] == 0 ->
        if
        :: key[n] = VAL(t); hp[n] = 1 << t; hf[n * TOKENS + t] = 0
        :: skip
        fi
    :: key[n] == VAL(t) && !HELD(n, t) ->
        if
        :: hp[n] = hp[n] | (1 << t); hf[n * TOKENS + t] = 0
        :: skip
        fi
    :: else
    fi
}
#else
#define OURS(n, t) (key[n] == t)
inline reset_one(n, t)
{
    if
    :: key[n] == 0 -> if :: key[n] = t :: skip fi
    :: else
    fi
}
#endif

inline renew_all(t)
{
    cnt = (OURS(0, t) -> 1 : 0) + (OURS(1, t) -> 1 : 0) + (OURS(2, t) -> 1 : 0);
    if
    :: cnt >= QUORUM ->
        reset_one(0, t);
        reset_one(1, t);
        reset_one(2, t)
    :: else             /* fewer than a quorum: the lock is lost */
    fi;
    cnt = 0
}

/* ---- requests and replies ---------------------------------------------------
 * A request to one node is sent, run and answered in one step, or run with
 * its reply lost (a per-node timeout, a dropped connection), or never run;
 * the client hears FAIL for the last two. A request's delay is, to everyone
 * else, its sender pausing before it sends; the client may pause between
 * any two of its steps. */
#ifdef NO_LOSS   /* every request is run, its reply read */
#define RPC(script, res) script
#else
#define RPC(script, res) \
    if \
    :: true -> script \
    :: true -> script; res = FAIL; \
        printf("c%d: the reply of node %d is lost\n", i, n) \
    :: res = FAIL; printf("c%d: the request to node %d is lost\n", i, n) \
    fi
#endif

#define SEND(script) \
    if \
    :: true -> script \
    :: skip \
    fi

/* The requests of one round go to the nodes in mask in any order: n is the
 * next one, and leaves mask. */
inline pick(n, mask)
{
#ifdef IN_ORDER
    if
    :: mask & 1 -> n = 0
    :: else -> if :: mask & 2 -> n = 1 :: else -> n = 2 fi
    fi;
#else
    if
    :: mask & 1 -> n = 0
    :: mask & 2 -> n = 1
    :: mask & 4 -> n = 2
    fi;
#endif
    mask = mask & ~(1 << n)
}

/* ---- a client ----------------------------------------------------------- */

/* A late request (sent in a round the client stopped waiting for) runs on
 * its node now, its reply unread; or it never runs (its connection
 * closed). Client locals: late (round 1's), late2 (round 2's). */
inline run_late()
{
    if
    :: late != 0 ->
        pick(n, late);
        printf("c%d: round 1's late request to node %d\n", i, n);
        SEND(round1_lua(n, t, res, h, ten))
    :: late2 != 0 ->
        pick(n, late2);
        printf("c%d: round 2's late request to node %d\n", i, n);
        SEND(round2_lua(n, t, f, res))
    fi;
    n = 0; h = 0; res = 0
}

/* Before the release is sent: it runs after the late requests on each
 * node (or they never run). */
inline flush_late()
{
    do
    :: late != 0 || late2 != 0 -> run_late()
    :: else -> break
    od
}

proctype Client(byte i)
{
    byte t;            /* the owner token of the current acquisition */
    byte round;
    byte attempt;
    byte before;       /* done_max when round 1 was sent */
    byte todo;         /* nodes not asked yet in this round */
    byte late;         /* round 1 requests not run yet, not waited for */
    byte late2;        /* round 2's */
    byte got;          /* nodes that granted (round 1) or confirmed (round 2) */
    byte cnt;
    byte same;         /* granting nodes that answered f */
    byte n;
    byte h;
    byte f;            /* the fence: the highest value answered */
    byte renews;
    byte ten;          /* round 1's tenure (owners) */
    byte k;
#ifdef OWNERS
    byte tens[NODES];  /* each granting node's tenure */
    byte a;
    byte t0;           /* the outer handle's token while the inner acquires */
    byte f0;           /* and its fence */
#endif
    mtype res;

idle:
    if
    :: round < ROUNDS_OF(i) ->
        round++; attempt = 0;
        t = i * ROUNDS + round
    :: else -> goto end_done
    fi;

attempt_:
    attempt++;
    atomic { before = DONE_MAX(t); todo = ALL; got = 0; cnt = 0; same = 0; f = 0 }

    /* round 1 */
    do
    :: todo == 0 -> break
#if !defined(WAIT_ALL) && !defined(OWNERS)   /* an owner waits for every node */
    :: cnt >= QUORUM ->   /* decided: the rest are late */
        atomic { late = todo; todo = 0; break }
#endif
    :: todo != 0 ->
        atomic {
            pick(n, todo);
            RPC(round1_lua(n, t, res, h, ten), res);
            if
            :: res == OK ->
                got = got | (1 << n); cnt++;
#ifdef OWNERS
                tens[n] = ten;
#endif
                if
                :: h > f -> f = h; same = 1
                :: h == f -> same++
                :: else
                fi
            :: else
            fi;
            n = 0; h = 0; res = 0; ten = 0
        }
    od;
    atomic {
        if
        :: cnt >= QUORUM -> skip
        :: true -> goto fail    /* fewer than a quorum, or elapsed >= lease:
                                 * the clients' clock is free too */
        fi;
#ifdef OWNERS
        /* reentry_fence: T when a quorum of the granting nodes replied the
         * tenure T and no granting node's value (f, their highest) is above
         * it; else a new fence above every value. Always round 2. */
        h = 0;
        for (a : 0 .. NODES - 1) {
            if
            :: h == 0 && ((got >> a) & 1) && tens[a] != 0 && NOT_BELOW(tens[a], f) ->
                same = 0;
                for (k : 0 .. NODES - 1) {
                    if
                    :: ((got >> k) & 1) && tens[k] == tens[a] -> same++
                    :: else
                    fi
                }
#ifdef TENURE_ONE
                if :: same >= 1 -> h = tens[a] :: else fi
#else
                if :: same >= QUORUM -> h = tens[a] :: else fi
#endif
            :: else
            fi
        }
        if
        :: h != 0 -> f = h;
            printf("c%d: a re-entry into the tenure with fence %d\n", i, f)
        :: else -> f = f + 1
        fi;
        h = 0; a = 0; k = 0; same = 0;
        tens[0] = 0; tens[1] = 0; tens[2] = 0;
        todo = got; got = 0; cnt = 0
#elif defined(NO_UNANIMITY)
        goto success   /* F is the maximum of the counters, as raised */
#else
        if
        :: same >= QUORUM -> goto success   /* one round: F is each mark of
                                             * a quorum, set with our key */
        :: else
        fi;
        todo = got; got = 0; cnt = 0
#endif
    }

    /* round 2, on the nodes that granted */
    do
    :: todo == 0 -> break
#if !defined(WAIT_ALL) && !defined(OWNERS)
    :: cnt >= QUORUM ->
        atomic { late2 = todo; todo = 0; break }
#endif
    :: todo != 0 ->
        atomic {
            pick(n, todo);
            RPC(round2_lua(n, t, f, res), res);
            if
            :: res == OK -> cnt++
            :: else
            fi;
            n = 0; res = 0
        }
    :: atomic { late != 0 -> run_late() }
    od;
    atomic {
        if
        :: cnt >= QUORUM -> goto success
        :: else -> goto fail
        fi
    }

fail:
    /* release on every node, those that timed out included */
    atomic {
        flush_late();
        printf("c%d fails, releases on every node\n", i);
        got = 0; cnt = 0; same = 0; f = 0; before = 0; release_all(t)
    }
    if
    :: attempt < (i < RETRIERS -> ATTEMPTS : 1) ->
        goto attempt_                        /* the retry, same token */
    :: else
    fi;
#ifdef OWNERS
    if
    :: t0 != 0 ->      /* the inner failed; the outer still holds */
        atomic { t = t0; f = f0; t0 = 0; f0 = 0; goto held }
    :: else
    fi;
#endif
    goto idle;                                /* DLOCK_EBUSY or a timeout */

success:
    atomic {
        printf("c%d holds the lock with fence %d\n", i, f);
        /* property (2) */
        assert(!CHECK(2) || (f > before && ((ISSUED_OTHER(t) >> f) & 1) == 0));
        ISSUED(t) = ISSUED(t) | (1 << f);
        if
        :: f > DONE_MINE(t) -> DONE_MINE(t) = f
        :: else
        fi;
        todo = 0; got = 0; cnt = 0; same = 0; before = 0; renews = 0
    }
#ifdef OWNERS
    if
    :: t0 == 0 && round < ROUNDS_OF(i) ->
        atomic { t0 = t; f0 = f; goto idle }   /* re-enter while holding */
    :: else
    fi;
#endif

held:
    do
    :: /* The caller's write reaches the store, with its fence, at any
        * moment while held, also once the lease has run out. */
        atomic {
            if
            :: f >= store_max ->
                assert(!CHECK(3) || f > store_max || store_tok == VAL(t));  /* (3) */
                store_max = f; store_tok = VAL(t);
                printf("c%d writes with fence %d: accepted\n", i, f)
            :: else ->
                printf("c%d writes with fence %d: refused\n", i, f)
            fi
        }
#ifdef OWNERS
    :: /* the outer handle writes too */
        atomic {
            t0 != 0 ->
            if
            :: f0 >= store_max ->
                assert(!CHECK(3) || f0 > store_max || store_tok == VAL(t0));  /* (3) */
                store_max = f0; store_tok = VAL(t0);
                printf("c%d writes with the outer fence %d: accepted\n", i, f0)
            :: else ->
                printf("c%d writes with the outer fence %d: refused\n", i, f0)
            fi
        }
#endif
    :: /* a renewal (one step, see renew_all), on the watchdog's own
        * connections: the late requests may run before or after it */
        atomic { renews < RENEWS -> renews++; renew_all(t) }
    :: /* a late request runs on its node */
        atomic { (late != 0 || late2 != 0) -> run_late() }
    :: /* release on every node */
        break
    od;
    atomic {
        flush_late();
        printf("c%d releases on every node\n", i);
        f = 0; renews = 0; release_all(t);
#ifdef OWNERS
        if
        :: t0 != 0 -> release_all(t0); t0 = 0; f0 = 0
        :: else
        fi
#endif
    }
    goto idle;

end_done:
    skip
}

/* Time. A key expires on its node's own clock, and nothing here ties that
 * clock to any other: it may run fast, stop, or jump. So a key may expire at
 * any moment after it was set (the strongest assumption a clock-free proof
 * can face; with a real clock the key lives at most its PX, which is one of
 * these behaviours). The clients' clock only decides whether an acquisition
 * took longer than its lease, which a client may find at any moment too
 * (round 1's "elapsed >= lease"). */
active proctype Nodes()
{
    byte m;
end_tick:
    do
    :: atomic {
        if
        :: key[0] != 0 -> m = 0
        :: key[1] != 0 -> m = 1
        :: key[2] != 0 -> m = 2
        fi;
        printf("node %d: the key expires\n", m);
        key[m] = 0;
#ifdef OWNERS
        hp[m] = 0;     /* the holds share the key's lease */
#endif
        m = 0
       }
#ifdef FORGET
    :: atomic {
        /* a restart without the last writes on disk: the node comes back
         * empty (its key and its high-water mark gone) */
        !forgot ->
        if
        :: m = 0
        :: m = 1
        :: m = 2
        fi;
        printf("node %d restarts and forgets its high-water %d\n", m, hw[m]);
        key[m] = 0; hw[m] = 0;
#ifdef OWNERS
        hp[m] = 0;
#endif
        forgot = 1; m = 0
       }
#endif
    od
}

init
{
    byte k;
    atomic {
        for (k : 0 .. CLIENTS - 1) {
            run Client(k)
        }
        k = 0
    }
}
