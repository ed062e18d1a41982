// A KIP-932 share consumer (Kafka's own KafkaShareConsumer) that says how much it has been given
// and when, for bench/kafka_fidelity.py's share consumer case, run as a single source file on
// Kafka's jars:
//
//   java -cp LIB/* ShareConsumeLoop.java BOOTSTRAP CLIENT_ID GROUP TOPIC RECORDS SECONDS
//
// It joins share group GROUP with CLIENT_ID, subscribes to TOPIC and polls until it has RECORDS
// records or SECONDS have passed, acknowledging each poll's records implicitly (the default) with
// the next. After each poll that returned records it prints one line on standard output:
//   MS BYTES                        milliseconds since the start, value bytes given so far
// Kafka's perf tool prints its detailed stats only when a record comes after the interval, so a
// throttled consumer's rows are no clock; these lines are. Exits 0 once it has RECORDS, 2 if the
// time ran out first.

import java.time.Duration;
import java.util.List;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public class ShareConsumeLoop {
    public static void main(String[] args) throws Exception {
        if (args.length != 6) {
            System.err.println("usage: ShareConsumeLoop BOOTSTRAP CLIENT_ID GROUP TOPIC RECORDS SECONDS");
            System.exit(1);
        }
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(ConsumerConfig.CLIENT_ID_CONFIG, args[1]);
        props.put(ConsumerConfig.GROUP_ID_CONFIG, args[2]);
        long wanted = Long.parseLong(args[4]);
        long end = System.nanoTime() + Long.parseLong(args[5]) * 1_000_000_000L;
        long records = 0, bytes = 0;
        long start = System.nanoTime();
        try (KafkaShareConsumer<byte[], byte[]> consumer = new KafkaShareConsumer<>(
                props, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
            consumer.subscribe(List.of(args[3]));
            while (records < wanted && System.nanoTime() < end) {
                ConsumerRecords<byte[], byte[]> polled = consumer.poll(Duration.ofMillis(100));
                if (polled.isEmpty()) {
                    continue;
                }
                for (ConsumerRecord<byte[], byte[]> r : polled) {
                    records++;
                    bytes += r.value() == null ? 0 : r.value().length;
                }
                System.out.println((System.nanoTime() - start) / 1_000_000L + " " + bytes);
                System.out.flush();
            }
        }
        System.exit(records >= wanted ? 0 : 2);
    }
}
