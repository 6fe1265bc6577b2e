// SPDX-License-Identifier: BSD-3-Clause
//
// Curator's InterProcessMutex on the ZooKeeper that dlock-bench --zk
// measures: its uncontended cycle (acquire() + release()), for the same
// table. Driven by dlock-bench on stdin, so that its cycles run between
// dlock's, round by round, on the same server at the same time of the run:
// prints "ready" once connected and warmed up, then answers each command
// with a line:
//   cycles N    run N cycles, recording each    -> "ok"
//   report      "cycle_p50 cycle_p99" in microseconds, and exit
// Usage: java CuratorCycle HOST:PORT (Debian's libcurator-*-java jars).
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryOneTime;

public final class CuratorCycle {
    private CuratorCycle() {
    }

    private static double pct(List<Long> v, double p) {
        if (v.isEmpty()) {
            return 0;
        }
        List<Long> s = new ArrayList<>(v);
        Collections.sort(s);
        int rank = (int) Math.ceil(p / 100.0 * s.size());
        rank = Math.max(1, Math.min(s.size(), rank));
        return s.get(rank - 1) / 1000.0;
    }

    private static void cycles(InterProcessMutex m, int n, List<Long> out) throws Exception {
        for (int i = 0; i < n; i++) {
            long t0 = System.nanoTime();
            m.acquire();
            m.release();
            if (out != null) {
                out.add(System.nanoTime() - t0);
            }
        }
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 1) {
            System.out.println("usage: CuratorCycle HOST:PORT");
            System.exit(2);
        }
        CuratorFramework client = CuratorFrameworkFactory.newClient(args[0], 10000, 5000,
                new RetryOneTime(100));
        client.start();
        if (!client.blockUntilConnected(10, TimeUnit.SECONDS)) {
            System.out.println("cannot connect to ZooKeeper at " + args[0]);
            System.exit(1);
        }
        InterProcessMutex m = new InterProcessMutex(client, "/dlock-bench/curator-cycle");
        List<Long> times = new ArrayList<>();
        cycles(m, 500, null); // the JIT's warm-up
        System.out.println("ready");
        System.out.flush();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in,
                StandardCharsets.UTF_8));
        for (String line; (line = in.readLine()) != null;) {
            String[] w = line.trim().split(" ");
            if (w[0].equals("cycles") && w.length == 2) {
                cycles(m, Integer.parseInt(w[1]), times);
                System.out.println("ok");
            } else if (w[0].equals("report")) {
                System.out.printf("%.1f %.1f%n", pct(times, 50), pct(times, 99));
                System.out.flush();
                break;
            } else {
                System.out.println("unknown command: " + line);
            }
            System.out.flush();
        }
        client.close();
    }
}
