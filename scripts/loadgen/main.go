// Command loadgen is scripts/bench's session-processor load in Go (github.com/Azure/go-amqp):
// the same load as scripts/bench_churn.py at a fraction of the client CPU, so a many-core
// host measures busd rather than its clients.
//
//	loadgen worker      one client process of scripts/bench (--client go): the protocol of
//	                    `bench_churn.py worker` (a JSON config line on stdin, then "go" and
//	                    "stop"; progress lines on stdout; every event to the config's "out"
//	                    file), so the bench's checks and rows are the same
//	loadgen run -port P a whole churn on its own: senders send every session's messages
//	                    (group-id = session), then next-available session receivers take a
//	                    session, complete each message as it comes (settled first), let the
//	                    session go after -idle-ms without a message and take the next; it
//	                    checks order, no delivery after a complete, nothing lost and never
//	                    two holders, and prints msg/s, accept p50/p99 and its own CPU per
//	                    message (getrusage); exit 1 on any violation or error
//
// Each connection authenticates as every Service Bus client does (docs/amqp-clients.md):
// SASL ANONYMOUS, then a CBS put-token of a SAS token for the entity on $cbs.
package main

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/Azure/go-amqp"
)

const (
	sessionFilter     = "com.microsoft:session-filter"
	sessionFilterCode = 0x00000137000000C
	timeoutProperty   = "com.microsoft:timeout"
	timeoutCondition  = "com.microsoft:timeout"
	tick              = 50 * time.Millisecond // how often a worker reports progress
)

// marker starts a churn message's body: "\x00churn:<sid>/<i>[@<send time ns>];" (bench_churn.py)
var marker = []byte("\x00churn:")

// --- one clock with the bench: Python's time.monotonic() is CLOCK_MONOTONIC ---------------------
var monoBase float64
var wallBase = time.Now()

func init() {
	var ts syscall.Timespec
	// CLOCK_MONOTONIC is 1 on Linux
	syscall.Syscall(syscall.SYS_CLOCK_GETTIME, 1, uintptr(unsafe.Pointer(&ts)), 0)
	monoBase = float64(ts.Sec) + float64(ts.Nsec)/1e9
	wallBase = time.Now()
}

// now is time.monotonic() of the bench's processes, in seconds.
func now() float64 { return monoBase + time.Since(wallBase).Seconds() }

func cpuSeconds() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime) + tv(ru.Stime)
}

// --- connecting ---------------------------------------------------------------------------------
type target struct {
	Host    string `json:"host"`
	Port    int    `json:"port"`
	KeyName string `json:"key_name"`
	Key     string `json:"key"`
	CBS     bool   `json:"cbs"`
}

func sasToken(audience, keyName, key string) string {
	expiry := strconv.FormatInt(time.Now().Unix()+3600, 10)
	mac := hmac.New(sha256.New, []byte(key))
	mac.Write([]byte(url.QueryEscape(audience) + "\n" + expiry))
	sig := base64.StdEncoding.EncodeToString(mac.Sum(nil))
	return "SharedAccessSignature sr=" + url.QueryEscape(audience) + "&sig=" + url.QueryEscape(sig) +
		"&se=" + expiry + "&skn=" + url.QueryEscape(keyName)
}

// connect opens a connection and one session on it, with a CBS token for entity put first.
func connect(ctx context.Context, t target, entity string) (*amqp.Conn, *amqp.Session, error) {
	addr := fmt.Sprintf("amqp://%s:%d", t.Host, t.Port)
	conn, err := amqp.Dial(ctx, addr, &amqp.ConnOptions{SASLType: amqp.SASLTypeAnonymous()})
	if err != nil {
		return nil, nil, err
	}
	session, err := conn.NewSession(ctx, nil)
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	if t.CBS {
		if err := putToken(ctx, session, t, entity); err != nil {
			conn.Close()
			return nil, nil, err
		}
	}
	return conn, session, nil
}

