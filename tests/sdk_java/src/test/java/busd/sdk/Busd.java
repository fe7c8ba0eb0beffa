package busd.sdk;

import com.azure.core.amqp.AmqpRetryMode;
import com.azure.core.amqp.AmqpRetryOptions;
import com.azure.core.http.HttpPipelinePosition;
import com.azure.core.http.policy.HttpPipelinePolicy;
import com.azure.core.util.UrlBuilder;
import com.azure.messaging.servicebus.ServiceBusClientBuilder;
import com.azure.messaging.servicebus.ServiceBusReceivedMessage;
import com.azure.messaging.servicebus.ServiceBusReceiverClient;
import com.azure.messaging.servicebus.administration.ServiceBusAdministrationClient;
import com.azure.messaging.servicebus.administration.ServiceBusAdministrationClientBuilder;
import java.io.IOException;
import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.UUID;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;

/**
 * The busd the pytest module started: its connection strings and ports come as system
 * properties (busd.connectionString, busd.tlsConnectionString, busd.httpPort, busd.wsPort);
 * the JVM trusts busd's certificate authority through javax.net.ssl.trustStore.
 */
final class Busd {
    static final String CONNECTION_STRING = property("busd.connectionString");
    static final String TLS_CONNECTION_STRING = property("busd.tlsConnectionString");
    static final int HTTP_PORT = Integer.parseInt(property("busd.httpPort"));
    static final int WS_PORT = Integer.parseInt(property("busd.wsPort"));
    static final String KEY_NAME = "RootManageSharedAccessKey";
    static final String KEY = "SAS_KEY_VALUE";

    private Busd() {
    }

    private static String property(String name) {
        String value = System.getProperty(name);
        if (value == null || value.isEmpty()) {
            throw new IllegalStateException("system property " + name + " is not set: run through test_sdk_java.py");
        }
        return value;
    }

    /** Few, quick retries: a broken broker fails a test at once instead of after minutes. */
    static AmqpRetryOptions retries() {
        return new AmqpRetryOptions().setMode(AmqpRetryMode.FIXED)
            .setMaxRetries(2)
            .setDelay(Duration.ofMillis(200))
            .setTryTimeout(Duration.ofSeconds(20));
    }

    static ServiceBusClientBuilder client() {
        return new ServiceBusClientBuilder().connectionString(CONNECTION_STRING).retryOptions(retries());
    }

    /**
     * The administration client over HTTPS, trusting busd's authority. The SDK keeps the host of the
     * connection string's endpoint and drops its port (Service Bus serves HTTPS on 443): a policy
     * puts busd's port back on every request.
     */
    static ServiceBusAdministrationClient admin() {
        return new ServiceBusAdministrationClientBuilder().connectionString(CONNECTION_STRING)
            .addPolicy(port(HTTP_PORT))
            .buildClient();
    }

    static HttpPipelinePolicy port(int port) {
        return new HttpPipelinePolicy() {
            @Override
            public reactor.core.publisher.Mono<com.azure.core.http.HttpResponse> process(
                com.azure.core.http.HttpPipelineCallContext context, com.azure.core.http.HttpPipelineNextPolicy next) {
                UrlBuilder url = UrlBuilder.parse(context.getHttpRequest().getUrl());
                context.getHttpRequest().setUrl(url.setPort(port).toString());
                return next.process();
            }

            @Override
            public HttpPipelinePosition getPipelinePosition() {
                return HttpPipelinePosition.PER_CALL;
            }
        };
    }

    static String unique(String prefix) {
        return prefix + "-" + UUID.randomUUID().toString().substring(0, 8);
    }

    /** Up to {@code count} messages, asking again until {@code patience} runs out. */
    static List<ServiceBusReceivedMessage> receive(ServiceBusReceiverClient receiver, int count, Duration patience) {
        List<ServiceBusReceivedMessage> got = new ArrayList<>();
        long deadline = System.nanoTime() + patience.toNanos();
        while (got.size() < count && System.nanoTime() < deadline) {
            receiver.receiveMessages(count - got.size(), Duration.ofSeconds(2)).forEach(got::add);
        }
        return got;
    }

    /** Sets a fault on demand (docs/faults.md) over busd's admin API; its JSON answer. */
    static String fault(String json) throws IOException, InterruptedException {
        String base = "http://127.0.0.1:" + HTTP_PORT;
        HttpRequest request = HttpRequest.newBuilder(URI.create(base + "/admin/faults"))
            .header("Authorization", sasToken("sb://127.0.0.1:" + HTTP_PORT + "/"))
            .header("Content-Type", "application/json")
            .POST(HttpRequest.BodyPublishers.ofString(json))
            .build();
        HttpResponse<String> answer = HttpClient.newHttpClient().send(request, HttpResponse.BodyHandlers.ofString());
        if (answer.statusCode() != 201) {
            throw new IllegalStateException("fault refused: " + answer.statusCode() + " " + answer.body());
        }
        return answer.body();
    }

    static String sasToken(String audience) {
        try {
            String resource = URLEncoder.encode(audience, StandardCharsets.UTF_8);
            long expiry = System.currentTimeMillis() / 1000 + 600;
            Mac mac = Mac.getInstance("HmacSHA256");
            mac.init(new SecretKeySpec(KEY.getBytes(StandardCharsets.UTF_8), "HmacSHA256"));
            byte[] signature = mac.doFinal((resource + "\n" + expiry).getBytes(StandardCharsets.UTF_8));
            return "SharedAccessSignature sr=" + resource + "&sig="
                + URLEncoder.encode(Base64.getEncoder().encodeToString(signature), StandardCharsets.UTF_8)
                + "&se=" + expiry + "&skn=" + KEY_NAME;
        } catch (Exception e) {
            throw new IllegalStateException(e);
        }
    }
}
