package peers;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.lang.reflect.Field;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hbase.HBaseConfiguration;
import org.apache.hadoop.hbase.TableName;
import org.apache.hadoop.hbase.client.Admin;
import org.apache.hadoop.hbase.client.ColumnFamilyDescriptorBuilder;
import org.apache.hadoop.hbase.client.Connection;
import org.apache.hadoop.hbase.client.ConnectionFactory;
import org.apache.hadoop.hbase.client.Get;
import org.apache.hadoop.hbase.client.MetricsConnection;
import org.apache.hadoop.hbase.client.Put;
import org.apache.hadoop.hbase.client.Result;
import org.apache.hadoop.hbase.client.Table;
import org.apache.hadoop.hbase.client.TableDescriptorBuilder;
import org.apache.hadoop.hbase.util.Bytes;
import org.apache.omid.tools.hbase.OmidTableManager;
import org.apache.omid.transaction.HBaseOmidClientConfiguration;
import org.apache.omid.transaction.HBaseTransactionManager;
import org.apache.omid.transaction.RollbackException;
import org.apache.omid.transaction.TTable;
import org.apache.omid.transaction.Transaction;
import org.apache.omid.transaction.TransactionManager;

/**
 * The Java side of bench/peers.py: raw HBase client operations and Apache Omid
 * transactions, driven over stdin/stdout one command per line so that the Python
 * driver can interleave them with its own in chunks.
 *
 * <p>Commands (answers are one line of JSON each, or {"error": ...}):
 * <pre>
 *   setup PREFIX ROWS          create Omid's commit and timestamp tables (OmidTableManager)
 *                              and PREFIX_raw, PREFIX_omid, PREFIX_bank (unlimited versions)
 *   connect TSO_HOSTPORT       open Omid's transaction manager against the TSO
 *   disconnect                 close it (before its TSO is stopped, so that the next
 *                              connect, to another TSO, starts clean)
 *   load                       write ROWS rows to the raw and the Omid table
 *   run OP N                   N operations of OP: raw_put raw_get omid_begin omid_write omid_read
 *                              omid_transfer (omid_begin: a start timestamp from the TSO, alone)
 *   bank_init ACCOUNTS BALANCE one Omid transaction setting every account
 *   bank ACCOUNTS THREADS SECONDS  contended transfers; committed and aborted counts
 *   bank_total ACCOUNTS        the sum of the balances, read in one Omid transaction
 *   quit
 * </pre>
 * Every answer of "run" carries the HBase client's RPC count (the connection's client
 * metrics) and the TSO requests made, so the driver can report round trips per
 * operation.
 */
public final class Harness {
    private static final byte[] FAMILY = Bytes.toBytes("f");
    private static final byte[] COLUMN = Bytes.toBytes("value");
    private static final byte[] BALANCE = Bytes.toBytes("balance");
    private static final int VALUE_BYTES = 100;

    private final Configuration conf;
    private final Connection raw;
    private String prefix = "peers";
    private int rows = 1000;
    private byte[][] keys = new byte[0][];
    private Table rawTable;
    private TransactionManager tm;
    private Connection omidConnection;
    private TTable omidTable;
    private final AtomicLong tsoRequests = new AtomicLong();
    private long sequence;

    private Harness() throws IOException {
        conf = HBaseConfiguration.create();  // hbase-site.xml from the class path
        // Client-side metrics count every RPC the connection makes, by method.
        conf.setBoolean(MetricsConnection.CLIENT_SIDE_METRICS_ENABLED_KEY, true);
        raw = ConnectionFactory.createConnection(conf);
    }

    public static void main(String[] args) throws Exception {
        PrintStream out = new PrintStream(System.out, true, StandardCharsets.UTF_8);
        // Everything else (HBase's and Omid's logging) goes to stderr: stdout is the protocol.
        System.setOut(new PrintStream(System.err, true, StandardCharsets.UTF_8));
        Harness h = new Harness();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        out.println("{\"ready\": true}");
        for (String line; (line = in.readLine()) != null; ) {
            String[] w = line.trim().split("\\s+");
            if (w[0].isEmpty()) {
                continue;
            }
            if (w[0].equals("quit")) {
                break;
            }
            try {
                out.println(h.handle(w));
            } catch (Exception e) {
                e.printStackTrace();
                out.println("{\"error\": \"" + String.valueOf(e).replace("\\", "/").replace("\"", "'") + "\"}");
            }
        }
        h.close();
        System.exit(0);
    }

    private String handle(String[] w) throws Exception {
        switch (w[0]) {
            case "setup":
                setup(w[1], Integer.parseInt(w[2]));
                return "{\"ok\": true}";
            case "connect":
                connect(w[1]);
                return "{\"ok\": true}";
            case "disconnect":
                disconnect();
                return "{\"ok\": true}";
            case "load":
                load();
                return "{\"ok\": true}";
            case "run":
                return run(w[1], Integer.parseInt(w[2]));
            case "bank_init":
                bankInit(Integer.parseInt(w[1]), Long.parseLong(w[2]));
                return "{\"ok\": true}";
            case "bank":
                return bank(Integer.parseInt(w[1]), Integer.parseInt(w[2]), Double.parseDouble(w[3]));
            case "bank_total":
                return "{\"total\": " + bankTotal(Integer.parseInt(w[1])) + "}";
            default:
                throw new IllegalArgumentException("unknown command " + w[0]);
        }
    }

