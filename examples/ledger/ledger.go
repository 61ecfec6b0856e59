package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
)

// The ledger's topics, consumer group and partition count.
const (
	eventsTopic  = "ledger.events"
	changedTopic = "ledger.balance-changed"
	group        = "ledger"
	partitions   = 12
)

// The kinds of an Event.
const (
	deposit  = "deposit"
	withdraw = "withdraw"
)

// Event is an account event, the payload of a message on eventsTopic. The
// message's UUID is the event's id, and its partition key the account, so
// that the events of one account are applied one at a time, in order.
type Event struct {
	Account string `json:"account"`
	Kind    string `json:"kind"`   // deposit or withdraw
	Amount  int64  `json:"amount"` // in cents, positive
}

// delta returns what e adds to its account's balance. A withdrawal may
// take the balance below zero: the ledger records overdrafts, it does not
// refuse them.
func (e Event) delta() (int64, error) {
	if e.Account == "" {
		return 0, errors.New("no account")
	}
	if e.Amount <= 0 {
		return 0, fmt.Errorf("amount %d: it must be positive", e.Amount)
	}
	switch e.Kind {
	case deposit:
		return e.Amount, nil
	case withdraw:
		return -e.Amount, nil
	}
	return 0, fmt.Errorf("kind %q: want %q or %q", e.Kind, deposit, withdraw)
}

// BalanceChanged is the output of one event applied, the payload of a
// message on changedTopic.
type BalanceChanged struct {
	Account   string `json:"account"`
	Balance   int64  `json:"balance"` // in cents, after the event
	EventID   string `json:"event_id"`
	HandledBy string `json:"handled_by"` // the consumer that applied it
	// Delivery is the event's delivery count when it was applied: above 1
	// when a worker that had it died (or failed) before its step committed.
	Delivery int `json:"delivery"`
}

// balanceKey holds an account's balance, in cents.
func balanceKey(account string) string { return "ledger:balance:" + account }

// appliedKey is a hash of an account's event ids, each with how many
// times the event was applied: 1.
func appliedKey(account string) string { return "ledger:applied:" + account }

// eventMessage returns the message of event e with id.
func eventMessage(id string, e Event) (*message.Message, error) {
	payload, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("encoding event %s: %w", id, err)
	}
	msg := message.NewMessage(id, payload)
	msg.Metadata.Set(valkeystream.MetadataPartitionKey, e.Account)
	return msg, nil
}

// ledger applies events to balances.
type ledger struct {
	client redis.UniversalClient
}

// apply is the router handler, under the ExactlyOnce middleware: the
// balance, the applied-record and the BalanceChanged output are written in
// the step of the event's Ack, so once per event however often it runs.
//
// It reads the balance, then sets it in the step, with no guard: on a
// partitioned topic one subscription at a time applies a partition's
// events, each step committed before the next event of the partition is
// handed over, so the read sees what the account's last step left.
func (l ledger) apply(msg *message.Message) ([]*message.Message, error) {
	ctx := msg.Context()
	if err := ctx.Err(); err != nil {
		return nil, err // the partition may have moved: its new owner applies the event
	}
	var e Event
	if err := json.Unmarshal(msg.Payload, &e); err != nil {
		return nil, valkeystream.GiveUp(msg, fmt.Errorf("decoding event %s: %w", msg.UUID, err))
	}
	delta, err := e.delta()
	if err != nil {
		return nil, valkeystream.GiveUp(msg, fmt.Errorf("event %s: %w", msg.UUID, err))
	}
	step, err := valkeystream.StepOf(ctx)
	if err != nil {
		return nil, err
	}
	old, err := l.client.Get(ctx, balanceKey(e.Account)).Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("reading the balance of %s: %w", e.Account, err)
	}
	balance := old + delta
	if err := step.Set(balanceKey(e.Account), strconv.FormatInt(balance, 10), 0); err != nil {
		return nil, err
	}
	if err := step.HIncrBy(appliedKey(e.Account), msg.UUID, 1); err != nil {
		return nil, err
	}
	payload, err := json.Marshal(BalanceChanged{
		Account:   e.Account,
		Balance:   balance,
		EventID:   msg.UUID,
		HandledBy: msg.Metadata.Get(valkeystream.MetadataConsumer),
		Delivery:  valkeystream.DeliveryCount(msg),
	})
	if err != nil {
		return nil, fmt.Errorf("encoding the balance change of event %s: %w", msg.UUID, err)
	}
	return []*message.Message{message.NewMessage("balance-changed-"+msg.UUID, payload)}, nil
}

// sampleEvents returns n random events over accounts acct-1 to
// acct-<accounts>, their ids starting with prefix.
func sampleEvents(prefix string, n, accounts int) ([]*message.Message, error) {
	msgs := make([]*message.Message, n)
	for i := range msgs {
		e := Event{
			Account: fmt.Sprintf("acct-%d", 1+rand.IntN(accounts)),
			Kind:    deposit,
			Amount:  int64(1 + rand.IntN(10_000)),
		}
		if rand.IntN(3) == 0 {
			e.Kind = withdraw
		}
		msg, err := eventMessage(fmt.Sprintf("%s-%d", prefix, i), e)
		if err != nil {
			return nil, err
		}
		msgs[i] = msg
	}
	return msgs, nil
}