func putToken(ctx context.Context, session *amqp.Session, t target, entity string) error {
	audience := fmt.Sprintf("sb://localhost:%d/%s", t.Port, entity)
	out, err := session.NewSender(ctx, "$cbs", nil)
	if err != nil {
		return err
	}
	defer out.Close(ctx)
	in, err := session.NewReceiver(ctx, "$cbs", &amqp.ReceiverOptions{Credit: 1})
	if err != nil {
		return err
	}
	defer in.Close(ctx)
	replyTo := "$cbs"
	request := &amqp.Message{
		Properties: &amqp.MessageProperties{MessageID: "put-token", ReplyTo: &replyTo},
		ApplicationProperties: map[string]any{
			"operation": "put-token", "type": "jwt", "name": audience,
		},
		Value: sasToken(audience, t.KeyName, t.Key),
	}
	if err := out.Send(ctx, request, nil); err != nil {
		return err
	}
	answer, err := in.Receive(ctx, nil)
	if err != nil {
		return err
	}
	in.AcceptMessage(ctx, answer)
	if status := fmt.Sprint(answer.ApplicationProperties["status-code"]); status != "202" {
		return fmt.Errorf("put-token answered %s: %v", status, answer.ApplicationProperties)
	}
	return nil
}

// --- what one process recorded (bench_churn.Recorder's shape) ----------------------------------
type delivery struct {
	T     float64
	Link  int64
	SID   string
	Index int
}

type interval struct {
	Link     int64
	SID      string
	Answered float64
	LetGo    *float64
}

type recorder struct {
	mu                sync.Mutex
	worker            int64
	links             atomic.Int64
	deliveries        []delivery
	intervals         []*interval
	latencies         []float64 // attach sent -> answered with a session
	firstLatencies    []float64 // answered -> its first message
	deliveryLatencies []float64 // stamped send -> delivered
	firstDelivery     []float64 // the same, first message of each hold
	acceptTimeouts    int
	late              int
	errors            int
	errorTexts        []string
	newDone           [][2]any
	lastDoneT         float64
	cpuStart          float64
}

func (r *recorder) linkNumber() int64 { return r.worker*100_000_000 + r.links.Add(1) }

func (r *recorder) error(text string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors++
	if len(r.errorTexts) < 5 {
		r.errorTexts = append(r.errorTexts, text)
	}
}

func (r *recorder) dump() map[string]any {
	r.mu.Lock()
	defer r.mu.Unlock()
	deliveries := make([][4]any, len(r.deliveries))
	for i, d := range r.deliveries {
		deliveries[i] = [4]any{d.T, d.Link, d.SID, d.Index}
	}
	intervals := make([][4]any, len(r.intervals))
	for i, iv := range r.intervals {
		intervals[i] = [4]any{iv.Link, iv.SID, iv.Answered, iv.LetGo}
	}
	list := func(values []float64) []float64 { return append([]float64{}, values...) } // not null
	return map[string]any{
		"deliveries": deliveries, "intervals": intervals, "latencies": list(r.latencies),
		"first_latencies": list(r.firstLatencies), "delivery_latencies": list(r.deliveryLatencies),
		"first_delivery_latencies": list(r.firstDelivery), "accept_timeouts": r.acceptTimeouts,
		"late": r.late, "errors": r.errors, "error_texts": append([]string{}, r.errorTexts...),
		"attaches": r.links.Load(), "cpu_s": cpuSeconds() - r.cpuStart,
		"client": "go",
	}
}

// parse finds "<sid>/<index>" after the marker, and the send time when stamped (0: none).
func parse(body []byte) (sid string, index int, sent float64, ok bool) {
	at := indexOf(body, marker)
	if at < 0 {
		return "", 0, 0, false
	}
	rest := body[at+len(marker):]
	end := indexByte(rest, ';')
	slash := indexByte(rest, '/')
	if end < 0 || slash < 0 || slash > end {
		return "", 0, 0, false
	}
	number := rest[slash+1 : end]
	if stamp := indexByte(number, '@'); stamp >= 0 {
		if ns, err := strconv.ParseInt(string(number[stamp+1:]), 10, 64); err == nil && ns > 0 {
			sent = float64(ns) / 1e9
		}
		number = number[:stamp]
	}
	index, err := strconv.Atoi(string(number))
	if err != nil {
		return "", 0, 0, false
	}
	return string(rest[:slash]), index, sent, true
}

