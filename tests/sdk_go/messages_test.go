package sdkgo

// Scheduling, peeking, receive-and-delete, batches and request-reply, on session queues.

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

func TestScheduledAndCancelled(t *testing.T) {
	t.Parallel()
	ctx := within(t, time.Minute)
	client := newClient(t)
	sender, err := client.NewSender("go-schedule", nil)
	must(t, err)
	id := unique("sched")
	at := time.Now().Add(2 * time.Second)
	seqs, err := sender.ScheduleMessages(ctx, []*azservicebus.Message{
		{Body: []byte("kept"), SessionID: &id},
		{Body: []byte("cancelled"), SessionID: &id},
	}, at, nil)
	must(t, err)
	if len(seqs) != 2 || seqs[0] == seqs[1] {
		t.Fatalf("ScheduleMessages gave sequence numbers %v", seqs)
	}
	must(t, sender.CancelScheduledMessages(ctx, seqs[1:], nil))

	r, err := client.AcceptSessionForQueue(ctx, "go-schedule", id, nil)
	must(t, err)
	peeked, err := r.PeekMessages(ctx, 10, &azservicebus.PeekMessagesOptions{FromSequenceNumber: &seqs[0]})
	must(t, err)
	if len(peeked) != 1 || string(peeked[0].Body) != "kept" || peeked[0].State != azservicebus.MessageStateScheduled {
		t.Fatalf("before its time the session shows %q", bodies(peeked))
	}
	got := receiveN(t, ctx, r, 1)
	if string(got[0].Body) != "kept" || *got[0].SequenceNumber != seqs[0] {
		t.Fatalf("received %q (sequence %d), want kept (%d)", got[0].Body, *got[0].SequenceNumber, seqs[0])
	}
	if got[0].ScheduledEnqueueTime == nil || got[0].ScheduledEnqueueTime.Sub(at).Abs() > time.Second {
		t.Fatalf("its scheduled time is %v, want %v", got[0].ScheduledEnqueueTime, at)
	}
	if time.Now().Before(at.Add(-100 * time.Millisecond)) {
		t.Fatalf("a message scheduled for %v came at %v", at, time.Now())
	}
	must(t, r.CompleteMessage(ctx, got[0], nil))
	receiveNone(t, r, time.Second) // the cancelled one never comes
	must(t, r.Close(ctx))
}

func TestPeek(t *testing.T) {
	t.Parallel()
	ctx := within(t, time.Minute)
	client := newClient(t)
	sender, err := client.NewSender("go-peek", nil)
	must(t, err)
	a, b := unique("pa"), unique("pb")
	send(t, ctx, sender, a, "a0", "a1", "a2")
	send(t, ctx, sender, b, "b0")

	// a session receiver peeks its own session, from where it last peeked
	r, err := client.AcceptSessionForQueue(ctx, "go-peek", a, nil)
	must(t, err)
	first, err := r.PeekMessages(ctx, 2, nil)
	must(t, err)
	rest, err := r.PeekMessages(ctx, 10, nil)
	must(t, err)
	if !slices.Equal(bodies(first), []string{"a0", "a1"}) || !slices.Equal(bodies(rest), []string{"a2"}) {
		t.Fatalf("peeking session %s gave %q then %q", a, bodies(first), bodies(rest))
	}
	// peeking locks nothing: the messages are delivered after it, from the first
	got := receiveN(t, ctx, r, 3)
	if !slices.Equal(bodies(got), []string{"a0", "a1", "a2"}) || got[0].DeliveryCount != 1 {
		t.Fatalf("after peeking, received %q", bodies(got))
	}
	for _, m := range got {
		must(t, r.CompleteMessage(ctx, m, nil))
	}
	must(t, r.Close(ctx))

	// another session's receiver peeks that session only
	other, err := client.AcceptSessionForQueue(ctx, "go-peek", b, nil)
	must(t, err)
	all, err := other.PeekMessages(ctx, 10, &azservicebus.PeekMessagesOptions{FromSequenceNumber: first[0].SequenceNumber})
	must(t, err)
	if !slices.Equal(bodies(all), []string{"b0"}) || all[0].SessionID == nil || *all[0].SessionID != b {
		t.Fatalf("peeking session %s gave %q", b, bodies(all))
	}
	must(t, other.Close(ctx))
}

func TestReceiveAndDelete(t *testing.T) {
	t.Parallel()
	ctx := within(t, time.Minute)
	client := newClient(t)
	sender, err := client.NewSender("go-receive-delete", nil)
	must(t, err)
	id := unique("rd")
	send(t, ctx, sender, id, "r0", "r1", "r2")

	r, err := client.AcceptSessionForQueue(ctx, "go-receive-delete", id,
		&azservicebus.SessionReceiverOptions{ReceiveMode: azservicebus.ReceiveModeReceiveAndDelete})
	must(t, err)
	got := receiveN(t, ctx, r, 3)
	if !slices.Equal(bodies(got), []string{"r0", "r1", "r2"}) {
		t.Fatalf("received %q", bodies(got))
	}
	if err := r.CompleteMessage(ctx, got[0], nil); err == nil {
		t.Fatal("a message received and deleted could be completed")
	}
	must(t, r.Close(ctx))

	// gone from the queue: the session has nothing left
	again, err := client.AcceptSessionForQueue(ctx, "go-receive-delete", id, nil)
	must(t, err)
	receiveNone(t, again, time.Second)
	peeked, err := again.PeekMessages(ctx, 10, nil)
	must(t, err)
	if len(peeked) != 0 {
		t.Fatalf("received and deleted, yet peeked %q", bodies(peeked))
	}
	must(t, again.Close(ctx))
}

