package sdkgo

// A session processor built the way azservicebus leaves it to its users (it has no processor
// type): 8 loops, each taking the next available session, completing its messages until it
// is idle, then letting it go. 200 sessions x 20 messages; the handlers record what they saw
// and the test checks it: every message once, in order per session, one holder at a time.

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

const (
	processorSessions = 200
	perSession        = 20
	processorLoops    = 8
)

// hold is one loop's hold of one session: the order counter at its accept and at its release,
// and the message numbers it completed, in the order received.
type hold struct {
	loop     int
	from, to int64
	session  string
	numbers  []int
}

func TestSessionProcessorLoop(t *testing.T) {
	t.Parallel()
	ctx := within(t, 4*time.Minute)
	client := newClient(t)
	const total = processorSessions * perSession

	sent := make(chan error, 1)
	go func() {
		sent <- func() error {
			sender, err := client.NewSender("go-processor", nil)
			if err != nil {
				return err
			}
			defer sender.Close(context.Background())
			for s := 0; s < processorSessions; s++ {
				id := fmt.Sprintf("proc-%03d", s)
				batch, err := sender.NewMessageBatch(ctx, nil)
				if err != nil {
					return err
				}
				for i := 0; i < perSession; i++ {
					err := batch.AddMessage(&azservicebus.Message{Body: []byte(strconv.Itoa(i)), SessionID: &id}, nil)
					if err != nil {
						return err
					}
				}
				if err := sender.SendMessageBatch(ctx, batch, nil); err != nil {
					return err
				}
			}
			return nil
		}()
	}()

	var clock atomic.Int64 // orders accepts and releases across the loops
	var completed atomic.Int64
	var mu sync.Mutex
	var holds []hold
	var loopErrors []error
	var wg sync.WaitGroup
	for loop := 0; loop < processorLoops; loop++ {
		wg.Add(1)
		go func(loop int) {
			defer wg.Done()
			for completed.Load() < total && ctx.Err() == nil {
				wait, cancel := context.WithTimeout(ctx, 3*time.Second)
				r, err := client.AcceptNextSessionForQueue(wait, "go-processor", nil)
				cancel()
				if err != nil {
					if errors.Is(err, context.DeadlineExceeded) || errorCode(err) == azservicebus.CodeTimeout {
						continue // no session free now
					}
					mu.Lock()
					loopErrors = append(loopErrors, fmt.Errorf("loop %d accept: %w", loop, err))
					mu.Unlock()
					return
				}
				h := hold{loop: loop, from: clock.Add(1), session: r.SessionID()}
				for {
					idle, cancel := context.WithTimeout(ctx, time.Second)
					messages, err := r.ReceiveMessages(idle, perSession, nil)
					cancel()
					if err != nil && !errors.Is(err, context.DeadlineExceeded) {
						mu.Lock()
						loopErrors = append(loopErrors, fmt.Errorf("loop %d receive %s: %w", loop, h.session, err))
						mu.Unlock()
						break
					}
					if len(messages) == 0 {
						break // idle: let the session go
					}
					for _, m := range messages {
						n, _ := strconv.Atoi(string(m.Body))
						if m.SessionID == nil || *m.SessionID != h.session {
							n = -1000 // recorded as a foreign message
						}
						h.numbers = append(h.numbers, n)
						if err := r.CompleteMessage(ctx, m, nil); err != nil {
							mu.Lock()
							loopErrors = append(loopErrors, fmt.Errorf("loop %d complete %s/%d: %w", loop, h.session, n, err))
							mu.Unlock()
							continue
						}
						completed.Add(1)
					}
				}
				h.to = clock.Add(1) // before the close: the next holder's accept comes after it
				_ = r.Close(ctx)
				mu.Lock()
				holds = append(holds, h)
				mu.Unlock()
			}
		}(loop)
	}
	must(t, <-sent)
	wg.Wait()
	for _, err := range loopErrors {
		t.Error(err)
	}

	// what the handlers recorded, per session, in the order of its holds
	bySession := map[string][]hold{}
	loopsUsed := map[int]bool{}
	for _, h := range holds {
		bySession[h.session] = append(bySession[h.session], h)
		loopsUsed[h.loop] = true
	}
	lost, duplicated, disordered, overlapping := 0, 0, 0, 0
	for s := 0; s < processorSessions; s++ {
		id := fmt.Sprintf("proc-%03d", s)
		hs := bySession[id]
		sort.Slice(hs, func(i, j int) bool { return hs[i].from < hs[j].from })
		var seen []int
		for i, h := range hs {
			if i > 0 && h.from < hs[i-1].to {
				overlapping++ // held by two loops at once
			}
			seen = append(seen, h.numbers...)
		}
		count := map[int]int{}
		for i, n := range seen {
			count[n]++
			if i > 0 && n <= seen[i-1] {
				disordered++
			}
		}
		for n := 0; n < perSession; n++ {
			switch {
			case count[n] == 0:
				lost++
			case count[n] > 1:
				duplicated += count[n] - 1
			}
		}
	}
	t.Logf("%d messages completed over %d holds by %d loops", completed.Load(), len(holds), len(loopsUsed))
	if lost+duplicated+disordered+overlapping > 0 || completed.Load() != total {
		t.Fatalf("lost %d, delivered again %d, out of order %d, sessions held twice at once %d; completed %d of %d",
			lost, duplicated, disordered, overlapping, completed.Load(), total)
	}
	if len(loopsUsed) < 2 {
		t.Fatalf("only %d of %d loops held a session", len(loopsUsed), processorLoops)
	}
}