func indexOf(b, sub []byte) int      { return strings.Index(unsafeString(b), unsafeString(sub)) }
func indexByte(b []byte, c byte) int { return strings.IndexByte(unsafeString(b), c) }
func unsafeString(b []byte) string   { return unsafe.String(unsafe.SliceData(b), len(b)) }

func body(m *amqp.Message) []byte {
	if len(m.Data) > 0 {
		return m.Data[0]
	}
	switch v := m.Value.(type) {
	case []byte:
		return v
	case string:
		return []byte(v)
	}
	return nil
}

// --- the receiver loops -------------------------------------------------------------------------
type settings struct {
	Window    int  `json:"window"`
	IdleMs    int  `json:"idle_ms"`
	TimeoutMs int  `json:"timeout_ms"`
	Sessions  bool `json:"sessions"`
}

type loop struct {
	rec      *recorder
	session  *amqp.Session
	entity   string
	cfg      settings
	waiting  atomic.Bool // an attach is out, not answered yet (it waits for a session)
	done     func(sid string, index int, t float64)
	stopping *atomic.Bool
}

// run takes a session, completes what comes, lets it go after idle, takes the next; until
// ctx ends (the order to stop).
func (l *loop) run(ctx context.Context) {
	idle := time.Duration(l.cfg.IdleMs) * time.Millisecond
	settle := amqp.ReceiverSettleModeFirst
	unsettled := amqp.SenderSettleModeUnsettled
	for ctx.Err() == nil {
		number := l.rec.linkNumber()
		opts := &amqp.ReceiverOptions{
			Name: fmt.Sprintf("churn-%d-%x", number, rand.Uint32()),
			// Credit given here, not by go-amqp: its automatic credit can send a flow after
			// our detach (when transfers still in flight use the credit up), a frame for a
			// handle the broker has freed, which ends the whole connection.
			Credit:                    -1,
			SettlementMode:            &settle,
			RequestedSenderSettleMode: &unsettled,
		}
		if l.cfg.Sessions {
			opts.Filters = []amqp.LinkFilter{amqp.NewLinkFilter(sessionFilter, sessionFilterCode, nil)}
			opts.Properties = map[string]any{timeoutProperty: uint32(l.cfg.TimeoutMs)}
		}
		sentAt := now()
		l.waiting.Store(true)
		receiver, err := l.session.NewReceiver(ctx, l.entity, opts)
		l.waiting.Store(false)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			var linkErr *amqp.LinkError
			if errors.As(err, &linkErr) && linkErr.RemoteErr != nil &&
				string(linkErr.RemoteErr.Condition) == timeoutCondition {
				l.rec.mu.Lock()
				l.rec.acceptTimeouts++
				l.rec.mu.Unlock()
				continue
			}
			l.rec.error("session attach refused: " + err.Error())
			time.Sleep(100 * time.Millisecond) // an error may repeat at once: do not spin
			continue
		}
		answered := now()
		sid, _ := receiver.LinkSourceFilterValue(sessionFilter).(string)
		held := &interval{Link: number, SID: sid, Answered: answered}
		l.rec.mu.Lock()
		l.rec.latencies = append(l.rec.latencies, answered-sentAt)
		l.rec.intervals = append(l.rec.intervals, held)
		l.rec.mu.Unlock()
		l.waiting.Store(!l.cfg.Sessions) // a plain consumer waits for messages, attached
		if err := receiver.IssueCredit(uint32(l.cfg.Window)); err != nil {
			l.rec.error("credit: " + err.Error())
		}
		l.hold(ctx, receiver, held, idle)
		l.waiting.Store(false)
	}
}

