// Region administration of a (multi-server) HBase through its own client API, for the
// tests and for people: tests/_hbase_local.py compiles it with javac against the
// launcher's class path once (cached beside that class path) and runs it with the
// cluster's conf directory first on the class path.
//
// It reads one command a line on stdin and answers each with "ok N" followed by N lines,
// or "err MESSAGE" (one line), so one JVM serves a whole test (a JVM with HBase's client
// takes seconds to start on a loaded machine):
//
//   servers                 live region servers, one "host,port,startcode" a line
//   regions REGEX           the regions of every table whose name matches REGEX (and
//                           hbase:meta for "hbase:meta"): "table<TAB>encoded name<TAB>
//                           start key<TAB>server" a line, start keys as
//                           Bytes.toStringBinary writes them
//   move ENCODED SERVER     move the region to the server ("host,port,startcode");
//                           returns when the master has reopened it there
//   split TABLE KEY         split the table's region holding KEY (toStringBinary form) at
//                           KEY; returns when both daughters are online
//   balancer on|off         switch the balancer (the tests keep it off: regions move
//                           when they say so)
//   wait-assigned SECONDS   wait until no region is in transition
//
// Usage: java -cp CONF:CLASSPATH:DIR RegionAdmin [command ...]  (a command given on the
// command line runs alone, words joined by spaces; otherwise commands come from stdin)
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.regex.Pattern;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hbase.HBaseConfiguration;
import org.apache.hadoop.hbase.ServerName;
import org.apache.hadoop.hbase.TableName;
import org.apache.hadoop.hbase.client.Admin;
import org.apache.hadoop.hbase.client.Connection;
import org.apache.hadoop.hbase.client.ConnectionFactory;
import org.apache.hadoop.hbase.client.RegionInfo;
import org.apache.hadoop.hbase.client.RegionLocator;
import org.apache.hadoop.hbase.HRegionLocation;
import org.apache.hadoop.hbase.util.Bytes;

public final class RegionAdmin {
  private final Connection connection;
  private final Admin admin;

  private RegionAdmin(Connection connection) throws Exception {
    this.connection = connection;
    this.admin = connection.getAdmin();
  }

  private List<String> servers() throws Exception {
    List<String> out = new ArrayList<>();
    for (ServerName sn : admin.getRegionServers()) {
      out.add(sn.toString());
    }
    return out;
  }

  private List<String> regions(String regex) throws Exception {
    List<TableName> tables = new ArrayList<>();
    if (regex.equals("hbase:meta")) {
      tables.add(TableName.META_TABLE_NAME);
    } else {
      for (TableName t : admin.listTableNames(Pattern.compile(regex))) {
        tables.add(t);
      }
    }
    List<String> out = new ArrayList<>();
    for (TableName table : tables) {
      try (RegionLocator locator = connection.getRegionLocator(table)) {
        for (HRegionLocation location : locator.getAllRegionLocations()) {
          RegionInfo region = location.getRegion();
          if (region.isOffline() || region.isSplitParent()) {
            continue;
          }
          ServerName sn = location.getServerName();
          out.add(table.getNameAsString() + "\t" + region.getEncodedName() + "\t"
              + Bytes.toStringBinary(region.getStartKey()) + "\t"
              + (sn == null ? "-" : sn.toString()));
        }
      }
    }
    return out;
  }

  private int onlineRegions(TableName table) throws Exception {
    int n = 0;
    for (RegionInfo region : admin.getRegions(table)) {
      if (!region.isOffline() && !region.isSplitParent()) {
        n++;
      }
    }
    return n;
  }

  private void split(String table, String key) throws Exception {
    TableName name = TableName.valueOf(table);
    int before = onlineRegions(name);
    admin.split(name, Bytes.toBytesBinary(key));
    long deadline = System.nanoTime() + 300_000_000_000L;
    while (onlineRegions(name) <= before || inTransition()) {
      if (System.nanoTime() > deadline) {
        throw new IllegalStateException("the split of " + table + " did not finish in 300 s");
      }
      Thread.sleep(100);
    }
  }

  private boolean inTransition() throws Exception {
    return !admin.getClusterMetrics(
        java.util.EnumSet.of(org.apache.hadoop.hbase.ClusterMetrics.Option.REGIONS_IN_TRANSITION))
        .getRegionStatesInTransition().isEmpty();
  }

  private List<String> run(String line) throws Exception {
    String[] words = line.trim().split("\\s+");
    List<String> none = new ArrayList<>();
    switch (words[0]) {
      case "servers":
        return servers();
      case "regions":
        return regions(words[1]);
      case "move":
        admin.move(Bytes.toBytes(words[1]), ServerName.valueOf(words[2]));
        return none;
      case "split":
        split(words[1], words.length > 2 ? words[2] : "");
        return none;
      case "balancer":
        admin.balancerSwitch(words[1].equals("on"), true);
        return none;
      case "wait-assigned": {
        long deadline = System.nanoTime() + Long.parseLong(words[1]) * 1_000_000_000L;
        while (inTransition()) {
          if (System.nanoTime() > deadline) {
            throw new IllegalStateException("regions still in transition after " + words[1] + " s");
          }
          Thread.sleep(100);
        }
        return none;
      }
      default:
        throw new IllegalArgumentException("unknown command " + words[0]
            + " (servers, regions, move, split, balancer, wait-assigned)");
    }
  }

  private static String oneLine(Throwable e) {
    String message = e.getClass().getSimpleName() + ": " + e.getMessage();
    return message.replace('\n', ' ').replace('\r', ' ');
  }

  public static void main(String[] args) throws Exception {
    Configuration conf = HBaseConfiguration.create();
    try (Connection connection = ConnectionFactory.createConnection(conf)) {
      RegionAdmin admin = new RegionAdmin(connection);
      if (args.length > 0) {
        for (String out : admin.run(String.join(" ", args))) {
          System.out.println(out);
        }
        return;
      }
      BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
      System.out.println("ready");
      System.out.flush();
      String line;
      while ((line = in.readLine()) != null) {
        if (line.isBlank()) {
          continue;
        }
        try {
          List<String> out = admin.run(line);
          System.out.println("ok " + out.size());
          for (String s : out) {
            System.out.println(s);
          }
        } catch (Exception e) {
          System.out.println("err " + oneLine(e));
        }
        System.out.flush();
      }
    }
  }
}
