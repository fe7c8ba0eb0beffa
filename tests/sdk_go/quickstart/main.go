package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"
)

func main() {
	conn := os.Getenv("SERVICEBUS_CONNECTION_STRING")
	if conn == "" {
		conn = "Endpoint=sb://localhost:5672;SharedAccessKeyName=RootManageSharedAccessKey;" +
			"SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// MaxRetries: -1 while developing: errors at once instead of after the retries
	client, err := azservicebus.NewClientFromConnectionString(conn, &azservicebus.ClientOptions{
		RetryOptions: azservicebus.RetryOptions{MaxRetries: -1},
	})
	check(err)
	defer client.Close(ctx)

	sender, err := client.NewSender("session-queue", nil)
	check(err)
	for i := 0; i < 3; i++ {
		message := &azservicebus.Message{Body: []byte(fmt.Sprintf("step %d", i)), SessionID: ptr("order-42")}
		check(sender.SendMessage(ctx, message, nil))
	}
	check(sender.Close(ctx))

	receiver, err := client.AcceptNextSessionForQueue(ctx, "session-queue", nil)
	check(err)
	for received := 0; received < 3; {
		messages, err := receiver.ReceiveMessages(ctx, 10, nil)
		check(err)
		for _, message := range messages {
			fmt.Println(receiver.SessionID(), string(message.Body))
			check(receiver.CompleteMessage(ctx, message, nil))
			received++
		}
	}
	check(receiver.Close(ctx))

	// HTTPS: trusts busd-ca.pem through SSL_CERT_FILE
	adminClient, err := admin.NewClientFromConnectionString(conn, nil)
	check(err)
	props, err := adminClient.GetQueueRuntimeProperties(ctx, "session-queue", nil)
	check(err)
	fmt.Println("active:", props.ActiveMessageCount)
}

func check(err error) {
	if err != nil {
		panic(err)
	}
}

func ptr(s string) *string { return &s }