func (l *loop) hold(ctx context.Context, receiver *amqp.Receiver, held *interval, idle time.Duration) {
	got, last := 0, held.Answered
	used := 0 // credit used since it was last given: given again at half the window
	letGo := func(at float64) {
		l.rec.mu.Lock()
		held.LetGo = &at
		l.rec.mu.Unlock()
	}
	for {
		wait := ctx
		var cancel context.CancelFunc = func() {}
		if l.cfg.Sessions { // a plain consumer keeps its link
			wait, cancel = context.WithTimeout(ctx, idle-time.Duration((now()-last)*1e9))
		}
		msg, err := receiver.Receive(wait, nil)
		cancel()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) {
				// idle (or told to stop): from here on another receiver may hold the session
				letGo(now())
				late := 0
				for receiver.Prefetched() != nil {
					late++ // arrived after we let go: released with the link
				}
				l.rec.mu.Lock()
				l.rec.late += late
				l.rec.mu.Unlock()
				go receiver.Close(context.Background()) // the next attach does not wait
				return
			}
			// Ended by the broker: all we know is that we held it until our last delivery.
			letGo(max(held.Answered, last))
			l.rec.error("session link detached: " + err.Error())
			return
		}
		t := now()
		sid, index, sent, ok := parse(body(msg))
		l.rec.mu.Lock()
		if got == 0 {
			l.rec.firstLatencies = append(l.rec.firstLatencies, t-held.Answered)
		}
		if ok {
			l.rec.deliveries = append(l.rec.deliveries, delivery{t, held.Link, sid, index})
		}
		if sent > 0 {
			l.rec.deliveryLatencies = append(l.rec.deliveryLatencies, t-sent)
			if got == 0 {
				l.rec.firstDelivery = append(l.rec.firstDelivery, t-sent)
			}
		}
		l.rec.mu.Unlock()
		got++
		last = t
		if !ok {
			l.rec.error("a message without a churn marker on " + receiver.LinkName())
		}
		// settled first: the disposition goes out settled, nothing is answered
		if err := receiver.AcceptMessage(ctx, msg); err != nil && ctx.Err() == nil {
			l.rec.error("complete: " + err.Error())
		} else if ok {
			l.done(sid, index, t)
		}
		if used++; used >= max(1, l.cfg.Window/2) {
			if err := receiver.IssueCredit(uint32(used)); err != nil && ctx.Err() == nil {
				l.rec.error("credit: " + err.Error())
			}
			used = 0
		}
	}
}

// --- `loadgen worker`: bench_churn.py's worker protocol ---------------------------------------------
type workerConfig struct {
	settings
	target
	Index    int     `json:"index"`
	Entity   string  `json:"entity"`
	Loops    []int   `json:"loops"`
	Deadline float64 `json:"deadline"`
	Out      string  `json:"out"`
}

