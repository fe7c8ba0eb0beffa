package sdkgo

// The administration client (admin.Client, HTTPS to busd's AMQP port, trusting busd's CA
// through SSL_CERT_FILE) and topics with SQL and correlation filters made through it.

import (
	"errors"
	"net/http"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"
)

func statusOf(err error) int {
	var respErr *azcore.ResponseError
	if errors.As(err, &respErr) {
		return respErr.StatusCode
	}
	return 0
}

func TestAdminCRUD(t *testing.T) {
	t.Parallel()
	ctx := within(t, 2*time.Minute)
	ac := newAdmin(t)
	q, tp := unique("goq"), unique("got")

	ns, err := ac.GetNamespaceProperties(ctx, nil)
	must(t, err)
	if ns.Name == "" {
		t.Fatalf("namespace properties: %+v", ns)
	}

	// queues
	created, err := ac.CreateQueue(ctx, q, &admin.CreateQueueOptions{Properties: &admin.QueueProperties{
		LockDuration: str("PT45S"), MaxDeliveryCount: ptr(int32(5)), RequiresSession: ptr(true),
		UserMetadata: str("from go"),
	}})
	must(t, err)
	if *created.LockDuration != "PT45S" || *created.MaxDeliveryCount != 5 || !*created.RequiresSession || *created.UserMetadata != "from go" {
		t.Fatalf("created queue: %+v", created.QueueProperties)
	}
	if _, err := ac.CreateQueue(ctx, q, nil); statusOf(err) != http.StatusConflict {
		t.Fatalf("creating %s again: %v, want 409", q, err)
	}
	got, err := ac.GetQueue(ctx, q, nil)
	must(t, err)
	if got == nil || *got.MaxDeliveryCount != 5 {
		t.Fatalf("GetQueue: %+v", got)
	}
	if missing, err := ac.GetQueue(ctx, q+"-none", nil); err != nil || missing != nil {
		t.Fatalf("GetQueue of a missing queue: %+v, %v (the SDK's nil, nil)", missing, err)
	}
	props := got.QueueProperties
	props.MaxDeliveryCount = ptr(int32(7))
	updated, err := ac.UpdateQueue(ctx, q, props, nil)
	must(t, err)
	if *updated.MaxDeliveryCount != 7 || *updated.LockDuration != "PT45S" {
		t.Fatalf("updated queue: %+v", updated.QueueProperties)
	}
	var names []string
	pager := ac.NewListQueuesPager(nil)
	for pager.More() {
		page, err := pager.NextPage(ctx)
		must(t, err)
		for _, item := range page.Queues {
			names = append(names, item.QueueName)
		}
	}
	if !slices.Contains(names, q) || !slices.Contains(names, "go-sessions") {
		t.Fatalf("ListQueues: %v", names)
	}

	// runtime properties count what the queue holds: 2 active, 1 dead-lettered, 1 scheduled
	client := newClient(t)
	sender, err := client.NewSender(q, nil)
	must(t, err)
	id := unique("count")
	send(t, ctx, sender, id, "one", "two", "three")
	_, err = sender.ScheduleMessages(ctx, []*azservicebus.Message{{Body: []byte("later"), SessionID: &id}}, time.Now().Add(time.Hour), nil)
	must(t, err)
	r, err := client.AcceptSessionForQueue(ctx, q, id, nil)
	must(t, err)
	first := receiveN(t, ctx, r, 1)
	must(t, r.DeadLetterMessage(ctx, first[0], nil))
	must(t, r.Close(ctx))
	runtime, err := ac.GetQueueRuntimeProperties(ctx, q, nil)
	must(t, err)
	if runtime.ActiveMessageCount != 2 || runtime.DeadLetterMessageCount != 1 || runtime.ScheduledMessageCount != 1 || runtime.TotalMessageCount != 4 {
		t.Fatalf("runtime properties: active %d dead-letter %d scheduled %d total %d, want 2 1 1 4",
			runtime.ActiveMessageCount, runtime.DeadLetterMessageCount, runtime.ScheduledMessageCount, runtime.TotalMessageCount)
	}

	// topics, subscriptions, rules
	topic, err := ac.CreateTopic(ctx, tp, &admin.CreateTopicOptions{Properties: &admin.TopicProperties{DefaultMessageTimeToLive: str("PT1H")}})
	must(t, err)
	if *topic.DefaultMessageTimeToLive != "PT1H" {
		t.Fatalf("created topic: %+v", topic.TopicProperties)
	}
	sub, err := ac.CreateSubscription(ctx, tp, "sub1", &admin.CreateSubscriptionOptions{Properties: &admin.SubscriptionProperties{
		RequiresSession: ptr(true), MaxDeliveryCount: ptr(int32(4)),
	}})
	must(t, err)
	if !*sub.RequiresSession || *sub.MaxDeliveryCount != 4 {
		t.Fatalf("created subscription: %+v", sub.SubscriptionProperties)
	}
	gotSub, err := ac.GetSubscription(ctx, tp, "sub1", nil)
	must(t, err)
	subProps := gotSub.SubscriptionProperties
	subProps.MaxDeliveryCount = ptr(int32(6))
	updatedSub, err := ac.UpdateSubscription(ctx, tp, "sub1", subProps, nil)
	must(t, err)
	if *updatedSub.MaxDeliveryCount != 6 {
		t.Fatalf("updated subscription: %+v", updatedSub.SubscriptionProperties)
	}
	_, err = ac.CreateRule(ctx, tp, "sub1", &admin.CreateRuleOptions{
		Name:   str("red"),
		Filter: &admin.SQLFilter{Expression: "color = @c", Parameters: map[string]any{"@c": "red"}},
		Action: &admin.SQLAction{Expression: "SET seen = 1"},
	})
	must(t, err)
	rule, err := ac.GetRule(ctx, tp, "sub1", "red", nil)
	must(t, err)
	filter, ok := rule.Filter.(*admin.SQLFilter)
	if !ok || filter.Expression != "color = @c" || filter.Parameters["@c"] != "red" {
		t.Fatalf("GetRule: %#v", rule.Filter)
	}
	if action, ok := rule.Action.(*admin.SQLAction); !ok || action.Expression != "SET seen = 1" {
		t.Fatalf("GetRule's action: %#v", rule.Action)
	}
	rule.Filter = &admin.SQLFilter{Expression: "color = 'blue'"}
	_, err = ac.UpdateRule(ctx, tp, "sub1", rule.RuleProperties)
	must(t, err)
	var ruleNames []string
	rules := ac.NewListRulesPager(tp, "sub1", nil)
	for rules.More() {
		page, err := rules.NextPage(ctx)
		must(t, err)
		for _, r := range page.Rules {
			ruleNames = append(ruleNames, r.Name)
			if r.Name == "red" {
				if f, ok := r.Filter.(*admin.SQLFilter); !ok || f.Expression != "color = 'blue'" {
					t.Fatalf("the updated rule lists as %#v", r.Filter)
				}
			}
		}
	}
	sort.Strings(ruleNames)
	if !slices.Equal(ruleNames, []string{"$Default", "red"}) {
		t.Fatalf("ListRules: %v", ruleNames)
	}
	_, err = ac.DeleteRule(ctx, tp, "sub1", "red", nil)
	must(t, err)
	if gone, err := ac.GetRule(ctx, tp, "sub1", "red", nil); err != nil || gone != nil {
		t.Fatalf("a deleted rule: %+v, %v", gone, err)
	}
	subRuntime, err := ac.GetSubscriptionRuntimeProperties(ctx, tp, "sub1", nil)
	must(t, err)
	if subRuntime.ActiveMessageCount != 0 {
		t.Fatalf("subscription runtime: %+v", subRuntime.SubscriptionRuntimeProperties)
	}
	topicRuntime, err := ac.GetTopicRuntimeProperties(ctx, tp, nil)
	must(t, err)
	if topicRuntime.SubscriptionCount != 1 {
		t.Fatalf("topic runtime: subscriptions %d", topicRuntime.SubscriptionCount)
	}

	// deletes
	_, err = ac.DeleteSubscription(ctx, tp, "sub1", nil)
	must(t, err)
	_, err = ac.DeleteTopic(ctx, tp, nil)
	must(t, err)
	_, err = ac.DeleteQueue(ctx, q, nil)
	must(t, err)
	if gone, err := ac.GetTopic(ctx, tp, nil); err != nil || gone != nil {
		t.Fatalf("a deleted topic: %+v, %v", gone, err)
	}
	if gone, err := ac.GetQueue(ctx, q, nil); err != nil || gone != nil {
		t.Fatalf("a deleted queue: %+v, %v", gone, err)
	}
	if _, err := ac.DeleteQueue(ctx, q, nil); statusOf(err) != http.StatusNotFound {
		t.Fatalf("deleting a missing queue: %v, want 404", err)
	}
}