func TestBatches(t *testing.T) {
	t.Parallel()
	ctx := within(t, time.Minute)
	client := newClient(t)
	sender, err := client.NewSender("go-batches", nil)
	must(t, err)
	id := unique("batch")
	batch, err := sender.NewMessageBatch(ctx, nil)
	must(t, err)
	var want []string
	for i := 0; i < 50; i++ {
		text := fmt.Sprintf("item %02d", i)
		want = append(want, text)
		must(t, batch.AddMessage(&azservicebus.Message{
			Body: []byte(text), SessionID: &id,
			ApplicationProperties: map[string]any{"i": int64(i)},
		}, nil))
	}
	if batch.NumMessages() != 50 {
		t.Fatalf("the batch holds %d messages", batch.NumMessages())
	}
	must(t, sender.SendMessageBatch(ctx, batch, nil))

	// a batch too large for busd's largest message is refused by the SDK before sending
	big, err := sender.NewMessageBatch(ctx, nil)
	must(t, err)
	if err := big.AddMessage(&azservicebus.Message{Body: make([]byte, 2<<20), SessionID: &id}, nil); err == nil {
		t.Fatal("a 2 MiB message fit in a batch")
	}

	r, err := client.AcceptSessionForQueue(ctx, "go-batches", id, nil)
	must(t, err)
	got := receiveN(t, ctx, r, 50)
	if !slices.Equal(bodies(got), want) {
		t.Fatalf("received %q", bodies(got))
	}
	for i, m := range got {
		if m.ApplicationProperties["i"] != int64(i) {
			t.Fatalf("message %d has properties %v", i, m.ApplicationProperties)
		}
		must(t, r.CompleteMessage(ctx, m, nil))
	}
	must(t, r.Close(ctx))
}

func TestRequestReply(t *testing.T) {
	t.Parallel()
	ctx := within(t, time.Minute)
	client := newClient(t)

	// the server: answers each request into the session its ReplyToSessionID names
	served := make(chan error, 1)
	go func() {
		served <- func() error {
			requests, err := client.NewReceiverForQueue("go-requests", nil)
			if err != nil {
				return err
			}
			defer requests.Close(context.Background())
			replies, err := client.NewSender("go-replies", nil)
			if err != nil {
				return err
			}
			defer replies.Close(context.Background())
			for n := 0; n < 3; {
				messages, err := requests.ReceiveMessages(ctx, 3-n, nil)
				if err != nil {
					return err
				}
				for _, m := range messages {
					if m.ReplyTo == nil || *m.ReplyTo != "go-replies" || m.ReplyToSessionID == nil {
						return fmt.Errorf("a request without its reply address: %v %v", m.ReplyTo, m.ReplyToSessionID)
					}
					reply := &azservicebus.Message{
						Body:          []byte("re: " + string(m.Body)),
						SessionID:     m.ReplyToSessionID,
						CorrelationID: &m.MessageID,
					}
					if err := replies.SendMessage(ctx, reply, nil); err != nil {
						return err
					}
					if err := requests.CompleteMessage(ctx, m, nil); err != nil {
						return err
					}
					n++
				}
			}
			return nil
		}()
	}()

	// the client: its own reply session, held before asking
	mine := unique("client")
	replies, err := client.AcceptSessionForQueue(ctx, "go-replies", mine, nil)
	must(t, err)
	requests, err := client.NewSender("go-requests", nil)
	must(t, err)
	ids := map[string]string{}
	for _, q := range []string{"q1", "q2", "q3"} {
		m := &azservicebus.Message{Body: []byte(q), ReplyTo: str("go-replies"), ReplyToSessionID: &mine, MessageID: str(unique(q))}
		ids[*m.MessageID] = "re: " + q
		must(t, requests.SendMessage(ctx, m, nil))
	}
	got := receiveN(t, ctx, replies, 3)
	if !slices.Equal(bodies(got), []string{"re: q1", "re: q2", "re: q3"}) {
		t.Fatalf("replies: %q", bodies(got))
	}
	for _, m := range got {
		if m.SessionID == nil || *m.SessionID != mine || m.CorrelationID == nil || ids[*m.CorrelationID] != string(m.Body) {
			t.Fatalf("reply %q: session %v correlation %v", m.Body, m.SessionID, m.CorrelationID)
		}
		must(t, replies.CompleteMessage(ctx, m, nil))
	}
	must(t, <-served)
	must(t, replies.Close(ctx))
}