func worker() int {
	in := bufio.NewReader(os.Stdin)
	line, err := in.ReadString('\n')
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen worker: no config line:", err)
		return 2
	}
	var cfg workerConfig
	if err := json.Unmarshal([]byte(line), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen worker: bad config:", err)
		return 2
	}
	rec := &recorder{worker: int64(cfg.Index), cpuStart: 0}
	if dir := os.Getenv("LOADGEN_CPUPROFILE_DIR"); dir != "" {
		// one CPU profile a worker, for go tool pprof: where the client's time goes
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("worker-%d.pprof", cfg.Index)))
		if err != nil {
			fmt.Fprintln(os.Stderr, "loadgen worker:", err)
			return 2
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	var doneMu sync.Mutex
	done := map[[2]any]bool{}
	markDone := func(sid string, index int, t float64) {
		doneMu.Lock()
		key := [2]any{sid, index}
		if !done[key] {
			done[key] = true
			rec.mu.Lock()
			rec.newDone = append(rec.newDone, key)
			rec.lastDoneT = t
			rec.mu.Unlock()
		}
		doneMu.Unlock()
	}
	deadline := time.Duration((cfg.Deadline - now()) * 1e9)
	ctx, stop := context.WithTimeout(context.Background(), deadline)
	defer stop()
	orders := make(chan string, 4)
	go func() {
		for {
			line, err := in.ReadString('\n')
			if err != nil {
				orders <- "stop" // stdin closed: the parent is done or gone
				return
			}
			orders <- strings.TrimSpace(line)
		}
	}()

	// connect every connection (authenticated): then "ready"
	var stopping atomic.Bool
	var loops []*loop
	var conns []*amqp.Conn
	var connMu sync.Mutex
	var wg sync.WaitGroup
	ready := atomic.Bool{}
	for _, count := range cfg.Loops {
		wg.Add(1)
		go func(count int) {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			defer cancel()
			conn, session, err := connect(cctx, cfg.target, cfg.Entity)
			if err != nil {
				rec.error("connect: " + err.Error())
				return
			}
			connMu.Lock()
			defer connMu.Unlock()
			conns = append(conns, conn)
			for range count {
				loops = append(loops, &loop{rec: rec, session: session, entity: cfg.Entity,
					cfg: cfg.settings, done: markDone, stopping: &stopping})
			}
		}(count)
	}
	go func() { wg.Wait(); ready.Store(true) }()

	report := func() map[string]any {
		waiting := 0
		connMu.Lock()
		for _, l := range loops {
			if l.waiting.Load() {
				waiting++
			}
		}
		connMu.Unlock()
		rec.mu.Lock()
		defer rec.mu.Unlock()
		done := rec.newDone
		if done == nil {
			done = [][2]any{} // JSON [], not null
		}
		rec.newDone = nil
		return map[string]any{"ready": ready.Load(), "done": done, "t": rec.lastDoneT,
			"errors": rec.errors, "waiting": waiting}
	}
	out := json.NewEncoder(os.Stdout)
	loopCtx, stopLoops := context.WithCancel(ctx)
	started := false
	ticker := time.NewTicker(tick)
	var last string
	for running := true; running; {
		select {
		case order := <-orders:
			switch order {
			case "go":
				if !started {
					wg.Wait()
					started = true
					connMu.Lock()
					for _, l := range loops {
						go l.run(loopCtx)
					}
					connMu.Unlock()
				}
			case "stop":
				running = false
			}
		case <-ctx.Done():
			running = false
		case <-ticker.C:
		}
		line := report()
		text, _ := json.Marshal(line)
		if s := string(text); s != last || len(line["done"].([][2]any)) > 0 {
			out.Encode(line)
			last = s
		}
	}
	stopping.Store(true)
	stopLoops()
	t := now()
	rec.mu.Lock()
	for _, iv := range rec.intervals {
		if iv.LetGo == nil {
			at := t
			iv.LetGo = &at
		}
	}
	rec.mu.Unlock()
	time.Sleep(50 * time.Millisecond) // let the loops see the order
	connMu.Lock()
	for _, c := range conns {
		c.Close()
	}
	connMu.Unlock()
	out.Encode(report())
	data, _ := json.Marshal(rec.dump())
	if err := os.WriteFile(cfg.Out, data, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen worker:", err)
		return 1
	}
	return 0
}

