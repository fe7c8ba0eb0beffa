// The Go tier: the official azservicebus SDK, unchanged, against a busd the pytest module
// tests/sdk_go/test_go_sdk.py starts. It hands the broker over in the environment:
//
//	SERVICEBUS_CONNECTION_STRING  the emulator string of busd's AMQP port (plain AMQP)
//	BUSD_TLS_PORT, BUSD_WS_PORT   AMQP over TLS, AMQP over WebSockets
//	BUSD_HTTP_PORT                the admin API (faults on demand)
//	BUSD_CA_FILE                  busd's CA; SSL_CERT_FILE names it too, so that every HTTPS
//	                              and TLS client of the process trusts busd
package sdkgo

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"
)

const (
	keyName = "RootManageSharedAccessKey"
	key     = "SAS_KEY_VALUE"
)

func env(t *testing.T, name string) string {
	t.Helper()
	value := os.Getenv(name)
	if value == "" {
		t.Fatalf("%s is not set: run this tier through tests/sdk_go/test_go_sdk.py", name)
	}
	return value
}

func connectionString(t *testing.T) string { return env(t, "SERVICEBUS_CONNECTION_STRING") }

// tlsConnectionString is the string without the emulator flag: the SDK speaks TLS to the port.
func tlsConnectionString(t *testing.T, port string) string {
	return fmt.Sprintf("Endpoint=sb://localhost:%s;SharedAccessKeyName=%s;SharedAccessKey=%s;", port, keyName, key)
}

// noRetries makes a refusal reach the test at once rather than after the SDK's back-off.
var noRetries = azservicebus.RetryOptions{MaxRetries: -1}

func newClient(t *testing.T) *azservicebus.Client {
	t.Helper()
	client, err := azservicebus.NewClientFromConnectionString(connectionString(t), nil)
	must(t, err)
	t.Cleanup(func() { _ = client.Close(context.Background()) })
	return client
}

func newAdmin(t *testing.T) *admin.Client {
	t.Helper()
	client, err := admin.NewClientFromConnectionString(connectionString(t), nil)
	must(t, err)
	return client
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func within(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func unique(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano()%1_000_000_000)
}

func str(s string) *string { return &s }

func bodies(messages []*azservicebus.ReceivedMessage) []string {
	out := make([]string, len(messages))
	for i, m := range messages {
		out[i] = string(m.Body)
	}
	return out
}

func send(t *testing.T, ctx context.Context, sender *azservicebus.Sender, session string, texts ...string) {
	t.Helper()
	for _, text := range texts {
		message := &azservicebus.Message{Body: []byte(text)}
		if session != "" {
			message.SessionID = str(session)
		}
		must(t, sender.SendMessage(ctx, message, nil))
	}
}

// receiver is what Receiver and SessionReceiver share.
type receiver interface {
	ReceiveMessages(ctx context.Context, n int, o *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error)
}

// receiveN asks until n messages came (one ReceiveMessages may return fewer than are on their
// way) or ctx ends; what came so far either way.
func receiveN(t *testing.T, ctx context.Context, r receiver, n int) []*azservicebus.ReceivedMessage {
	t.Helper()
	var got []*azservicebus.ReceivedMessage
	for len(got) < n {
		batch, err := r.ReceiveMessages(ctx, n-len(got), nil)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			t.Fatal(err)
		}
		got = append(got, batch...)
	}
	return got
}

// receiveNone checks that nothing comes within d.
func receiveNone(t *testing.T, r receiver, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	got, err := r.ReceiveMessages(ctx, 10, nil)
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal(err)
	}
	if len(got) > 0 {
		t.Fatalf("expected nothing, got %q", bodies(got))
	}
}

func errorCode(err error) azservicebus.Code {
	var sbErr *azservicebus.Error
	if errors.As(err, &sbErr) {
		return sbErr.Code
	}
	return ""
}

// sasToken signs `audience` with the namespace key as the SDKs sign a put-token.
func sasToken(audience string) string {
	expiry := strconv.FormatInt(time.Now().Add(10*time.Minute).Unix(), 10)
	signed := url.QueryEscape(audience)
	mac := hmac.New(sha256.New, []byte(key))
	mac.Write([]byte(signed + "\n" + expiry))
	signature := base64.StdEncoding.EncodeToString(mac.Sum(nil))
	return fmt.Sprintf("SharedAccessSignature sr=%s&sig=%s&se=%s&skn=%s",
		signed, url.QueryEscape(signature), expiry, keyName)
}

// injectFault sets a fault on demand (docs/faults.md) over busd's admin API.
func injectFault(t *testing.T, fault map[string]any) map[string]any {
	t.Helper()
	base := "http://127.0.0.1:" + env(t, "BUSD_HTTP_PORT")
	body, err := json.Marshal(fault)
	must(t, err)
	request, err := http.NewRequest(http.MethodPost, base+"/admin/faults", strings.NewReader(string(body)))
	must(t, err)
	request.Header.Set("Authorization", sasToken(strings.Replace(base, "http", "sb", 1)+"/"))
	request.Header.Set("Content-Type", "application/json")
	response, err := http.DefaultClient.Do(request)
	must(t, err)
	defer response.Body.Close()
	answer, _ := io.ReadAll(response.Body)
	if response.StatusCode != http.StatusCreated {
		t.Fatalf("POST /admin/faults %s: %d %s", body, response.StatusCode, answer)
	}
	var record map[string]any
	must(t, json.Unmarshal(answer, &record))
	return record
}
