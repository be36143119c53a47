// The two per-tuple operations of Golab et al.'s experiment, in Java as the paper's
// system was written (Section 5.1: "The implementation was done in Java (Blackdown
// Java, J2SE 1.4.2)"), timed in thread CPU nanoseconds per tuple.
//
//   build  - a long-running read: "scanning the window and building a hash table on
//            the required attribute": per tuple one HashMap lookup and an update (an
//            insert on the first sight of an address), keys boxed as J2SE 1.4 code
//            had to box them (new Integer: no autoboxing, no Integer.valueOf cache).
//   merge  - the same table's entries added into the group's table (one get/put each).
//   scan   - a snapshot query's window scan: a simple aggregate over a random subset
//            of 20 addresses: per tuple one membership test of a 20-entry HashSet
//            (a probe, nothing inserted) and, for the ~2% of tuples in it, two adds.
//
// Sub-windows are those of the t = 5 s experiment: 5,000 packets (ts, src, dst, size),
// addresses uniform over 1,000, sizes 41..140.  Rounds alternate the three, after a
// warm-up for the JIT; the medians over rounds are printed.
//
//   java scripts/WindowOps.java [rounds] [-XX:... options go before the file name]
import java.lang.management.ManagementFactory;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Random;

public class WindowOps {
    static final class Packet {
        final double ts;
        final int src, dst, size;

        Packet(double ts, int src, int dst, int size) {
            this.ts = ts;
            this.src = src;
            this.dst = dst;
            this.size = size;
        }
    }

    static final int ADDRESSES = 1000, SUBSET = 20;
    static long sink;

    @SuppressWarnings({"deprecation", "unchecked", "rawtypes"})
    static HashMap build(Packet[] sub) {
        HashMap table = new HashMap();
        for (int k = 0; k < sub.length; k++) {
            Packet p = sub[k];
            Integer key = new Integer(p.src);
            long[] slot = (long[]) table.get(key);
            if (slot == null) {
                slot = new long[2];
                table.put(key, slot);
            }
            slot[0]++;
            slot[1] += p.size;
        }
        return table;
    }

    @SuppressWarnings({"unchecked", "rawtypes"})
    static int merge(HashMap part, HashMap acc) {
        int entries = 0;
        for (Iterator it = part.entrySet().iterator(); it.hasNext(); ) {
            Map.Entry e = (Map.Entry) it.next();
            long[] slot = (long[]) e.getValue();
            long[] into = (long[]) acc.get(e.getKey());
            if (into == null) {
                into = new long[2];
                acc.put(e.getKey(), into);
            }
            into[0] += slot[0];
            into[1] += slot[1];
            entries++;
        }
        return entries;
    }

    @SuppressWarnings("deprecation")
    static long scan(Packet[] sub, HashSet subset) {
        long count = 0, sum = 0;
        for (int k = 0; k < sub.length; k++) {
            Packet p = sub[k];
            if (subset.contains(new Integer(p.src))) {
                count++;
                sum += p.size;
            }
        }
        return count * 1_000_003L + sum;
    }

    static final com.sun.management.OperatingSystemMXBean OS =
            (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();

    // the process's CPU time: the collector's threads too (allocation is part of a build's cost)
    static long cpu() {
        return OS.getProcessCpuTime();
    }

    static double median(List<Double> xs) {
        double[] a = new double[xs.size()];
        for (int k = 0; k < a.length; k++) a[k] = xs.get(k);
        Arrays.sort(a);
        return a.length % 2 == 1 ? a[a.length / 2] : (a[a.length / 2 - 1] + a[a.length / 2]) / 2;
    }

    @SuppressWarnings({"deprecation", "unchecked", "rawtypes"})
    public static void main(String[] args) {
        int rounds = args.length > 0 ? Integer.parseInt(args[0]) : 60;
        int tuples = args.length > 1 ? Integer.parseInt(args[1]) : 1000;
        int SUBS = args.length > 2 ? Integer.parseInt(args[2]) : 100;
        Random rng = new Random(0);
        Packet[][] subs = new Packet[SUBS][tuples];
        for (int s = 0; s < SUBS; s++)
            for (int k = 0; k < tuples; k++)
                subs[s][k] = new Packet(k * 1e-3, rng.nextInt(ADDRESSES), rng.nextInt(ADDRESSES),
                        41 + rng.nextInt(100));
        HashSet subset = new HashSet();
        while (subset.size() < SUBSET) subset.add(new Integer(rng.nextInt(ADDRESSES)));
        // per round: REPEAT long-running executions over the SUBS sub-windows (each read
        // builds the sub-window's table and merges it into the execution's table), timed as
        // one block, and REPEAT snapshot scans of the same sub-windows, timed as another;
        // odd rounds the other way round (the process clock ticks every 10 ms or so)
        int repeat = 10;
        List<Double> unit = new ArrayList<>(), scanned = new ArrayList<>(), ratio = new ArrayList<>();
        long readNs = 0, readUnits = 0, scanNs = 0, scanTuples = 0;
        for (int round = -20; round < rounds; round++) {  // the first 20 warm the JIT up
            long sNs = 0, rNs = 0, entries = 0;
            for (int half = 0; half < 2; half++) {
                long t0 = cpu();
                if ((half == 0) == (round % 2 == 0)) {
                    for (int r = 0; r < repeat; r++) {
                        HashMap acc = new HashMap();
                        for (int k = 0; k < SUBS; k++) entries += merge(build(subs[k]), acc);
                        sink += acc.size();
                    }
                    rNs = cpu() - t0;
                } else {
                    for (int r = 0; r < repeat; r++)
                        for (int k = 0; k < SUBS; k++) sink += scan(subs[k], subset);
                    sNs = cpu() - t0;
                }
            }
            if (round >= 0) {
                long units = (long) repeat * SUBS * tuples + entries;
                long tuplesScanned = (long) repeat * SUBS * tuples;
                unit.add(rNs / (double) units);
                scanned.add(sNs / (double) tuplesScanned);
                ratio.add((rNs / (double) units) / (sNs / (double) tuplesScanned));
                readNs += rNs;
                readUnits += units;
                scanNs += sNs;
                scanTuples += tuplesScanned;
            }
        }
        double u = readNs / (double) readUnits, sc = scanNs / (double) scanTuples;
        System.out.printf(
                "java %s %s, %d x %d tuples, %d rounds: ns per long-running unit (a tuple built"
                        + " or an entry merged) %.1f, per tuple scanned %.1f; unit/scan %.2f"
                        + " (totals), median of rounds %.2f [sink %d]%n",
                System.getProperty("java.version"), System.getProperty("wo.flags", ""), SUBS,
                tuples, rounds, u, sc, u / sc, median(ratio), sink % 10);
    }
}