// --- `loadgen run`: a whole churn and its checks ------------------------------------------------
func makePlan(sessions, messages int, perSession string, seed int64) (map[string]int, []string) {
	ids := make([]string, sessions)
	plan := map[string]int{}
	rng := rand.New(rand.NewSource(seed))
	low, high := 0, 0
	if perSession != "" {
		lo, hi, found := strings.Cut(perSession, "-")
		low, _ = strconv.Atoi(lo)
		high = low
		if found {
			high, _ = strconv.Atoi(hi)
		}
	}
	for i := range ids {
		ids[i] = fmt.Sprintf("s%06d", i)
		n := messages/sessions + btoi(i < messages%sessions)
		if perSession != "" {
			n = low + rng.Intn(high-low+1)
		}
		plan[ids[i]] = n
	}
	return plan, ids
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// send sends every message of its sessions, round its sessions one message at a time (as
// bench_churn.sender_payloads), at most `window` not yet answered.
func send(ctx context.Context, t target, entity string, sids []string, plan map[string]int,
	bodySize, window int, rec *recorder) int {
	conn, session, err := connect(ctx, t, entity)
	if err != nil {
		rec.error("sender connect: " + err.Error())
		return 0
	}
	defer conn.Close()
	sender, err := session.NewSender(ctx, entity, nil)
	if err != nil {
		rec.error("sender attach: " + err.Error())
		return 0
	}
	receipts := make(chan amqp.SendReceipt, window)
	var sent atomic.Int64
	waited := make(chan struct{})
	go func() {
		defer close(waited)
		for receipt := range receipts {
			state, err := receipt.Wait(ctx)
			if _, ok := state.(*amqp.StateAccepted); err != nil || !ok {
				rec.error(fmt.Sprintf("send answered %v %v", state, err))
				continue
			}
			sent.Add(1)
		}
	}()
	most := 0
	for _, sid := range sids {
		most = max(most, plan[sid])
	}
	durable := true
	for index := range most {
		for _, sid := range sids {
			if index >= plan[sid] {
				continue
			}
			head := append(append([]byte{}, marker...), fmt.Sprintf("%s/%d;", sid, index)...)
			payload := append(head, []byte(strings.Repeat("x", max(0, bodySize-len(head))))...)
			group := sid
			msg := &amqp.Message{Data: [][]byte{payload}, Header: &amqp.MessageHeader{Durable: durable},
				Properties: &amqp.MessageProperties{GroupID: &group}}
			receipt, err := sender.SendWithReceipt(ctx, msg, nil)
			if err != nil {
				rec.error("send: " + err.Error())
				close(receipts)
				<-waited
				return int(sent.Load())
			}
			receipts <- receipt
		}
	}
	close(receipts)
	<-waited
	return int(sent.Load())
}

type verdict struct {
	order, afterComplete, lost, twoHolders, wrongSession int
	deliveries, completed, sessionsAccepted              int
	examples                                             []string
}

func (v *verdict) violations() int {
	return v.order + v.afterComplete + v.lost + v.twoHolders + v.wrongSession
}

func (v *verdict) example(text string) {
	if len(v.examples) < 9 {
		v.examples = append(v.examples, text)
	}
}

// check is bench_churn.check: every message is completed as it arrives, so its first
// delivery is its complete.
func check(plan map[string]int, rec *recorder) *verdict {
	type key struct {
		sid   string
		index int
	}
	v := &verdict{deliveries: len(rec.deliveries), sessionsAccepted: len(rec.intervals)}
	holding := map[int64]string{}
	for _, iv := range rec.intervals {
		holding[iv.Link] = iv.SID
	}
	first := map[key]float64{}
	for _, d := range rec.deliveries {
		k := key{d.SID, d.Index}
		if t, seen := first[k]; !seen || d.T < t {
			first[k] = d.T
		}
	}
	for _, d := range rec.deliveries {
		if d.Index >= plan[d.SID] || holding[d.Link] != d.SID {
			v.wrongSession++
			v.example(fmt.Sprintf("wrong session: %s/%d on link %d holding %q", d.SID, d.Index, d.Link, holding[d.Link]))
		}
		if d.T > first[key{d.SID, d.Index}] {
			v.afterComplete++
			v.example(fmt.Sprintf("after complete: %s/%d again on link %d", d.SID, d.Index, d.Link))
		}
	}
	total := 0
	for sid, n := range plan {
		total += n
		for i := range n {
			if _, ok := first[key{sid, i}]; ok {
				v.completed++
			} else if v.lost++; v.lost <= 3 {
				v.example(fmt.Sprintf("lost: %s/%d", sid, i))
			}
			if i > 0 {
				t, ok := first[key{sid, i}]
				before, okBefore := first[key{sid, i - 1}]
				if ok && (!okBefore || before > t) {
					v.order++
					v.example(fmt.Sprintf("order: %s/%d first delivered before %s/%d", sid, i, sid, i-1))
				}
			}
		}
	}
	sorted := append([]delivery{}, rec.deliveries...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].T < sorted[j].T })
	type linkSession struct {
		link int64
		sid  string
	}
	lastOnLink := map[linkSession]int{}
	for _, d := range sorted {
		k := linkSession{d.Link, d.SID}
		if previous, ok := lastOnLink[k]; ok && d.Index <= previous {
			v.order++
			v.example(fmt.Sprintf("order: %s/%d after %s/%d on link %d", d.SID, d.Index, d.SID, previous, d.Link))
		}
		lastOnLink[k] = d.Index
	}
	bySession := map[string][]*interval{}
	for _, iv := range rec.intervals {
		bySession[iv.SID] = append(bySession[iv.SID], iv)
	}
	end := func(iv *interval) float64 {
		if iv.LetGo == nil {
			return 1e300
		}
		return *iv.LetGo
	}
	for sid, spans := range bySession {
		sort.Slice(spans, func(i, j int) bool { return spans[i].Answered < spans[j].Answered })
		heldUntil := -1e300
		for _, iv := range spans {
			if iv.Answered < heldUntil {
				v.twoHolders++
				v.example(fmt.Sprintf("two holders: %s taken by link %d %.3f s before the last holder let go", sid, iv.Link, heldUntil-iv.Answered))
			}
			heldUntil = max(heldUntil, end(iv))
		}
	}
	return v
}

