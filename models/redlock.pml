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
 * And one that does not (the full wait of the code before issue 13's speed
 * work, to compare): -DWAIT_ALL, every request answered before deciding.
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

mtype = { OK, BUSY, FAIL };   /* a script's reply as the client sees it;
                               * FAIL: none came back */

/* ---- the nodes ------------------------------------------------------------ */
byte key[NODES];       /* dlock:{NAME}: the owner token, 0 when absent */
byte hw[NODES];        /* dlock:{NAME}:fence: the high-water mark */
#ifdef FORGET
bool forgot;           /* the one restart that loses data has happened */
#endif

/* ---- ghosts for properties (2) and (3) ----------------------------------- */
byte done_max;         /* the highest fence of an acquisition that succeeded */
int issued;            /* a bit per fence of an acquisition that succeeded */
byte store_max;        /* the store's highest fence seen */
byte store_tok;        /* the holder (token) that wrote with it */

/* ---- the scripts ----------------------------------------------------------
 * A key whose PX ran out on its node's clock is gone already (Nodes deletes
 * it), so "key[n] == 0" is SET NX succeeding. */

/* Round 1 on node n for token t: SET NX PX and raise the high-water mark
 * (or PEXPIRE our own key and leave the mark), answering the mark. Out:
 * res, h. */
inline round1_lua(n, t, res, h)
{
    if
    :: key[n] == 0 ->
        key[n] = t;    /* PX lease */
        hw[n]++;       /* in the same step */
        h = hw[n]; res = OK;
        printf("c%d round 1 on node %d: granted, high-water now %d\n", CLIENT(t), n, h)
    :: key[n] == t ->  /* PEXPIRE: a retry */
        h = hw[n]; res = OK;
        printf("c%d round 1 on node %d: ours already, high-water %d\n", CLIENT(t), n, h)
    :: else ->
        res = BUSY;
        printf("c%d round 1 on node %d: busy (c%d's)\n", CLIENT(t), n, CLIENT(key[n]))
    fi
}

/* Round 2 on node n: raise the high-water mark to f if the key is ours. */
inline round2_lua(n, t, f, res)
{
    if
    :: key[n] == t ->
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
inline release_all(t)
{
    if
    :: key[0] == t -> key[0] = 0
    :: else
    fi;
    if
    :: key[1] == t -> key[1] = 0
    :: else
    fi;
    if
    :: key[2] == t -> key[2] = 0
    :: else
    fi
}

/* A renewal: compare-and-PEXPIRE on every node (the PEXPIRE changes
 * nothing here, as a key may expire at any moment anyway); if a quorum
 * answered 1, SET the key again (NX PX) on the nodes that answered that it
 * was gone, each of these requests run or not. One step: the replies are
 * taken at one moment. */
inline renew_all(t)
{
    cnt = (key[0] == t -> 1 : 0) + (key[1] == t -> 1 : 0) + (key[2] == t -> 1 : 0);
    if
    :: cnt >= QUORUM ->
        if
        :: key[0] == 0 -> if :: key[0] = t :: skip fi
        :: else
        fi;
        if
        :: key[1] == 0 -> if :: key[1] = t :: skip fi
        :: else
        fi;
        if
        :: key[2] == 0 -> if :: key[2] = t :: skip fi
        :: else
        fi
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
#define RPC(script, res) \
    if \
    :: true -> script \
    :: true -> script; res = FAIL; \
        printf("c%d: the reply of node %d is lost\n", i, n) \
    :: res = FAIL; printf("c%d: the request to node %d is lost\n", i, n) \
    fi

#define SEND(script) \
    if \
    :: true -> script \
    :: skip \
    fi

/* The requests of one round go to the nodes in mask in any order: n is the
 * next one, and leaves mask. */
inline pick(n, mask)
{
    if
    :: mask & 1 -> n = 0
    :: mask & 2 -> n = 1
    :: mask & 4 -> n = 2
    fi;
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
        SEND(round1_lua(n, t, res, h))
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
    mtype res;

idle:
    if
    :: round < ROUNDS ->
        round++; attempt = 0;
        t = i * ROUNDS + round
    :: else -> goto end_done
    fi;

attempt_:
    attempt++;
    atomic { before = done_max; todo = ALL; got = 0; cnt = 0; same = 0; f = 0 }

    /* round 1 */
    do
    :: todo == 0 -> break
#ifndef WAIT_ALL
    :: cnt >= QUORUM ->   /* decided: the rest are late */
        atomic { late = todo; todo = 0; break }
#endif
    :: todo != 0 ->
        atomic {
            pick(n, todo);
            RPC(round1_lua(n, t, res, h), res);
            if
            :: res == OK ->
                got = got | (1 << n); cnt++;
                if
                :: h > f -> f = h; same = 1
                :: h == f -> same++
                :: else
                fi
            :: else
            fi;
            n = 0; h = 0; res = 0
        }
    od;
    atomic {
        if
        :: cnt >= QUORUM -> skip
        :: true -> goto fail    /* fewer than a quorum, or elapsed >= lease:
                                 * the clients' clock is free too */
        fi;
#ifdef NO_UNANIMITY
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
#ifndef WAIT_ALL
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
    :: attempt < ATTEMPTS -> goto attempt_   /* the retry, same token */
    :: else -> goto idle                     /* DLOCK_EBUSY or a timeout */
    fi;

success:
    atomic {
        printf("c%d holds the lock with fence %d\n", i, f);
        /* property (2) */
        assert(!CHECK(2) || (f > before && ((issued >> f) & 1) == 0));
        issued = issued | (1 << f);
        if
        :: f > done_max -> done_max = f
        :: else
        fi;
        todo = 0; got = 0; cnt = 0; same = 0; before = 0; renews = 0
    }

held:
    do
    :: /* The caller's write reaches the store, with its fence, at any
        * moment while held, also once the lease has run out. */
        atomic {
            if
            :: f >= store_max ->
                assert(!CHECK(3) || f > store_max || store_tok == t);  /* (3) */
                store_max = f; store_tok = t;
                printf("c%d writes with fence %d: accepted\n", i, f)
            :: else ->
                printf("c%d writes with fence %d: refused\n", i, f)
            fi
        }
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
        f = 0; renews = 0; release_all(t)
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
        printf("node %d: the key of c%d expires\n", m, CLIENT(key[m]));
        key[m] = 0; m = 0
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
