// The official RocketMQ 5 Java SDK (rocketmq-client-java, pinned in pom.xml) against
// `hactl proxy`. tests/integration/test_java_sdk.py compiles this file and runs every
// scenario in one JVM (the first five at once, the master kill alone after them):
//
//   java -cp LIB/*:CLASSES Scenarios proxy=HOST:PORT master_pid=PID [only=a,b]
//
// "priority" runs only when named in only= (the test runs it on SDK 5.2.0: 5.0.8 has no
// priority messages). Each scenario prints one line "RESULT <name> <json>", which the tests check; a
// scenario that throws prints "RESULT <name> {"error": ...}" and the next one runs.
// Every wait is bounded; the JVM exits by itself (System.exit at the end: the SDK's
// threads must not keep it alive).

import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.Callable;
import java.util.function.BooleanSupplier;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientException;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.consumer.ConsumeResult;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.FilterExpressionType;
import org.apache.rocketmq.client.apis.consumer.PushConsumer;
import org.apache.rocketmq.client.apis.consumer.SimpleConsumer;
import org.apache.rocketmq.client.apis.message.Message;
import org.apache.rocketmq.client.apis.message.MessageBuilder;
import org.apache.rocketmq.client.apis.message.MessageView;
import org.apache.rocketmq.client.apis.producer.Producer;
import org.apache.rocketmq.client.apis.producer.SendReceipt;
import org.apache.rocketmq.client.apis.producer.Transaction;
import org.apache.rocketmq.client.apis.producer.TransactionResolution;

public final class Scenarios {
    static final ClientServiceProvider SP = ClientServiceProvider.loadService();
    static final long T0 = System.currentTimeMillis();
    static String proxy;
    static long masterPid;

    public static void main(String[] args) throws Exception {
        Map<String, String> opts = new HashMap<>();
        for (String a : args) {
            int eq = a.indexOf('=');
            opts.put(a.substring(0, eq), a.substring(eq + 1));
        }
        proxy = opts.get("proxy");
        masterPid = Long.parseLong(opts.getOrDefault("master_pid", "0"));
        // the first five use topics and groups of their own and run at once; the master
        // kill runs alone, last
        List<String> parallel =
            List.of("normal", "push", "fifo", "delay", "transaction", "rules", "sql92");
        String only = opts.getOrDefault("only", "");
        List<String> wanted = only.isEmpty() ? null : List.of(only.split(","));
        ExecutorService pool = Executors.newFixedThreadPool(parallel.size());
        List<Future<?>> running = new ArrayList<>();
        for (String name : parallel) {
            if (wanted == null || wanted.contains(name)) {
                running.add(pool.submit(() -> report(name)));
            }
        }
        for (Future<?> f : running) {
            f.get(180, TimeUnit.SECONDS);
        }
        pool.shutdown();
        if (wanted != null && wanted.contains("priority")) {
            report("priority");
        }
        if (wanted == null || wanted.contains("failover")) {
            report("failover");
        }
        System.exit(0);
    }

    static void report(String name) {
        long start = System.currentTimeMillis();
        Map<String, Object> out;
        try {
            out = run(name);
        } catch (Throwable e) {
            out = new LinkedHashMap<>();
            StringBuilder why = new StringBuilder(e.toString());
            for (Throwable c = e.getCause(); c != null; c = c.getCause()) {
                why.append(" <- ").append(c);
            }
            out.put("error", why.toString());
        }
        out.put("seconds", (System.currentTimeMillis() - start) / 1000.0);
        synchronized (System.out) {
            System.out.println("RESULT " + name + " " + json(out));
            System.out.flush();
        }
    }

    static Map<String, Object> run(String name) throws Exception {
        switch (name) {
            case "normal": return normal();
            case "push": return push();
            case "fifo": return fifo();
            case "delay": return delay();
            case "transaction": return transaction();
            case "rules": return rules();
            case "sql92": return sql92();
            case "priority": return priority();
            case "failover": return failover();
            default: throw new IllegalArgumentException(name);
        }
    }

    // ---- helpers ------------------------------------------------------------------------

    static void step(String what) {
        if (System.getenv("SDK_DEBUG") != null) {
            System.err.println("[" + (System.currentTimeMillis() - T0) + " ms] " + what);
        }
    }