func TestTopicFilters(t *testing.T) {
	t.Parallel()
	ctx := within(t, 2*time.Minute)
	ac := newAdmin(t)
	tp := unique("filters")
	_, err := ac.CreateTopic(ctx, tp, nil)
	must(t, err)
	t.Cleanup(func() { _, _ = ac.DeleteTopic(within(t, 30*time.Second), tp, nil) })
	for _, s := range []string{"red", "orders", "all"} {
		_, err := ac.CreateSubscription(ctx, tp, s, nil)
		must(t, err)
	}
	replaceDefault := func(sub string, options *admin.CreateRuleOptions) {
		_, err := ac.DeleteRule(ctx, tp, sub, "$Default", nil)
		must(t, err)
		_, err = ac.CreateRule(ctx, tp, sub, options)
		must(t, err)
	}
	replaceDefault("red", &admin.CreateRuleOptions{
		Name:   str("red-and-big"),
		Filter: &admin.SQLFilter{Expression: "color = 'red' AND size > @min", Parameters: map[string]any{"@min": int64(10)}},
		Action: &admin.SQLAction{Expression: "SET matched = 'red'"},
	})
	replaceDefault("orders", &admin.CreateRuleOptions{
		Name: str("orders"),
		Filter: &admin.CorrelationFilter{
			Subject:               str("order"),
			ApplicationProperties: map[string]any{"region": "eu"},
		},
	})

	client := newClient(t)
	sender, err := client.NewSender(tp, nil)
	must(t, err)
	messages := []*azservicebus.Message{
		{Body: []byte("small red"), ApplicationProperties: map[string]any{"color": "red", "size": int64(5)}},
		{Body: []byte("big red"), ApplicationProperties: map[string]any{"color": "red", "size": int64(50)}},
		{Body: []byte("eu order"), Subject: str("order"), ApplicationProperties: map[string]any{"region": "eu"}},
		{Body: []byte("us order"), Subject: str("order"), ApplicationProperties: map[string]any{"region": "us"}},
	}
	for _, m := range messages {
		must(t, sender.SendMessage(ctx, m, nil))
	}

	want := map[string][]string{
		"red":    {"big red"},
		"orders": {"eu order"},
		"all":    {"small red", "big red", "eu order", "us order"},
	}
	for sub, bodiesWanted := range want {
		r, err := client.NewReceiverForSubscription(tp, sub, nil)
		must(t, err)
		got := receiveN(t, ctx, r, len(bodiesWanted))
		if !slices.Equal(bodies(got), bodiesWanted) {
			t.Fatalf("subscription %s received %q, want %q", sub, bodies(got), bodiesWanted)
		}
		if sub == "red" && got[0].ApplicationProperties["matched"] != "red" {
			t.Fatalf("the rule's action did not run: %v", got[0].ApplicationProperties)
		}
		for _, m := range got {
			must(t, r.CompleteMessage(ctx, m, nil))
		}
		receiveNone(t, r, 500*time.Millisecond)
		must(t, r.Close(ctx))
	}
}

func ptr[T any](v T) *T { return &v }
