// A tiny Kafka Streams application for devkit/kafka_streams.py: one stateless step, one
// repartition and one stateful count in an in-memory store, run through the proxy by
// tests/integration/test_kafka_streams.py.
//
//   java -cp DIR:LIB/* CountApp INPUT OUTPUT EXPECTED TIMEOUT_MS key=value ...
//
// It reads INPUT's values (decimal numbers), drops the multiples of 5, groups the rest by
// "k" + value % 7 (a repartition topic) and counts each key in an in-memory store, writing every
// new count to OUTPUT as key -> count in decimal: with the record cache off, a key seen c times
// yields the counts 1..c, so the output is exact and known in advance. Exactly-once (v2): a
// rebalance or a retry can neither repeat nor lose a count. The key=value pairs are Streams
// properties (bootstrap.servers, application.id, group.protocol, state.dir, ...) over the
// defaults below.
//
// Once EXPECTED counts are written, with the group still live, it prints what it learnt through
// the bootstrap servers it was given:
//   endpoint HOST:PORT          each Streams client in the group's metadata (application.server;
//                               in a streams group, KIP-1071's UserEndpoint from the heartbeat)
//   group TYPE STATE coordinator HOST:PORT    the group as Admin describes it (StreamsGroupDescribe
//                               for a streams group, describeConsumerGroups for a classic one)
//   member CLIENT_HOST endpoint HOST:PORT     each of its members (the endpoint: streams only)
// then closes (committing the last transaction) and exits 0; 1 if Streams or the describe failed,
// 2 if TIMEOUT_MS ran out first, 3 if the close did not end in 30 s. Its state changes and
// progress go to standard output too; Kafka's own log, warnings only, to standard error.

import java.util.List;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.time.Duration;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.MemberDescription;
import org.apache.kafka.clients.admin.StreamsGroupDescription;
import org.apache.kafka.clients.admin.StreamsGroupMemberDescription;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.StreamsMetadata;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.state.Stores;

public final class CountApp {
    public static void main(String[] args) throws InterruptedException {
        if (args.length < 4) {
            System.err.println("usage: CountApp INPUT OUTPUT EXPECTED TIMEOUT_MS [key=value ...]");
            System.exit(64);
        }
        String input = args[0];
        String output = args[1];
        long expected = Long.parseLong(args[2]);
        long timeoutMs = Long.parseLong(args[3]);

        Properties props = new Properties();
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);  // every count, not the last
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
        for (int i = 4; i < args.length; i++) {
            String[] kv = args[i].split("=", 2);
            props.put(kv[0], kv[1]);
        }

        StreamsBuilder builder = new StreamsBuilder();
        AtomicLong written = new AtomicLong();
        CountDownLatch done = new CountDownLatch(1);
        builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
            .filter((key, value) -> Long.parseLong(value) % 5 != 0)
            .groupBy((key, value) -> "k" + Long.parseLong(value) % 7,
                     Grouped.with("by-rest", Serdes.String(), Serdes.String()))
            .count(Materialized.<String, Long>as(Stores.inMemoryKeyValueStore("counts"))
                   .withKeySerde(Serdes.String()).withValueSerde(Serdes.Long()))
            .toStream()
            .mapValues(count -> Long.toString(count))
            .peek((key, count) -> {
                if (written.incrementAndGet() == expected) {
                    done.countDown();
                }
            })
            .to(output, Produced.with(Serdes.String(), Serdes.String()));

        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        CountDownLatch failed = new CountDownLatch(1);
        streams.setStateListener((now, before) -> {
            System.out.println("state " + before + " -> " + now);
            if (now == KafkaStreams.State.ERROR) {
                failed.countDown();
                done.countDown();
            }
        });
        streams.setUncaughtExceptionHandler(exc -> {
            System.out.println("failed: " + exc);
            exc.printStackTrace(System.out);
            failed.countDown();
            done.countDown();
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        streams.start();
        boolean finished = done.await(timeoutMs, TimeUnit.MILLISECONDS);
        int status = failed.getCount() == 0 ? 1 : finished ? 0 : 2;
        System.out.println("written " + written.get() + " of " + expected);
        if (status == 0) {
            for (StreamsMetadata client : streams.metadataForAllStreamsClients()) {
                System.out.println("endpoint " + client.host() + ":" + client.port());
            }
            try {
                describe(props);
            } catch (Exception exc) {
                System.out.println("describe failed: " + exc);
                status = 1;
            }
        }
        boolean closed = streams.close(Duration.ofSeconds(30));
        System.out.println(closed ? "closed" : "close timed out");
        System.out.flush();
        System.exit(status != 0 ? status : closed ? 0 : 3);
    }

    private static void describe(Properties props) throws Exception {
        String group = props.getProperty(StreamsConfig.APPLICATION_ID_CONFIG);
        Properties config = new Properties();
        config.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG,
                   props.getProperty(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG));
        try (Admin admin = Admin.create(config)) {
            if ("streams".equals(props.getProperty(StreamsConfig.GROUP_PROTOCOL_CONFIG))) {
                StreamsGroupDescription found = admin.describeStreamsGroups(List.of(group))
                    .describedGroups().get(group).get(30, TimeUnit.SECONDS);
                System.out.println("group streams " + found.groupState() + " coordinator "
                                   + address(found.coordinator()));
                for (StreamsGroupMemberDescription member : found.members()) {
                    System.out.println("member " + member.clientHost() + " endpoint " + member.userEndpoint()
                        .map(e -> e.host() + ":" + e.port()).orElse("none"));
                }
            } else {
                ConsumerGroupDescription found = admin.describeConsumerGroups(List.of(group))
                    .describedGroups().get(group).get(30, TimeUnit.SECONDS);
                System.out.println("group " + found.type() + " " + found.groupState() + " coordinator "
                                   + address(found.coordinator()));
                for (MemberDescription member : found.members()) {
                    System.out.println("member " + member.host());
                }
            }
        }
    }

    private static String address(Node node) {
        return node.host() + ":" + node.port();
    }
}
