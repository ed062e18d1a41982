// Topics created one CreateTopics at a time by Kafka's own Admin client, for bench/kafka_fidelity.py's
// controller_mutation_rate case (KIP-599), run as a single source file on Kafka's jars:
//
//   java -cp LIB/* CreateTopicsLoop.java BOOTSTRAP CLIENT_ID PREFIX PARTITIONS SECONDS
//
// It creates PREFIX-0, PREFIX-1, ... with PARTITIONS partitions each (replication factor 1) for
// SECONDS, with the Admin client's own retry on THROTTLING_QUOTA_EXCEEDED off, so that every
// refusal is seen rather than retried inside the client. Each answer is one line on standard output,
// its time in milliseconds since the start:
//   MS created TOPIC                the topic was created
//   MS refused THROTTLE_MS          error 89 (ThrottlingQuotaExceededException) and its throttle time
//   MS error CLASS MESSAGE          anything else; the loop goes on with the next topic
// After a refusal it waits the throttle time it was told, as the Admin client's retry would, and
// asks for the same topic again. A throttle time on a successful answer is the Admin client's
// own business (its NetworkClient holds the next request back; at TRACE it logs
// "Connection to node N is throttled for T ms"). Exits 0 at the end, 1 if the client failed to start.

import java.util.List;
import java.util.Properties;
import java.util.concurrent.ExecutionException;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.CreateTopicsOptions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.common.errors.ThrottlingQuotaExceededException;

public class CreateTopicsLoop {
    public static void main(String[] args) throws Exception {
        if (args.length != 5) {
            System.err.println("usage: CreateTopicsLoop BOOTSTRAP CLIENT_ID PREFIX PARTITIONS SECONDS");
            System.exit(2);
        }
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(AdminClientConfig.CLIENT_ID_CONFIG, args[1]);
        String prefix = args[2];
        int partitions = Integer.parseInt(args[3]);
        long seconds = Long.parseLong(args[4]);
        CreateTopicsOptions options = new CreateTopicsOptions().retryOnQuotaViolation(false);
        try (Admin admin = Admin.create(props)) {
            long start = System.nanoTime();
            long end = start + seconds * 1_000_000_000L;
            int next = 0;
            while (System.nanoTime() < end) {
                String topic = prefix + "-" + next;
                try {
                    admin.createTopics(List.of(new NewTopic(topic, partitions, (short) 1)), options).all().get();
                    System.out.println(since(start) + " created " + topic);
                    next++;
                } catch (ExecutionException e) {
                    if (e.getCause() instanceof ThrottlingQuotaExceededException t) {
                        System.out.println(since(start) + " refused " + t.throttleTimeMs());
                        Thread.sleep(t.throttleTimeMs());
                    } else {
                        System.out.println(since(start) + " error " + e.getCause().getClass().getSimpleName()
                                           + " " + e.getCause().getMessage());
                        next++;
                    }
                }
                System.out.flush();
            }
        }
    }

    private static long since(long start) {
        return (System.nanoTime() - start) / 1_000_000L;
    }
}
