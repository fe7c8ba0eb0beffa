package sdkgo

// Sessions through azservicebus's SessionReceiver: named and next-available accepts, session
// state, the session lock (renewed, then lost on demand), and every settlement.

import (
	"bytes"
	"context"
	"slices"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

func TestSessionsNamedAndNext(t *testing.T) {
	t.Parallel()
	ctx := within(t, time.Minute)
	client := newClient(t)
	sender, err := client.NewSender("go-sessions", nil)
	must(t, err)
	a, b := unique("a"), unique("b")
	send(t, ctx, sender, a, "a0", "a1", "a2")
	send(t, ctx, sender, b, "b0", "b1")

	named, err := client.AcceptSessionForQueue(ctx, "go-sessions", b, nil)
	must(t, err)
	if named.SessionID() != b {
		t.Fatalf("accepted %q, asked for %q", named.SessionID(), b)
	}
	got := receiveN(t, ctx, named, 2)
	if !slices.Equal(bodies(got), []string{"b0", "b1"}) {
		t.Fatalf("session %s gave %q", b, bodies(got))
	}
	for _, m := range got {
		if m.SessionID == nil || *m.SessionID != b {
			t.Fatalf("a message of session %s says session %v", b, m.SessionID)
		}
		must(t, named.CompleteMessage(ctx, m, nil))
	}

	// b is held: the next available session is a, the only other one with messages
	next, err := client.AcceptNextSessionForQueue(ctx, "go-sessions", nil)
	must(t, err)
	if next.SessionID() != a {
		t.Fatalf("the next available session is %q, want %q", next.SessionID(), a)
	}
	got = receiveN(t, ctx, next, 3)
	if !slices.Equal(bodies(got), []string{"a0", "a1", "a2"}) {
		t.Fatalf("session %s gave %q", a, bodies(got))
	}
	for _, m := range got {
		must(t, next.CompleteMessage(ctx, m, nil))
	}

	// a session held by one receiver is refused to another while held
	_, err = client.AcceptSessionForQueue(within(t, 20*time.Second), "go-sessions", a,
		nil)
	if err == nil {
		t.Fatalf("session %s was accepted twice", a)
	}
	must(t, next.Close(ctx))
	must(t, named.Close(ctx))

	// nothing left: the next-available accept waits, then times out
	short, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if r, err := client.AcceptNextSessionForQueue(short, "go-sessions", nil); err == nil {
		t.Fatalf("accepted session %q of an empty queue", r.SessionID())
	}
}

func TestSessionStateAndRenewLock(t *testing.T) {
	t.Parallel()
	ctx := within(t, time.Minute)
	client := newClient(t)
	sender, err := client.NewSender("go-state", nil)
	must(t, err)
	id := unique("state")
	send(t, ctx, sender, id, "one")

	r, err := client.AcceptSessionForQueue(ctx, "go-state", id, nil)
	must(t, err)
	state, err := r.GetSessionState(ctx, nil)
	must(t, err)
	if state != nil {
		t.Fatalf("a new session's state is %q, want none", state)
	}
	want := []byte("checkpoint: step 3 \x00\xff")
	must(t, r.SetSessionState(ctx, want, nil))
	state, err = r.GetSessionState(ctx, nil)
	must(t, err)
	if !bytes.Equal(state, want) {
		t.Fatalf("state is %q, want %q", state, want)
	}

	before := r.LockedUntil()
	if time.Until(before) <= 0 || time.Until(before) > 31*time.Second {
		t.Fatalf("the session is locked until %v: not within the queue's 30 s", before)
	}
	time.Sleep(1100 * time.Millisecond)
	must(t, r.RenewSessionLock(ctx, nil))
	if !r.LockedUntil().After(before) {
		t.Fatalf("renewing kept the lock's end at %v (was %v)", r.LockedUntil(), before)
	}
	must(t, r.Close(ctx))

	// the state outlives the receiver; nil clears it
	r, err = client.AcceptSessionForQueue(ctx, "go-state", id, nil)
	must(t, err)
	state, err = r.GetSessionState(ctx, nil)
	must(t, err)
	if !bytes.Equal(state, want) {
		t.Fatalf("after a new accept the state is %q, want %q", state, want)
	}
	must(t, r.SetSessionState(ctx, nil, nil))
	state, err = r.GetSessionState(ctx, nil)
	must(t, err)
	if state != nil {
		t.Fatalf("a cleared state reads %q", state)
	}
	got := receiveN(t, ctx, r, 1)
	must(t, r.CompleteMessage(ctx, got[0], nil))
	must(t, r.Close(ctx))
}

func TestSessionLockLost(t *testing.T) {
	t.Parallel()
	ctx := within(t, time.Minute)
	client, err := azservicebus.NewClientFromConnectionString(connectionString(t),
		&azservicebus.ClientOptions{RetryOptions: noRetries})
	must(t, err)
	defer client.Close(ctx)
	sender, err := client.NewSender("go-lock-lost", nil)
	must(t, err)
	id := unique("lost")
	send(t, ctx, sender, id, "m0", "m1")

	r, err := client.AcceptSessionForQueue(ctx, "go-lock-lost", id, nil)
	must(t, err)
	got := receiveN(t, ctx, r, 2)
	must(t, r.CompleteMessage(ctx, got[0], nil))

	fault := injectFault(t, map[string]any{"kind": "session-lock-lost", "entity": "go-lock-lost", "session": id})
	if fault["released"] != true {
		t.Fatalf("busd says nobody held session %s: %v", id, fault)
	}
	// busd detaches the holder's link, as at the lock's expiry: the SDK's next renewal and
	// settlement of that session report the lock lost
	err = r.RenewSessionLock(ctx, nil)
	if code := errorCode(err); code != azservicebus.CodeLockLost {
		t.Fatalf("renewing a lost session lock: %v (code %q), want %q", err, code, azservicebus.CodeLockLost)
	}
	err = r.CompleteMessage(ctx, got[1], nil)
	if code := errorCode(err); code != azservicebus.CodeLockLost {
		t.Fatalf("completing after the session lock was lost: %v (code %q), want %q", err, code, azservicebus.CodeLockLost)
	}
	_ = r.Close(ctx)

	// the next holder gets the message that was not completed, its delivery count raised
	again, err := client.AcceptSessionForQueue(ctx, "go-lock-lost", id, nil)
	must(t, err)
	redelivered := receiveN(t, ctx, again, 1)
	if string(redelivered[0].Body) != "m1" || redelivered[0].DeliveryCount != 2 {
		t.Fatalf("after the lock was lost: %q delivery count %d, want m1 and 2",
			redelivered[0].Body, redelivered[0].DeliveryCount)
	}
	must(t, again.CompleteMessage(ctx, redelivered[0], nil))
	receiveNone(t, again, time.Second)
	must(t, again.Close(ctx))
}

func TestSessionSettlement(t *testing.T) {
	t.Parallel()
	ctx := within(t, time.Minute)
	client := newClient(t)
	sender, err := client.NewSender("go-settle", nil)
	must(t, err)
	id := unique("settle")
	send(t, ctx, sender, id, "complete", "abandon", "defer", "dead-letter")

	r, err := client.AcceptSessionForQueue(ctx, "go-settle", id, nil)
	must(t, err)
	got := receiveN(t, ctx, r, 4)
	if !slices.Equal(bodies(got), []string{"complete", "abandon", "defer", "dead-letter"}) {
		t.Fatalf("received %q", bodies(got))
	}
	must(t, r.CompleteMessage(ctx, got[0], nil))
	must(t, r.AbandonMessage(ctx, got[1], &azservicebus.AbandonMessageOptions{
		PropertiesToModify: map[string]any{"abandoned-by": "go"},
	}))
	must(t, r.DeferMessage(ctx, got[2], nil))
	must(t, r.DeadLetterMessage(ctx, got[3], &azservicebus.DeadLetterOptions{
		Reason: str("bad-order"), ErrorDescription: str("the order has no lines"),
	}))

	// the abandoned message comes back first, its delivery count raised, its property set
	again := receiveN(t, ctx, r, 1)
	if string(again[0].Body) != "abandon" || again[0].DeliveryCount != 2 ||
		again[0].ApplicationProperties["abandoned-by"] != "go" {
		t.Fatalf("after abandon: %q count %d properties %v", again[0].Body,
			again[0].DeliveryCount, again[0].ApplicationProperties)
	}
	must(t, r.CompleteMessage(ctx, again[0], nil))
	receiveNone(t, r, time.Second) // the deferred one is not delivered again

	deferred, err := r.ReceiveDeferredMessages(ctx, []int64{*got[2].SequenceNumber}, nil)
	must(t, err)
	if len(deferred) != 1 || string(deferred[0].Body) != "defer" || deferred[0].State != azservicebus.MessageStateDeferred {
		t.Fatalf("ReceiveDeferredMessages gave %q", bodies(deferred))
	}
	must(t, r.CompleteMessage(ctx, deferred[0], nil))
	must(t, r.Close(ctx))

	dlq, err := client.NewReceiverForQueue("go-settle", &azservicebus.ReceiverOptions{SubQueue: azservicebus.SubQueueDeadLetter})
	must(t, err)
	dead := receiveN(t, ctx, dlq, 1)
	m := dead[0]
	if string(m.Body) != "dead-letter" || m.DeadLetterReason == nil || *m.DeadLetterReason != "bad-order" ||
		m.DeadLetterErrorDescription == nil || *m.DeadLetterErrorDescription != "the order has no lines" ||
		m.SessionID == nil || *m.SessionID != id {
		t.Fatalf("the dead-lettered message: %q reason %v description %v session %v",
			m.Body, m.DeadLetterReason, m.DeadLetterErrorDescription, m.SessionID)
	}
	if m.DeadLetterSource != nil {
		t.Fatalf("a message dead-lettered from its own queue names a source: %q", *m.DeadLetterSource)
	}
	must(t, dlq.CompleteMessage(ctx, m, nil))
	must(t, dlq.Close(ctx))
}