    private TableName name(String suffix) {
        return TableName.valueOf(prefix + "_" + suffix);
    }

    private void setup(String tablePrefix, int rowCount) throws IOException {
        prefix = tablePrefix;
        rows = rowCount;
        keys = new byte[rows][];
        for (int i = 0; i < rows; i++) {
            keys[i] = Bytes.toBytes(String.format("row%06d", i));
        }
        try (Admin admin = raw.getAdmin()) {
            for (String omidTable : new String[]{"commit-table", "timestamp-table"}) {
                TableName t = TableName.valueOf(omidTable.equals("commit-table") ? "OMID_COMMIT_TABLE"
                                                                               : "OMID_TIMESTAMP_TABLE");
                if (!admin.tableExists(t)) {
                    new OmidTableManager(omidTable).executeActionsOnHBase(conf);
                }
            }
            for (String suffix : new String[]{"raw", "omid", "bank"}) {
                TableName t = name(suffix);
                if (admin.tableExists(t)) {
                    continue;
                }
                // Omid keeps every version a transaction may still read; it needs them all.
                admin.createTable(TableDescriptorBuilder.newBuilder(t)
                        .setColumnFamily(ColumnFamilyDescriptorBuilder.newBuilder(FAMILY)
                                .setMaxVersions(Integer.MAX_VALUE).build())
                        .build());
            }
        }
        rawTable = raw.getTable(name("raw"));
    }

    private void connect(String tso) throws Exception {
        disconnect();
        HBaseOmidClientConfiguration omidConf = new HBaseOmidClientConfiguration();
        omidConf.setConnectionString(tso);
        Configuration hconf = new Configuration(conf);
        omidConf.setHBaseConfiguration(hconf);
        tm = HBaseTransactionManager.newInstance(omidConf);
        Field f = HBaseTransactionManager.class.getDeclaredField("connection");
        f.setAccessible(true);
        omidConnection = (Connection) f.get(tm);
        omidTable = new TTable(omidConnection, name("omid").getNameAsString());
    }

    private void disconnect() throws IOException {
        if (omidTable != null) {
            omidTable.close();
            omidTable = null;
        }
        if (tm != null) {
            tm.close();
            tm = null;
        }
        omidConnection = null;
    }

    private byte[] value() {
        byte[] v = new byte[VALUE_BYTES];
        java.util.Arrays.fill(v, (byte) ('a' + (sequence++ % 26)));
        return v;
    }

    private void load() throws Exception {
        List<Put> puts = new ArrayList<>();
        for (byte[] key : keys) {
            puts.add(new Put(key).addColumn(FAMILY, COLUMN, value()));
        }
        rawTable.put(puts);
        Transaction tx = begin();
        List<Put> txPuts = new ArrayList<>();
        for (byte[] key : keys) {
            txPuts.add(new Put(key).addColumn(FAMILY, COLUMN, value()));
        }
        omidTable.put(tx, txPuts);
        commit(tx);
    }

    private Transaction begin() throws Exception {
        tsoRequests.incrementAndGet();
        return tm.begin();
    }

    private void commit(Transaction tx) throws RollbackException, Exception {
        // A read-only transaction commits without the TSO (AbstractTransactionManager).
        if (!((org.apache.omid.transaction.HBaseTransaction) tx).getWriteSet().isEmpty()) {
            tsoRequests.incrementAndGet();
        }
        tm.commit(tx);
    }

    private static long rpcs(Connection c) {
        if (c == null) {
            return 0;
        }
        MetricsConnection m = ((org.apache.hadoop.hbase.client.ClusterConnection) c).getConnectionMetrics();
        long n = 0;
        for (Map.Entry<String, com.codahale.metrics.Counter> e : m.getRpcCounters().entrySet()) {
            if (e.getKey().startsWith("rpcCount_")) {
                n += e.getValue().getCount();
            }
        }
        return n;
    }