    static ClientConfiguration config() {
        return ClientConfiguration.newBuilder()
            .setEndpoints(proxy)
            .setRequestTimeout(Duration.ofSeconds(5))
            // the SDK dials TLS by default; the gateway here serves plaintext (RocketMQ's
            // proxy answers both on one port, with a self-signed certificate)
            .enableSsl(false)
            .build();
    }

    static Producer producer(String topic) throws ClientException {
        return SP.newProducerBuilder().setClientConfiguration(config()).setTopics(topic).build();
    }

    static Message message(String topic, String body) {
        return SP.newMessageBuilder().setTopic(topic).setBody(bytes(body)).build();
    }

    static byte[] bytes(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    static String body(MessageView v) {
        byte[] b = new byte[v.getBody().remaining()];
        v.getBody().duplicate().get(b);
        return new String(b, StandardCharsets.UTF_8);
    }

    static boolean until(BooleanSupplier done, long timeoutMs) throws InterruptedException {
        long deadline = System.currentTimeMillis() + timeoutMs;
        while (System.currentTimeMillis() < deadline) {
            if (done.getAsBoolean()) {
                return true;
            }
            Thread.sleep(50);
        }
        return done.getAsBoolean();
    }

    interface OnView {
        void accept(MessageView v);
    }

    static PushConsumer pushConsumer(String group, String topic, OnView on) throws ClientException {
        return SP.newPushConsumerBuilder()
            .setClientConfiguration(config())
            .setConsumerGroup(group)
            .setSubscriptionExpressions(Collections.singletonMap(topic, FilterExpression.SUB_ALL))
            .setMessageListener(v -> {
                on.accept(v);
                return ConsumeResult.SUCCESS;
            })
            .build();
    }

    /** Receive-and-ack with a SimpleConsumer until {@code want} messages or the timeout. */
    static List<Map<String, Object>> drain(String group, String topic, int want, long timeoutMs)
            throws Exception {
        List<Map<String, Object>> got = new ArrayList<>();
        try (SimpleConsumer c = SP.newSimpleConsumerBuilder()
                .setClientConfiguration(config())
                .setConsumerGroup(group)
                .setAwaitDuration(Duration.ofSeconds(2))
                .setSubscriptionExpressions(Collections.singletonMap(topic, FilterExpression.SUB_ALL))
                .build()) {
            long deadline = System.currentTimeMillis() + timeoutMs;
            while (got.size() < want && System.currentTimeMillis() < deadline) {
                for (MessageView v : c.receive(16, Duration.ofSeconds(15))) {
                    Map<String, Object> m = new LinkedHashMap<>();
                    m.put("id", v.getMessageId().toString());
                    m.put("body", body(v));
                    m.put("tag", v.getTag().orElse(null));
                    m.put("keys", new ArrayList<>(v.getKeys()));
                    m.put("attempt", v.getDeliveryAttempt());
                    m.put("at", System.currentTimeMillis());
                    got.add(m);
                    c.ack(v);
                }
            }
        }
        return got;
    }

    // ---- scenarios ------------------------------------------------------------------------

    /** Normal messages with a tag and keys, received and acked by a SimpleConsumer. */
    static Map<String, Object> normal() throws Exception {
        Map<String, Object> out = new LinkedHashMap<>();
        List<String> sent = new ArrayList<>();
        try (Producer p = producer("java-normal")) {
            for (int i = 0; i < 20; i++) {
                Message m = SP.newMessageBuilder().setTopic("java-normal").setTag("A")
                    .setKeys("k" + i).setBody(bytes("n" + i)).build();
                sent.add(p.send(m).getMessageId().toString());
            }
        }
        out.put("sent", sent);
        out.put("got", drain("java-g-normal", "java-normal", 20, 25_000));
        return out;
    }

    /** SQL92 subscriptions (FilterExpressionType.SQL92): the brokers evaluate them over
     *  user properties and TAGS; a consumer with a bad expression is refused. */
    static Map<String, Object> sql92() throws Exception {
        Map<String, Object> out = new LinkedHashMap<>();
        FilterExpression selected = new FilterExpression("region = 'eu' AND n >= 4", FilterExpressionType.SQL92);
        FilterExpression broken = new FilterExpression("region = 'eu", FilterExpressionType.SQL92);
        out.put("bad", outcome(() -> {
            try (SimpleConsumer c = SP.newSimpleConsumerBuilder()
                    .setClientConfiguration(config())
                    .setConsumerGroup("java-g-sql-bad")
                    .setAwaitDuration(Duration.ofSeconds(1))
                    .setSubscriptionExpressions(Collections.singletonMap("java-sql", broken))
                    .build()) {
                return c.receive(1, Duration.ofSeconds(15)).size();
            }
        }));
        try (SimpleConsumer c = SP.newSimpleConsumerBuilder()
                .setClientConfiguration(config())
                .setConsumerGroup("java-g-sql")
                .setAwaitDuration(Duration.ofSeconds(2))
                .setSubscriptionExpressions(Collections.singletonMap("java-sql", selected))
                .build();
             Producer p = producer("java-sql")) {
            for (int i = 0; i < 12; i++) {
                p.send(SP.newMessageBuilder().setTopic("java-sql").setTag(i / 2 % 2 == 0 ? "A" : "B")
                    .addProperty("n", String.valueOf(i)).addProperty("region", i % 2 == 0 ? "us" : "eu")
                    .setBody(bytes("s" + i)).build());
            }
            List<Integer> got = new ArrayList<>();
            long deadline = System.currentTimeMillis() + 25_000;
            while (got.size() < 4 && System.currentTimeMillis() < deadline) {
                for (MessageView v : c.receive(16, Duration.ofSeconds(15))) {
                    got.add(Integer.parseInt(v.getProperties().get("n")));
                    c.ack(v);
                }
            }
            int more = 0;
            for (MessageView v : c.receive(16, Duration.ofSeconds(15))) {
                more++;
                c.ack(v);
            }
            Collections.sort(got);
            out.put("got", got);
            out.put("more", more);
        }
        return out;
    }

    /** Priority messages (RIP-80, MessageBuilder.setPriority, SDK 5.2.0 on): interleaved
     *  levels sent to "java-priority" (PRIORITY, 10 queues, on one group), then received
     *  one at a time by a SimpleConsumer that subscribed before the sends: the highest
     *  level first, one level in the order sent (12 shares level 9). setPriority and
     *  getPriority are called by reflection, so that this file still compiles against
     *  5.0.8 (which has neither: there the scenario reports NoSuchMethodException). */
    static Map<String, Object> priority() throws Exception {
        Map<String, Object> out = new LinkedHashMap<>();
        Method setPriority = MessageBuilder.class.getMethod("setPriority", int.class);
        Method getPriority = MessageView.class.getMethod("getPriority");
        int[][] sends = {{1, 0}, {5, 1}, {3, 2}, {5, 3}, {12, 4}, {0, 5}, {3, 6}, {1, 7}};
        List<String> got = new ArrayList<>();
        List<Object> priorities = new ArrayList<>();
        try (SimpleConsumer c = SP.newSimpleConsumerBuilder()
                .setClientConfiguration(config())
                .setConsumerGroup("java-g-prio")
                .setAwaitDuration(Duration.ofSeconds(1))
                .setSubscriptionExpressions(
                    Collections.singletonMap("java-priority", FilterExpression.SUB_ALL))
                .build()) {
            try (Producer p = producer("java-priority")) {
                for (int[] s : sends) {
                    MessageBuilder b = SP.newMessageBuilder().setTopic("java-priority")
                        .setBody(bytes(s[0] + "-" + s[1]));
                    setPriority.invoke(b, s[0]);
                    p.send(b.build());
                }
                out.put("plain_to_priority", outcome(
                    () -> p.send(message("java-priority", "plain")).getMessageId().toString()));
            }
            try (Producer p = producer("java-normal")) {
                MessageBuilder b = SP.newMessageBuilder().setTopic("java-normal").setBody(bytes("x"));
                setPriority.invoke(b, 3);
                Message m = b.build();
                out.put("to_normal", outcome(() -> p.send(m).getMessageId().toString()));
            }
            long deadline = System.currentTimeMillis() + 20_000;
            while (got.size() < sends.length && System.currentTimeMillis() < deadline) {
                for (MessageView v : c.receive(1, Duration.ofSeconds(15))) { // each pop's pick
                    got.add(body(v));
                    priorities.add(((Optional<?>) getPriority.invoke(v)).orElse(null));
                    c.ack(v);
                }
            }
        }
        out.put("got", got);
        out.put("priorities", priorities);
        return out;
    }

    /** A PushConsumer of a normal topic: every message once. */
    static Map<String, Object> push() throws Exception {
        Map<String, Object> out = new LinkedHashMap<>();
        List<String> got = new CopyOnWriteArrayList<>();
        List<String> sent = new ArrayList<>();
        try (PushConsumer c = pushConsumer("java-g-push", "java-push", v -> got.add(body(v)));
             Producer p = producer("java-push")) {
            for (int i = 0; i < 30; i++) {
                p.send(message("java-push", "p" + i));
                sent.add("p" + i);
            }
            until(() -> got.size() >= 30, 25_000);
            Thread.sleep(500); // a duplicate would show up here
        }
        out.put("sent", sent);
        out.put("got", new ArrayList<>(got));
        return out;
    }

    /** FIFO: three message groups, consumed in order by a push consumer of an orderly group. */
    static Map<String, Object> fifo() throws Exception {
        Map<String, Object> out = new LinkedHashMap<>();
        List<String> sent = new ArrayList<>();
        try (Producer p = producer("java-fifo")) {
            for (int seq = 0; seq < 8; seq++) {
                for (String g : List.of("ga", "gb", "gc")) {
                    Message m = SP.newMessageBuilder().setTopic("java-fifo").setMessageGroup(g)
                        .setBody(bytes(g + ":" + seq)).build();
                    p.send(m);
                    sent.add(g + ":" + seq);
                }
            }
        }
        List<String> got = new CopyOnWriteArrayList<>();
        try (PushConsumer c = pushConsumer("java-g-fifo", "java-fifo", v -> got.add(body(v)))) {
            until(() -> got.size() >= 24, 25_000);
        }
        out.put("sent", sent);
        out.put("got", new ArrayList<>(got));
        return out;
    }

    /** Delayed messages: one kept (arrives at its time), one recalled (never arrives). */
    static Map<String, Object> delay() throws Exception {
        Map<String, Object> out = new LinkedHashMap<>();
        List<Map<String, Object>> arrivals = new CopyOnWriteArrayList<>();
        try (PushConsumer c = pushConsumer("java-g-delay", "java-delay", v -> {
                Map<String, Object> a = new LinkedHashMap<>();
                a.put("body", body(v));
                a.put("at", System.currentTimeMillis());
                arrivals.add(a);
            });
             Producer p = producer("java-delay")) {
            long due = System.currentTimeMillis() + 3000;
            SendReceipt kept = p.send(SP.newMessageBuilder().setTopic("java-delay")
                .setDeliveryTimestamp(due).setBody(bytes("kept")).build());
            SendReceipt recalled = p.send(SP.newMessageBuilder().setTopic("java-delay")
                .setDeliveryTimestamp(due).setBody(bytes("recalled")).build());
            out.put("due_ms", due);
            out.put("recall_handle", recalled.getRecallHandle());
            try {
                out.put("recall", p.recallMessage("java-delay", recalled.getRecallHandle())
                    .getMessageId());
            } catch (ClientException e) {
                out.put("recall_error", e.toString());
            }
            long settle = due + 3000;
            until(() -> System.currentTimeMillis() > settle && !arrivals.isEmpty(), 20_000);
            out.put("kept_handle", kept.getRecallHandle());
        }
        out.put("arrivals", new ArrayList<>(arrivals));
        return out;
    }

    /** Transactions: a commit, a rollback, and one left open that the checker commits. */
    static Map<String, Object> transaction() throws Exception {
        Map<String, Object> out = new LinkedHashMap<>();
        List<String> checked = new CopyOnWriteArrayList<>();
        try (Producer p = SP.newProducerBuilder().setClientConfiguration(config())
                .setTopics("java-tx")
                .setTransactionChecker(v -> {
                    checked.add(body(v));
                    return TransactionResolution.COMMIT;
                })
                .build()) {
            Transaction t1 = p.beginTransaction();
            p.send(message("java-tx", "tx-commit"), t1);
            t1.commit();
            Transaction t2 = p.beginTransaction();
            p.send(message("java-tx", "tx-rollback"), t2);
            t2.rollback();
            Transaction t3 = p.beginTransaction();
            p.send(message("java-tx", "tx-checked"), t3); // left open: the check asks the checker
            out.put("got", drain("java-g-tx", "java-tx", 2, 30_000));
            Thread.sleep(1000); // the rollback must stay invisible a little longer
            out.put("late", drain("java-g-tx", "java-tx", 1, 2_000));
        }
        out.put("checked", new ArrayList<>(checked));
        return out;
    }

    static final Pattern RESPONSE_CODE = Pattern.compile("response-code=(\\d+)");

    /** What a call came to: ok, or the error and the v2 code the server answered (null
     *  when the SDK refused it itself). */
    static Map<String, Object> outcome(Callable<Object> call) {
        Map<String, Object> o = new LinkedHashMap<>();
        try {
            o.put("value", call.call());
            o.put("ok", true);
        } catch (Throwable e) {
            o.put("ok", false);
            Integer code = null;
            StringBuilder why = new StringBuilder();
            for (Throwable c = e; c != null; c = c.getCause()) {
                why.append(c).append(" <- ");
                Matcher m = RESPONSE_CODE.matcher(String.valueOf(c.getMessage()));
                if (code == null && m.find()) {
                    code = Integer.parseInt(m.group(1));
                }
            }
            o.put("code", code);
            String text = why.toString();
            o.put("error", text.substring(0, Math.min(300, text.length())));
        }
        return o;
    }

    static String repeat(char ch, int n) {
        return String.valueOf(ch).repeat(n);
    }

    /** RocketMQ's e2e cases for its 5.x clients (apache/rocketmq-e2e, written for this
     *  SDK): MessageKey, MessageTag, MessageUserProperty, NormalMessageSize,
     *  SimpleConsumerInit, ConsumerGroup and topic types; each an outcome the test
     *  checks against RocketMQ's answer. */
    static Map<String, Object> rules() throws Exception {
        Map<String, Object> out = new LinkedHashMap<>();
        Map<String, Object> send = new LinkedHashMap<>();
        int kb = 1024;
        byte[] big = new byte[4 * 1024 * 1024];
        java.util.Arrays.fill(big, (byte) 'b');
        byte[] bigger = new byte[4 * 1024 * 1024 + 1];
        try (Producer p = SP.newProducerBuilder().setClientConfiguration(config())
                .setTopics("java-rules")
                .setTransactionChecker(v -> TransactionResolution.COMMIT)
                .build()) {
            Map<String, Callable<Message>> cases = new LinkedHashMap<>();
            cases.put("key_16kb", () -> SP.newMessageBuilder().setTopic("java-rules")
                .setKeys(repeat('k', 16 * kb)).setBody(bytes("x")).build());
            cases.put("key_over_16kb", () -> SP.newMessageBuilder().setTopic("java-rules")
                .setKeys(repeat('k', 16 * kb + 1)).setBody(bytes("x")).build());
            cases.put("key_control", () -> SP.newMessageBuilder().setTopic("java-rules")
                .setKeys("\u0000").setBody(bytes("x")).build());
            cases.put("tag_16kb", () -> SP.newMessageBuilder().setTopic("java-rules")
                .setTag(repeat('t', 16 * kb)).setBody(bytes("x")).build());
            cases.put("tag_over_16kb", () -> SP.newMessageBuilder().setTopic("java-rules")
                .setTag(repeat('t', 16 * kb + 1)).setBody(bytes("x")).build());
            cases.put("tag_control", () -> SP.newMessageBuilder().setTopic("java-rules")
                .setTag("\u0000").setBody(bytes("x")).build());
            cases.put("tag_bar", () -> SP.newMessageBuilder().setTopic("java-rules")
                .setTag("a|b").setBody(bytes("x")).build());
            cases.put("props_128", () -> {
                org.apache.rocketmq.client.apis.message.MessageBuilder b = SP.newMessageBuilder()
                    .setTopic("java-rules").setBody(bytes("x"));
                for (int i = 0; i < 128; i++) {
                    b.addProperty(String.valueOf(i), "ab");
                }
                return b.build();
            });
            cases.put("props_129", () -> {
                org.apache.rocketmq.client.apis.message.MessageBuilder b = SP.newMessageBuilder()
                    .setTopic("java-rules").setBody(bytes("x"));
                for (int i = 0; i <= 128; i++) {
                    b.addProperty(String.valueOf(i), "ab");
                }
                return b.build();
            });
            cases.put("props_16kb", () -> SP.newMessageBuilder().setTopic("java-rules")
                .addProperty(repeat('k', 8 * kb), repeat('v', 8 * kb)).setBody(bytes("x")).build());
            cases.put("props_over_16kb", () -> SP.newMessageBuilder().setTopic("java-rules")
                .addProperty(repeat('k', 8 * kb), repeat('v', 8 * kb + 1)).setBody(bytes("x"))
                .build());
            cases.put("props_control", () -> SP.newMessageBuilder().setTopic("java-rules")
                .addProperty("\u0000", "value").setBody(bytes("x")).build());
            cases.put("props_system_key", () -> SP.newMessageBuilder().setTopic("java-rules")
                .addProperty("UNIQ_KEY", "value").setBody(bytes("x")).build());
            cases.put("normal_4mib", () -> SP.newMessageBuilder().setTopic("java-rules")
                .setBody(big).build());
            cases.put("normal_4mib_16kb_props", () -> SP.newMessageBuilder().setTopic("java-rules")
                .addProperty(repeat('k', 8 * kb), repeat('v', 8 * kb)).setBody(big).build());
            cases.put("normal_over_4mib", () -> SP.newMessageBuilder().setTopic("java-rules")
                .setBody(bigger).build());
            cases.put("fifo_4mib", () -> SP.newMessageBuilder().setTopic("java-rules-fifo")
                .setMessageGroup("size").setBody(big).build());
            cases.put("delay_4mib", () -> SP.newMessageBuilder().setTopic("java-rules-delay")
                .setDeliveryTimestamp(System.currentTimeMillis() + 2000).setBody(big).build());
            cases.put("delay_over_24h", () -> SP.newMessageBuilder().setTopic("java-rules-delay")
                .setDeliveryTimestamp(System.currentTimeMillis() + 25L * 3600 * 1000)
                .setBody(bytes("x")).build());
            cases.put("fifo_to_normal", () -> SP.newMessageBuilder().setTopic("java-rules")
                .setMessageGroup("g").setBody(bytes("x")).build());
            cases.put("delay_to_normal", () -> SP.newMessageBuilder().setTopic("java-rules")
                .setDeliveryTimestamp(System.currentTimeMillis() + 2000).setBody(bytes("x"))
                .build());
            cases.put("normal_to_fifo", () -> SP.newMessageBuilder().setTopic("java-rules-fifo")
                .setBody(bytes("x")).build());
            for (Map.Entry<String, Callable<Message>> c : cases.entrySet()) {
                send.put(c.getKey(), outcome(() -> p.send(c.getValue().call()).getMessageId()
                    .toString()));
            }
            send.put("tx_4mib", outcome(() -> {
                Transaction t = p.beginTransaction();
                SendReceipt r = p.send(SP.newMessageBuilder().setTopic("java-rules-tx")
                    .setBody(big).build(), t);
                t.commit();
                return r.getMessageId().toString();
            }));
            send.put("tx_to_normal", outcome(() -> {
                Transaction t = p.beginTransaction();
                SendReceipt r = p.send(message("java-rules", "tx"), t);
                t.commit();
                return r.getMessageId().toString();
            }));
        }
        out.put("send", send);
        Map<String, Object> receive = new LinkedHashMap<>();
        try (SimpleConsumer c = SP.newSimpleConsumerBuilder()
                .setClientConfiguration(config())
                .setConsumerGroup("java-g-rules")
                .setAwaitDuration(Duration.ofSeconds(1))
                .setSubscriptionExpressions(Collections.singletonMap("java-rules",
                    FilterExpression.SUB_ALL))
                .build()) {
            receive.put("invisible_9s", outcome(() -> c.receive(1, Duration.ofMillis(9999)).size()));
            receive.put("invisible_over_12h",
                outcome(() -> c.receive(1, Duration.ofMillis(43_200_001)).size()));
            receive.put("invisible_10s", outcome(() -> c.receive(1, Duration.ofSeconds(10)).size()));
        }
        receive.put("default_consumer", outcome(() -> {
            try (SimpleConsumer c = SP.newSimpleConsumerBuilder()
                    .setClientConfiguration(config())
                    .setConsumerGroup("DEFAULT_CONSUMER")
                    .setAwaitDuration(Duration.ofSeconds(1))
                    .setSubscriptionExpressions(Collections.singletonMap("java-rules",
                        FilterExpression.SUB_ALL))
                    .build()) {
                return c.receive(32, Duration.ofSeconds(10)).size();
            }
        }));
        out.put("receive", receive);
        return out;
    }

    /** A stream of sends with a push consumer; the master is killed -9 after 40 acks. */
    static Map<String, Object> failover() throws Exception {
        Map<String, Object> out = new LinkedHashMap<>();
        Map<String, Integer> received = new ConcurrentHashMap<>();
        Map<String, Long> firstAt = new ConcurrentHashMap<>();
        List<String> acked = new ArrayList<>();
        List<String> failed = new ArrayList<>();
        long killedAt = 0;
        try (PushConsumer c = pushConsumer("java-g-ha", "java-ha", v -> {
                String b = body(v);
                received.merge(b, 1, Integer::sum);
                firstAt.putIfAbsent(b, System.currentTimeMillis());
            });
             Producer p = producer("java-ha")) {
            for (int i = 0; i < 160; i++) {
                if (acked.size() == 40 && killedAt == 0) {
                    killedAt = System.currentTimeMillis();
                    ProcessHandle.of(masterPid).ifPresent(ProcessHandle::destroyForcibly);
                    out.put("killed_after", acked.size());
                }
                String b = "h" + i;
                try {
                    p.send(message("java-ha", b));
                    acked.add(b);
                } catch (ClientException e) {
                    failed.add(b + ": " + e.getMessage());
                }
                Thread.sleep(20);
            }
            long lastSend = System.currentTimeMillis();
            until(() -> received.keySet().containsAll(acked), 40_000);
            long lastNeeded = 0;
            for (String b : acked) {
                lastNeeded = Math.max(lastNeeded, firstAt.getOrDefault(b, Long.MAX_VALUE / 2));
            }
            out.put("all_received_after_last_send_s", (lastNeeded - lastSend) / 1000.0);
        }
        List<String> missing = new ArrayList<>();
        Map<String, Integer> dups = new LinkedHashMap<>();
        for (String b : acked) {
            Integer n = received.get(b);
            if (n == null) {
                missing.add(b);
            } else if (n > 1) {
                dups.put(b, n);
            }
        }
        out.put("acked", acked.size());
        out.put("failed", failed);
        out.put("missing", missing);
        out.put("duplicated", dups);
        return out;
    }

    // ---- a small JSON writer (maps, lists, strings, numbers, booleans, null) --------------

    static String json(Object o) {
        StringBuilder sb = new StringBuilder();
        write(sb, o);
        return sb.toString();
    }

    static void write(StringBuilder sb, Object o) {
        if (o == null) {
            sb.append("null");
        } else if (o instanceof Map) {
            sb.append('{');
            boolean first = true;
            for (Map.Entry<?, ?> e : ((Map<?, ?>) o).entrySet()) {
                if (!first) {
                    sb.append(',');
                }
                first = false;
                write(sb, String.valueOf(e.getKey()));
                sb.append(':');
                write(sb, e.getValue());
            }
            sb.append('}');
        } else if (o instanceof List) {
            sb.append('[');
            boolean first = true;
            for (Object x : (List<?>) o) {
                if (!first) {
                    sb.append(',');
                }
                first = false;
                write(sb, x);
            }
            sb.append(']');
        } else if (o instanceof Number || o instanceof Boolean) {
            sb.append(o);
        } else {
            sb.append('"');
            for (char ch : o.toString().toCharArray()) {
                if (ch == '"' || ch == '\\') {
                    sb.append('\\').append(ch);
                } else if (ch < 0x20) {
                    sb.append(String.format("\\u%04x", (int) ch));
                } else {
                    sb.append(ch);
                }
            }
            sb.append('"');
        }
    }
}