func percentile(values []float64, q float64) float64 {
	if len(values) == 0 {
		return 0
	}
	s := append([]float64{}, values...)
	sort.Float64s(s)
	return s[int(q/100*float64(len(s)-1)+0.5)]
}

func run(args []string) int {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	host := fs.String("host", "127.0.0.1", "broker host")
	port := fs.Int("port", 5672, "broker AMQP port")
	entity := fs.String("entity", "bench-sessions", "session queue")
	noCBS := fs.Bool("no-cbs", false, "SASL ANONYMOUS only, no CBS put-token")
	keyName := fs.String("key-name", "RootManageSharedAccessKey", "SAS key name")
	key := fs.String("key", "SAS_KEY_VALUE", "SAS key")
	sessions := fs.Int("sessions", 100, "sessions")
	messages := fs.Int("messages", 20000, "messages, spread evenly over the sessions")
	perSession := fs.String("per-session", "", "N or LOW-HIGH messages a session (seeded), instead of -messages")
	seed := fs.Int64("seed", 1, "seed of -per-session")
	senders := fs.Int("senders", 4, "sender connections")
	sendWindow := fs.Int("send-window", 1000, "sends not yet answered, per sender")
	bodySize := fs.Int("body-size", 64, "body bytes")
	receivers := fs.Int("receivers", 16, "next-available session receivers")
	perConn := fs.Int("links-per-connection", 4, "receiver links per connection")
	window := fs.Int("window", 100, "receiver credit")
	idleMs := fs.Int("idle-ms", 200, "let a session go after this long without a message")
	timeoutMs := fs.Int("accept-timeout-ms", 2000, "com.microsoft:timeout of an attach")
	timeout := fs.Duration("timeout", 300*time.Second, "the whole run at most")
	profile := fs.String("cpuprofile", "", "write a CPU profile of the run here (go tool pprof)")
	fs.Parse(args)
	if *profile != "" {
		f, err := os.Create(*profile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "loadgen:", err)
			return 2
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	t := target{Host: *host, Port: *port, KeyName: *keyName, Key: *key, CBS: !*noCBS}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	plan, ids := makePlan(*sessions, *messages, *perSession, *seed)
	total := 0
	for _, n := range plan {
		total += n
	}
	rec := &recorder{worker: 1}

	cpu0, t0 := cpuSeconds(), now()
	var wg sync.WaitGroup
	var sent atomic.Int64
	for s := range *senders {
		var mine []string
		for i := s; i < len(ids); i += *senders {
			mine = append(mine, ids[i])
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sent.Add(int64(send(ctx, t, *entity, mine, plan, *bodySize, *sendWindow, rec)))
		}()
	}
	wg.Wait()
	sendCPU, sendSecs := cpuSeconds()-cpu0, now()-t0
	fmt.Printf("send: %d of %d messages to %d sessions in %.2f s, %.0f msg/s; client CPU %.1f µs/msg\n",
		sent.Load(), total, len(plan), sendSecs, float64(sent.Load())/sendSecs, sendCPU*1e6/float64(max(sent.Load(), 1)))

	var completed atomic.Int64
	doneKeys := map[[2]any]bool{}
	var doneMu sync.Mutex
	all := make(chan struct{})
	var lastDone float64
	markDone := func(sid string, index int, at float64) {
		doneMu.Lock()
		defer doneMu.Unlock()
		k := [2]any{sid, index}
		if !doneKeys[k] && index < plan[sid] {
			doneKeys[k] = true
			lastDone = at
			if completed.Add(1) == int64(total) {
				close(all)
			}
		}
	}
	settings := settings{Window: *window, IdleMs: *idleMs, TimeoutMs: *timeoutMs, Sessions: true}
	loopCtx, stopLoops := context.WithCancel(ctx)
	var stopping atomic.Bool
	var conns []*amqp.Conn
	var loops []*loop
	for left := *receivers; left > 0; left -= *perConn {
		conn, session, err := connect(ctx, t, *entity)
		if err != nil {
			rec.error("receiver connect: " + err.Error())
			break
		}
		conns = append(conns, conn)
		for range min(left, *perConn) {
			loops = append(loops, &loop{rec: rec, session: session, entity: *entity, cfg: settings,
				done: markDone, stopping: &stopping})
		}
	}
	cpu1, t1 := cpuSeconds(), now()
	for _, l := range loops {
		go l.run(loopCtx)
	}
	select {
	case <-all:
	case <-ctx.Done():
		rec.error("out of time: " + strconv.FormatInt(completed.Load(), 10) + " of " + strconv.Itoa(total) + " completed")
	}
	doneMu.Lock()
	churnSecs := lastDone - t1
	doneMu.Unlock()
	churnCPU := cpuSeconds() - cpu1
	stopping.Store(true)
	stopLoops()
	time.Sleep(50 * time.Millisecond)
	at := now()
	rec.mu.Lock()
	for _, iv := range rec.intervals {
		if iv.LetGo == nil {
			iv.LetGo = &at
		}
	}
	rec.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
	n := completed.Load()
	v := check(plan, rec)
	fmt.Printf("churn: %d rx, %d completed in %.2f s, %.0f msg/s; accept p50 %.1f ms, p99 %.1f ms; "+
		"%d sessions accepted, %d accept timeouts, %d late; client CPU %.1f µs/msg\n",
		*receivers, n, churnSecs, float64(n)/max(churnSecs, 1e-9),
		percentile(rec.latencies, 50)*1000, percentile(rec.latencies, 99)*1000,
		v.sessionsAccepted, rec.acceptTimeouts, rec.late, churnCPU*1e6/float64(max(n, 1)))
	fmt.Printf("client CPU (getrusage) over the whole load: %.1f µs/msg\n",
		(cpuSeconds()-cpu0)*1e6/float64(max(n, 1)))
	fmt.Printf("checks: %d violations (order %d, delivered after complete %d, lost %d, two holders %d, "+
		"wrong session %d); %d deliveries, %d completed, %d errors\n",
		v.violations(), v.order, v.afterComplete, v.lost, v.twoHolders, v.wrongSession,
		v.deliveries, v.completed, rec.errors)
	for _, e := range append(v.examples, rec.errorTexts...) {
		fmt.Println("    " + e)
	}
	if v.violations() > 0 || rec.errors > 0 {
		return 1
	}
	return 0
}

func main() {
	if os.Getenv("GOGC") == "" {
		// Each session's link allocates go-amqp's buffers for its credit: with the default
		// GOGC the collector took a quarter of the CPU of a churn of short sessions.
		debug.SetGCPercent(800)
	}
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: loadgen worker | loadgen run [-port P ...] (loadgen run -h)")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "worker":
		if os.Getenv("GOMAXPROCS") == "" {
			// The bench spreads its receivers over --client-procs processes: one thread
			// each runs them, where more would spin looking for work (measured: a fifth
			// more CPU a message on two cores).
			runtime.GOMAXPROCS(1)
		}
		os.Exit(worker())
	case "run":
		os.Exit(run(os.Args[2:]))
	}
	fmt.Fprintln(os.Stderr, "loadgen: unknown command", os.Args[1])
	os.Exit(2)
}