    private String run(String op, int n) throws Exception {
        long rpc0 = rpcs(raw) + rpcs(omidConnection);
        long tso0 = tsoRequests.get();
        long aborts = 0;
        long t0 = System.nanoTime();
        for (int i = 0; i < n; i++) {
            byte[] key = keys[ThreadLocalRandom.current().nextInt(rows)];
            switch (op) {
                case "raw_put":
                    rawTable.put(new Put(key).addColumn(FAMILY, COLUMN, value()));
                    break;
                case "raw_get":
                    if (rawTable.get(new Get(key).addColumn(FAMILY, COLUMN)).isEmpty()) {
                        throw new IllegalStateException("raw row missing");
                    }
                    break;
                case "omid_begin":
                    begin();
                    break;
                case "omid_write": {
                    Transaction tx = begin();
                    omidTable.put(tx, new Put(key).addColumn(FAMILY, COLUMN, value()));
                    commit(tx);
                    break;
                }
                case "omid_read": {
                    Transaction tx = begin();
                    if (omidTable.get(tx, new Get(key).addColumn(FAMILY, COLUMN)).isEmpty()) {
                        throw new IllegalStateException("omid row missing");
                    }
                    commit(tx);
                    break;
                }
                case "omid_transfer": {
                    byte[] other = keys[ThreadLocalRandom.current().nextInt(rows)];
                    Transaction tx = begin();
                    Result a = omidTable.get(tx, new Get(key).addColumn(FAMILY, COLUMN));
                    Result b = omidTable.get(tx, new Get(other).addColumn(FAMILY, COLUMN));
                    omidTable.put(tx, new Put(key).addColumn(FAMILY, COLUMN, b.getValue(FAMILY, COLUMN)));
                    omidTable.put(tx, new Put(other).addColumn(FAMILY, COLUMN, a.getValue(FAMILY, COLUMN)));
                    try {
                        commit(tx);
                    } catch (RollbackException e) {
                        aborts++;  // cannot happen with one writer; counted so it would show
                    }
                    break;
                }
                default:
                    throw new IllegalArgumentException("unknown operation " + op);
            }
        }
        long elapsed = System.nanoTime() - t0;
        long rpc = rpcs(raw) + rpcs(omidConnection) - rpc0;
        return String.format("{\"op\": \"%s\", \"n\": %d, \"seconds\": %.6f, \"hbase_rpcs\": %d, "
                + "\"tso_requests\": %d, \"aborts\": %d}", op, n, elapsed / 1e9, rpc,
                tsoRequests.get() - tso0, aborts);
    }

    private static byte[] account(int i) {
        return Bytes.toBytes(String.format("acct%03d", i));
    }

    private void bankInit(int accounts, long balance) throws Exception {
        try (TTable bank = new TTable(omidConnection, name("bank").getNameAsString())) {
            Transaction tx = begin();
            List<Put> puts = new ArrayList<>();  // one batch: 1,000 accounts in one call
            for (int i = 0; i < accounts; i++) {
                puts.add(new Put(account(i)).addColumn(FAMILY, BALANCE, Bytes.toBytes(balance)));
            }
            bank.put(tx, puts);
            commit(tx);
        }
    }

    private String bank(int accounts, int threads, double seconds) throws Exception {
        AtomicLong committed = new AtomicLong();
        AtomicLong aborted = new AtomicLong();
        AtomicLong failed = new AtomicLong();
        long deadline = System.nanoTime() + (long) (seconds * 1e9);
        List<Thread> workers = new ArrayList<>();
        long t0 = System.nanoTime();
        for (int t = 0; t < threads; t++) {
            Thread th = new Thread(() -> {
                try (TTable bank = new TTable(omidConnection, name("bank").getNameAsString())) {
                    ThreadLocalRandom rnd = ThreadLocalRandom.current();
                    while (System.nanoTime() < deadline) {
                        int a = rnd.nextInt(accounts);
                        int b = (a + 1 + rnd.nextInt(accounts - 1)) % accounts;
                        long amount = 1 + rnd.nextInt(10);
                        Transaction tx = begin();
                        long va = balance(bank, tx, a);
                        long vb = balance(bank, tx, b);
                        bank.put(tx, new Put(account(a)).addColumn(FAMILY, BALANCE, Bytes.toBytes(va - amount)));
                        bank.put(tx, new Put(account(b)).addColumn(FAMILY, BALANCE, Bytes.toBytes(vb + amount)));
                        try {
                            commit(tx);
                            committed.incrementAndGet();
                        } catch (RollbackException e) {
                            aborted.incrementAndGet();
                        }
                    }
                } catch (Exception e) {
                    e.printStackTrace();
                    failed.incrementAndGet();
                }
            });
            th.start();
            workers.add(th);
        }
        for (Thread th : workers) {
            th.join();
        }
        double elapsed = (System.nanoTime() - t0) / 1e9;
        return String.format("{\"committed\": %d, \"aborted\": %d, \"failed_threads\": %d, "
                + "\"seconds\": %.6f}", committed.get(), aborted.get(), failed.get(), elapsed);
    }

    private static long balance(TTable bank, Transaction tx, int i) throws IOException {
        Result r = bank.get(tx, new Get(account(i)).addColumn(FAMILY, BALANCE));
        byte[] v = r.getValue(FAMILY, BALANCE);
        if (v == null) {
            throw new IllegalStateException("account " + i + " missing");
        }
        return Bytes.toLong(v);
    }

    private long bankTotal(int accounts) throws Exception {
        try (TTable bank = new TTable(omidConnection, name("bank").getNameAsString())) {
            Transaction tx = begin();
            long total = 0;
            for (int i = 0; i < accounts; i++) {
                total += balance(bank, tx, i);
            }
            commit(tx);
            return total;
        }
    }

    private void close() throws IOException {
        disconnect();
        if (rawTable != null) {
            rawTable.close();
        }
        raw.close();
    }
}
