// SPDX-License-Identifier: BSD-3-Clause
//
// The Java side of the Curator interop test (interop.sh): real Curator
// recipes from Debian's jars, on the same ZooKeeper paths as dlock's
// zk:// backend, so that a lock taken by one side excludes the other.
//
//   java CuratorWorker CONNECT KIND PATH loop COUNT CMD...
//       COUNT times: take the lock, run CMD (FENCE in its environment: the
//       czxid of the holder's node where Curator lets us see the node, else
//       0), give the lock back.
//   java CuratorWorker CONNECT KIND PATH hold READY GO
//       take the lock, write READY, wait until the file GO exists, give the
//       lock back. (The test's own handshake: the wait is on a file the test
//       creates, and the test bounds it.)
//   java CuratorWorker CONNECT KIND PATH try WAIT_MS
//       try to take the lock for WAIT_MS: exit 0 (and release) when had,
//       3 when the time ran out.
//   java CuratorWorker CONNECT leader PATH ID leader
//       print the current leader's id of a LeaderLatch election (empty line
//       when none).
//
// With CURATOR_AUTH=USER:PASSWORD in the environment, the client adds
// that digest auth and creates every node with CREATOR_ALL_ACL, as dlock
// does for zk://USER:PASSWORD@... (docs/zookeeper.md, "Access control").
//
// KIND: mutex (InterProcessMutex), read / write (InterProcessReadWriteLock's
// two sides), sem:N (InterProcessSemaphoreV2 with N leases), latch:ID
// (LeaderLatch with participant id ID; "loop" runs CMD while leading, then
// closes the latch).
// Exit status: 0 done, 2 usage, 3 timed out, 1 anything else (message on
// stderr).

import java.io.File;
import java.io.FileWriter;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.api.ACLProvider;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.retry.ExponentialBackoffRetry;
import org.apache.zookeeper.ZooDefs;
import org.apache.zookeeper.data.ACL;
import org.apache.zookeeper.data.Stat;

public final class CuratorWorker {
    // One held lock of any kind: how to take it and give it back, and the
    // node it holds (null when the recipe does not show it).
    private interface Held {
        boolean take(long waitMs) throws Exception; // waitMs < 0: forever
        void give() throws Exception;
        String node();
    }

    // InterProcessMutex and the read-write lock's sides keep their node's
    // path in a protected getLockPath(); these subclasses only expose it,
    // so that the worker can report the czxid (dlock's fence) of its node.
    private static final class Mutex extends InterProcessMutex {
        Mutex(CuratorFramework c, String path) { super(c, path); }
        String node() { return getLockPath(); }
    }

    private static final class Write extends InterProcessReadWriteLock.WriteLock {
        Write(CuratorFramework c, String path) { super(c, path, null); }
        String node() { return getLockPath(); }
    }

    private static final class Read extends InterProcessReadWriteLock.ReadLock {
        Read(CuratorFramework c, String path, Write w) { super(c, path, null, w); }
        String node() { return getLockPath(); }
    }

    private static Held mutexHeld(final Mutex m) {
        return new Held() {
            public boolean take(long w) throws Exception {
                if (w < 0) { m.acquire(); return true; }
                return m.acquire(w, TimeUnit.MILLISECONDS);
            }
            public void give() throws Exception { m.release(); }
            public String node() { return m.node(); }
        };
    }

    private static Held held(final CuratorFramework c, String kind, String path) {
        if (kind.equals("mutex"))
            return mutexHeld(new Mutex(c, path));
        if (kind.equals("write")) {
            final Write w = new Write(c, path);
            return new Held() {
                public boolean take(long t) throws Exception {
                    if (t < 0) { w.acquire(); return true; }
                    return w.acquire(t, TimeUnit.MILLISECONDS);
                }
                public void give() throws Exception { w.release(); }
                public String node() { return w.node(); }
            };
        }
        if (kind.equals("read")) {
            final Read r = new Read(c, path, new Write(c, path));
            return new Held() {
                public boolean take(long t) throws Exception {
                    if (t < 0) { r.acquire(); return true; }
                    return r.acquire(t, TimeUnit.MILLISECONDS);
                }
                public void give() throws Exception { r.release(); }
                public String node() { return r.node(); }
            };
        }
        if (kind.startsWith("sem:")) {
            final InterProcessSemaphoreV2 s =
                new InterProcessSemaphoreV2(c, path, Integer.parseInt(kind.substring(4)));
            return new Held() {
                Lease lease;
                public boolean take(long t) throws Exception {
                    lease = t < 0 ? s.acquire() : s.acquire(t, TimeUnit.MILLISECONDS);
                    return lease != null;
                }
                public void give() throws Exception { lease.close(); lease = null; }
                public String node() { return null; }
            };
        }
        if (kind.startsWith("latch:")) {
            final String id = kind.substring(6);
            return new Held() {
                LeaderLatch latch;
                public boolean take(long t) throws Exception {
                    latch = new LeaderLatch(c, path, id);
                    latch.start();
                    if (t < 0) { latch.await(); return true; }
                    if (latch.await(t, TimeUnit.MILLISECONDS)) return true;
                    latch.close();
                    return false;
                }
                public void give() throws Exception { latch.close(); latch = null; }
                public String node() { return latch.getOurPath(); }
            };
        }
        throw new IllegalArgumentException("unknown kind '" + kind
            + "' (mutex, read, write, sem:N, latch:ID)");
    }

