package sdkgo

// AMQP over WebSockets: azservicebus's NewWebSocketConn option, with the dialer the SDK's own
// example uses (github.com/coder/websocket), to busd's WebSocket port over TLS (wss).

import (
	"context"
	"crypto/tls"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/coder/websocket"
)

func TestWebSockets(t *testing.T) {
	t.Parallel()
	ctx := within(t, time.Minute)
	dialed := make(chan string, 8)
	// the SDK's example (ExampleNewClient_usingWebsocketsAndProxies), verbatim but for the
	// channel that records the URL the SDK asked for
	newWebSocketConn := func(ctx context.Context, args azservicebus.NewWebSocketConnArgs) (net.Conn, error) {
		dialed <- args.Host
		opts := &websocket.DialOptions{Subprotocols: []string{"amqp"}}
		wssConn, _, err := websocket.Dial(ctx, args.Host, opts)
		if err != nil {
			return nil, err
		}
		return websocket.NetConn(ctx, wssConn, websocket.MessageBinary), nil
	}
	// the string without the emulator flag: the SDK's WebSocket URL is wss:// to its endpoint
	client, err := azservicebus.NewClientFromConnectionString(tlsConnectionString(t, env(t, "BUSD_WS_PORT")),
		&azservicebus.ClientOptions{NewWebSocketConn: newWebSocketConn, RetryOptions: noRetries})
	must(t, err)
	defer client.Close(ctx)

	sender, err := client.NewSender("go-websocket", nil)
	must(t, err)
	id := unique("ws")
	send(t, ctx, sender, id, "w0", "w1")
	r, err := client.AcceptNextSessionForQueue(ctx, "go-websocket", nil)
	must(t, err)
	got := receiveN(t, ctx, r, 2)
	if r.SessionID() != id || !slices.Equal(bodies(got), []string{"w0", "w1"}) {
		t.Fatalf("over WebSockets: session %q gave %q", r.SessionID(), bodies(got))
	}
	for _, m := range got {
		must(t, r.CompleteMessage(ctx, m, nil))
	}
	must(t, r.Close(ctx))
	if url := <-dialed; url != "wss://localhost:"+env(t, "BUSD_WS_PORT")+"/$servicebus/websocket" {
		t.Fatalf("the SDK dialed %q", url)
	}
}

// TestTLS: the string without the emulator flag, to busd's TLS port, trusting busd's CA.
// The SDK names the string's host:port as the TLS server name, so a port other than 5671
// needs ServerName set; at 5671 the string leaves the port out and needs nothing.
func TestTLS(t *testing.T) {
	t.Parallel()
	ctx := within(t, time.Minute)
	client, err := azservicebus.NewClientFromConnectionString(tlsConnectionString(t, env(t, "BUSD_TLS_PORT")),
		&azservicebus.ClientOptions{RetryOptions: noRetries, TLSConfig: &tls.Config{ServerName: "localhost"}})
	must(t, err)
	defer client.Close(ctx)
	sender, err := client.NewSender("go-websocket", nil)
	must(t, err)
	id := unique("tls")
	send(t, ctx, sender, id, "t0")
	r, err := client.AcceptSessionForQueue(ctx, "go-websocket", id, nil)
	must(t, err)
	got := receiveN(t, ctx, r, 1)
	if string(got[0].Body) != "t0" {
		t.Fatalf("over TLS: %q", got[0].Body)
	}
	must(t, r.CompleteMessage(ctx, got[0], nil))
	must(t, r.Close(ctx))
}