    private static long fence(CuratorFramework c, Held h) throws Exception {
        String node = h.node();
        if (node == null) return 0;
        Stat st = c.checkExists().forPath(node);
        if (st == null) throw new IllegalStateException("our node " + node + " is gone");
        return st.getCzxid();
    }

    private static int run(List<String> cmd, long fence) throws Exception {
        ProcessBuilder pb = new ProcessBuilder(cmd).inheritIO();
        pb.environment().put("FENCE", Long.toString(fence));
        return pb.start().waitFor();
    }

    private static void usage(String why) {
        System.err.println("CuratorWorker: " + why + "\nusage: CuratorWorker CONNECT KIND PATH"
            + " (loop COUNT CMD... | hold READY GO | try WAIT_MS | leader)");
        System.exit(2);
    }

    public static void main(String[] a) throws Exception {
        if (a.length < 4) usage("too few arguments");
        String connect = a[0], kind = a[1], path = a[2], action = a[3];
        CuratorFrameworkFactory.Builder b = CuratorFrameworkFactory.builder()
            .connectString(connect).sessionTimeoutMs(10000).connectionTimeoutMs(10000)
            .retryPolicy(new ExponentialBackoffRetry(100, 5));
        String auth = System.getenv("CURATOR_AUTH");
        if (auth != null)
            b = b.authorization("digest", auth.getBytes(StandardCharsets.UTF_8))
                .aclProvider(new ACLProvider() {
                    public List<ACL> getDefaultAcl() { return ZooDefs.Ids.CREATOR_ALL_ACL; }
                    public List<ACL> getAclForPath(String p) { return ZooDefs.Ids.CREATOR_ALL_ACL; }
                });
        CuratorFramework c = b.build();
        c.start();
        if (!c.blockUntilConnected(30, TimeUnit.SECONDS)) {
            System.err.println("CuratorWorker: no connection to ZooKeeper " + connect + " in 30 s");
            System.exit(1);
        }
        int status = 0;
        try {
            if (action.equals("leader")) {
                // A LeaderLatch that never starts only reads the election.
                String id = new LeaderLatch(c, path, "observer").getLeader().getId();
                System.out.println(id);
            } else if (action.equals("loop")) {
                if (a.length < 6) usage("loop needs COUNT and CMD");
                int n = Integer.parseInt(a[4]);
                List<String> cmd = Arrays.asList(a).subList(5, a.length);
                Held h = held(c, kind, path);
                for (int i = 0; i < n && status == 0; i++) {
                    h.take(-1);
                    try {
                        int rc = run(cmd, fence(c, h));
                        if (rc != 0) {
                            System.err.println("CuratorWorker: command exited " + rc);
                            status = 1;
                        }
                    } finally {
                        h.give();
                    }
                }
            } else if (action.equals("hold")) {
                if (a.length != 6) usage("hold needs READY and GO");
                Held h = held(c, kind, path);
                h.take(-1);
                try (FileWriter w = new FileWriter(a[4] + ".tmp")) {
                    w.write(Long.toString(fence(c, h)) + "\n");
                }
                new File(a[4] + ".tmp").renameTo(new File(a[4]));
                File go = new File(a[5]);
                while (!go.exists())
                    Thread.sleep(20);
                h.give();
            } else if (action.equals("try")) {
                if (a.length != 5) usage("try needs WAIT_MS");
                Held h = held(c, kind, path);
                if (h.take(Long.parseLong(a[4])))
                    h.give();
                else
                    status = 3;
            } else {
                usage("unknown action '" + action + "'");
            }
        } catch (Exception e) {
            System.err.println("CuratorWorker " + kind + " " + path + ": " + e);
            status = 1;
        } finally {
            c.close();
        }
        System.exit(status);
    }
}
